"""Sliding windows in the accounts: the KV cache of a local layer, its score FLOPs and score memory, the
budget solver, per-rank accounts and `headcount cost`, against hand counts and brute force."""

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.cost import (CostError, ModelShape, attention_flops, fit, flop_counts, get_preset, kv_cache,
                            param_counts, report, score_memory)
from headcount.cost.accounts import window_pairs
from headcount.cost.parallel import per_rank
from headcount.cost.shape import FULL, LOCAL, global_every, override

runner = CliRunner()
GEMMA = get_preset("gemma-3-270m").shape


def cost_json(*args):
    result = runner.invoke(app, ["cost", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _band(n, w):
    """Brute force: (query i, key j) pairs with j <= i (causal) and j > i - w (the window)."""
    return [(i, j) for i in range(n) for j in range(n) if j <= i and j > i - w]


# ------------------------------------------------------------------------------------------ KV cache
def test_gemma3_270m_kv_cache_at_32k_by_hand():
    """bf16, batch 1, 32768 tokens. A layer caches K and V: 2 x 1 KV head x 256 x 2 bytes = 1,024 bytes per
    position. Global layers (5, 11, 17) hold all 32768 positions, the 15 local layers the last 512:
        with the window:    3 x 2 x 1 x 256 x 32768 x 2 + 15 x 2 x 1 x 256 x 512 x 2
                          = 100,663,296 + 7,864,320 = 108,527,616 bytes (103.5 MiB)
        without the window: 18 x 2 x 1 x 256 x 32768 x 2 = 603,979,776 bytes (576 MiB), 5.57x as much."""
    with_window = 3 * 2 * 1 * 256 * 32768 * 2 + 15 * 2 * 1 * 256 * 512 * 2
    without = 18 * 2 * 1 * 256 * 32768 * 2
    assert (with_window, without) == (108_527_616, 603_979_776)
    kv = kv_cache(GEMMA, 1, 32768, 2)
    assert kv["bytes_for_context"] == with_window
    assert kv["bytes_for_context_without_window"] == without
    assert kv["bytes_per_token"] == 18 * 2 * 256 * 2 == 18_432  # each token, while the context fits the window
    assert kv["bytes_per_token_past_window"] == 3 * 2 * 256 * 2  # past it only global layers grow
    assert (kv["global_layers"], kv["local_layers"], kv["window"]) == (3, 15, 512)
    assert (kv["positions_per_global_layer"], kv["positions_per_local_layer"]) == (32768, 512)


@pytest.mark.parametrize("seq", [1, 100, 511, 512, 513, 4096])
def test_kv_cache_is_a_sum_over_layers(seq):
    """Layer by layer: positions = seq on a global layer, min(seq, w) on a local one."""
    per_position = 2 * GEMMA.n_kv_heads * GEMMA.head_dim * 4
    expect = sum(per_position * 3 * (min(seq, 512) if GEMMA.is_local(i) else seq) for i in range(18))
    assert kv_cache(GEMMA, 3, seq, 4)["bytes_for_context"] == expect
    if seq <= 512:  # inside the window the window changes nothing
        assert expect == kv_cache(GEMMA, 3, seq, 4)["bytes_for_context_without_window"]


def test_no_window_is_unchanged():
    llama = get_preset("llama-3-8b").shape
    kv = kv_cache(llama, 2, 8192, 2)
    assert kv["bytes_for_context"] == kv["bytes_for_context_without_window"] == 131_072 * 8192 * 2
    assert (kv["global_layers"], kv["local_layers"], kv["window"]) == (32, 0, None)
    f = flop_counts(llama, 1, 8192)
    assert "attention_per_local_layer_causal" not in f and "banded_per_local_layer" not in score_memory(llama, 1, 8, 2)


# --------------------------------------------------------------------------------------- score FLOPs
@pytest.mark.parametrize("n", range(1, 14))
def test_window_pairs_equal_brute_force(n):
    for w in range(1, 17):
        assert window_pairs(n, w) == len(_band(n, w))
    assert window_pairs(n) == len(_band(n, n)) == n * (n + 1) // 2


def test_band_is_transformers_sliding_window_mask():
    """The band is the one transformers masks with: key j visible from query i when i - w < j <= i."""
    torch = pytest.importorskip("torch")
    masking = pytest.importorskip("transformers.masking_utils")
    mask = masking.sliding_window_causal_mask_function(5)
    t = torch.tensor
    pairs = [(i, j) for i in range(12) for j in range(12) if bool(mask(t(0), t(0), t(i), t(j)))]
    assert pairs == _band(12, 5) and len(pairs) == window_pairs(12, 5)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 16, 31])
@pytest.mark.parametrize("w", [1, 2, 3, 8, 30, 64])
def test_local_layer_flops_count_the_band(n, w):
    """Scores and read of a local layer: 2 B n_heads head_dim x (the band's pairs, diagonal counted half, the
    causal account's convention: its triangle is n^2 / 2 pairs). Exact pairs by brute force; at w >= n the
    local layer is exactly the causal global layer."""
    s = ModelShape(d_model=24, n_heads=3, n_kv_heads=1, head_dim=8, n_layers=2, sliding_window=w,
                   layer_types=[LOCAL, FULL])
    B = 2
    local = attention_flops(s, B, n, causal=True, local=True)
    causal = attention_flops(s, B, n, causal=True)
    brute = len(_band(n, w))
    assert local["scores"] == local["read"] == B * 3 * 8 * (2 * brute - min(n, w))
    if w >= n:
        assert local == causal
    else:
        assert local["scores"] < causal["scores"]
    assert local["projections"] == causal["projections"] and local["output"] == causal["output"]


def test_gemma3_flops_totals():
    n = 32768
    f = flop_counts(GEMMA, 1, n)
    glob, loc = f["attention_per_layer_causal"], f["attention_per_local_layer_causal"]
    h, hd, w = 4, 256, 512
    assert loc["scores"] == h * hd * (2 * n * w - w * w)
    assert f["attention_total_causal"] == 3 * glob["total"] + 15 * loc["total"]
    assert f["attention_total_causal_without_window"] == 18 * glob["total"]
    mlp_and_logits = f["mlp_total"] + f["logits"]
    assert f["total_causal"] == f["attention_total_causal"] + mlp_and_logits
    assert f["total_causal_without_window"] == f["attention_total_causal_without_window"] + mlp_and_logits
    assert f["total"] == 18 * f["attention_per_layer"]["total"] + mlp_and_logits  # unmasked: every pair
    # exact pairs: the triangle n (n + 1) / 2; the band w (w + 1) / 2 for the first w queries, then w each
    assert f["pairs_per_head_exact"] == {"global_layer": n * (n + 1) // 2, "local_layer": w * (w + 1) // 2 + (n - w) * w}


def test_local_flops_need_a_window_and_causal():
    with pytest.raises(CostError, match="local"):
        attention_flops(get_preset("llama-3-8b").shape, 1, 8, causal=True, local=True)
    with pytest.raises(CostError, match="local"):
        attention_flops(GEMMA, 1, 8, local=True)


# -------------------------------------------------------------------------------------- score memory
@pytest.mark.parametrize("n", [100, 512, 4096])
def test_banded_score_memory(n):
    m = score_memory(GEMMA, 2, n, 2)
    assert m["eager_per_layer"] == m["eager_masked_per_local_layer"] == 2 * 4 * n * n * 2
    assert m["banded_per_local_layer"] == 2 * 4 * n * min(n, 512) * 2  # each query's at most w keys
    assert m["banded_training_all_layers"] == 3 * m["eager_per_layer"] + 15 * m["banded_per_local_layer"]


# ---------------------------------------------------------------------------------------- the solver
def test_fit_with_windows_by_hand():
    budget = 1024**3
    r = fit(GEMMA, budget, seq=32768, dtype="bf16")
    left = budget - 268_098_176 * 2
    # past the window: 1,024 bytes per position x (3 n + 15 x 512) <= left
    assert r["max_context"] == (left - 1024 * 15 * 512) // (1024 * 3)
    assert kv_cache(GEMMA, 1, r["max_context"], 2)["bytes_for_context"] <= left
    assert kv_cache(GEMMA, 1, r["max_context"] + 1, 2)["bytes_for_context"] > left
    assert r["max_batch"] == left // 108_527_616
    # every layer local: the cache stops growing; no longest context
    all_local = GEMMA.replace(layer_types=None)
    r = fit(all_local, budget, seq=32768, dtype="bf16")
    assert r["max_context"] is None and "any context fits" in r["note"]
    # a budget the window does not fill: the same as without the window
    small = 268_098_176 * 2 + 1024 * 18 * 300
    assert fit(GEMMA, small)["max_context"] == 300 == fit(GEMMA.replace(sliding_window=None, layer_types=None),
                                                          small)["max_context"]


# ----------------------------------------------------------------------------------- shape and flags
def test_pattern_follows_the_number_of_layers():
    assert GEMMA.replace(n_layers=24).layer_types == global_every(24, 6)
    assert override(GEMMA, n_layers=7).layer_types == global_every(7, 6)
    assert GEMMA.replace(n_layers=24).global_layers == 4


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(sliding_window=0), "sliding_window: expected a positive"),
    (dict(sliding_window=-1), "sliding_window: expected a positive"),
    (dict(sliding_window=True), "sliding_window: expected a whole number"),
    (dict(sliding_window=8, layer_types=[LOCAL]), "layer_types: 1 entries for 2 layers"),
    (dict(sliding_window=8, layer_types=[LOCAL, "global"]), "layer_types: unknown layer type"),
    (dict(layer_types=[LOCAL, FULL]), "sliding_attention layers but no sliding_window"),
    (dict(sliding_window=8, arch="encoder"), "sliding_window: counted for causal decoders only"),
])
def test_bad_windows_are_one_line_errors(kwargs, fragment):
    with pytest.raises(CostError, match=fragment) as info:
        ModelShape(d_model=16, n_heads=2, n_layers=2, **kwargs)
    assert "\n" not in str(info.value)


def test_all_full_layer_types_without_a_window_are_just_global():
    s = ModelShape(d_model=16, n_heads=2, n_layers=2, layer_types=[FULL, FULL])
    assert s.layer_types is None and s.global_layers == 2


# ---------------------------------------------------------------------------------------- the command
def test_json_shows_kv_with_and_without_the_window_and_layer_counts():
    rep = cost_json("gemma-3-270m", "--seq", "32k", "--dtype", "bf16")
    assert rep["params"]["total"] == 268_098_176
    kv = rep["kv_cache"]
    assert (kv["bytes_for_context"], kv["bytes_for_context_without_window"]) == (108_527_616, 603_979_776)
    assert (kv["global_layers"], kv["local_layers"]) == (3, 15)
    assert rep["flops"]["global_layers"] == 3 and rep["flops"]["local_layers"] == 15
    assert rep["shape"]["sliding_window"] == 512 and rep["shape"]["layer_types"].count("full_attention") == 3
    assert "sliding_window" in rep["conventions"]


def test_table_shows_the_window():
    result = runner.invoke(app, ["cost", "gemma-3-270m", "--seq", "32k"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("268,098,176", "108,527,616", "603,979,776", "without the window", "3 global", "15 local",
                 "sliding window 512 on 15 of 18 layers", "q/k norm 512"):
        assert text in out, text


def test_flags_set_and_remove_windows():
    rep = cost_json("llama-3-8b", "--sliding-window", "1024", "--global-every", "4", "--seq", "32k")
    kv = rep["kv_cache"]
    assert (kv["global_layers"], kv["local_layers"]) == (8, 24)
    assert kv["bytes_for_context"] == 4096 * (8 * 32768 + 24 * 1024)
    every_layer = cost_json("mistral-7b", "--sliding-window", "4096", "--seq", "32k")["kv_cache"]
    assert (every_layer["local_layers"], every_layer["bytes_for_context"]) == (32, 131_072 * 4096)
    off = cost_json("gemma-3-270m", "--sliding-window", "off", "--seq", "32k")["kv_cache"]
    assert off["bytes_for_context"] == 603_979_776 and off["window"] is None
    wider = cost_json("gemma-3-270m", "--sliding-window", "1024", "--seq", "32k")["kv_cache"]
    assert wider["bytes_for_context"] == 1024 * (3 * 32768 + 15 * 1024)  # the model's own pattern kept
    deeper = cost_json("gemma-3-270m", "--n-layers", "24", "--seq", "32k")["kv_cache"]
    assert (deeper["global_layers"], deeper["local_layers"]) == (4, 20)


def test_comparison_table_has_the_window_rows():
    result = runner.invoke(app, ["cost", "gemma-3-270m", "--kv-heads", "4,1", "--seq", "32k"])
    assert result.exit_code == 0, result.output
    assert "without the window" in result.stdout and "3 + 15" in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (["gemma-3-270m", "--sliding-window", "0"], "--sliding-window: expected a positive number"),
    (["gemma-3-270m", "--sliding-window", "-512"], "--sliding-window: expected a positive number"),
    (["gemma-3-270m", "--sliding-window", "wide"], "--sliding-window: expected a whole number"),
    (["llama-3-8b", "--global-every", "4"], "--global-every: needs a sliding window"),
    (["gemma-3-270m", "--global-every", "0"], "--global-every"),
    (["gemma-3-270m", "--sliding-window", "off", "--global-every", "2"], "--global-every"),
    (["gemma-3-270m", "--tp", "5"], "--tp: 5 ranks is more than the 4 query heads"),
])
def test_bad_window_flags_exit_2(args, fragment):
    result = runner.invoke(app, ["cost", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1


def test_fit_flag_with_a_window():
    rep = cost_json("gemma-3-270m", "--fit", "1GiB", "--seq", "32k")
    assert rep["fit"]["max_context"] == (1024**3 - 268_098_176 * 2 - 1024 * 15 * 512) // (1024 * 3)
    result = runner.invoke(app, ["cost", "gemma-3-270m", "--fit", "1GiB", "--sliding-window", "512",
                                 "--global-every", "100"])  # 18 layers, none global
    assert result.exit_code == 0, result.output
    assert "unbounded" in result.stdout


# ------------------------------------------------------------------------------------ tensor parallel
def test_gemma3_four_heads_over_three_ranks():
    """4 query heads over 3 ranks: 2 + 1 + 1 (uneven); the one KV head is read by every rank, so it is held,
    and cached, three times. q/k norm weights (2 x 256) are replicated on every rank."""
    tp = per_rank(GEMMA, 3, seq=32768, dtype="bf16")
    ranks, summary = tp["per_rank"], tp["summary"]
    assert [r["query_heads"] for r in ranks] == [[0, 1], [2], [3]]
    assert [r["kv_heads"] for r in ranks] == [[0], [0], [0]] and all(r["replicated_kv_heads"] == [0] for r in ranks)
    d, hd = 640, 256
    for r in ranks:
        nq = len(r["query_heads"])
        assert r["params"]["attention_per_layer"] == 2 * d * nq * hd + 2 * d * hd + 2 * hd
        assert r["kv_cache"]["bytes_for_context"] == 108_527_616  # one KV head, with the window, on each rank
        assert r["kv_cache"]["bytes_for_context_without_window"] == 603_979_776
        assert r["score_memory_bytes"]["banded_per_local_layer"] == nq * 32768 * 512 * 2
    assert summary["kv_heads_stored"] == 3 and summary["kv_cache_replication"] == 3
    assert summary["kv_cache_bytes_for_context_all_ranks"] == 3 * 108_527_616
    assert summary["kv_cache_bytes_for_context_one_process"] == 108_527_616
    # the ranks hold the model once, plus: the replicated parts twice more, the KV head's K and V rows twice
    # more, the q/k norms twice more (per layer), and the norms of every block twice more
    full = param_counts(GEMMA)
    replicated = full["embeddings"] + full["final_norm"]
    extra_per_layer = 2 * (2 * d * hd) + 2 * (2 * hd) + 2 * (4 * d)
    assert summary["params_all_ranks"] == full["total"] + 2 * replicated + 18 * extra_per_layer


@pytest.mark.parametrize("name", ["gemma-3-270m", "qwen2.5-0.5b", "qwen2.5-1.5b"])
def test_one_rank_is_the_whole_model(name):
    s = get_preset(name).shape
    (r,) = per_rank(s, 1, seq=32768, dtype="bf16")["per_rank"]
    assert r["params"]["total"] == param_counts(s)["total"]
    assert r["kv_cache"]["bytes_for_context"] == kv_cache(s, 1, 32768, 2)["bytes_for_context"]


def test_qwen25_14_heads_over_4_ranks():
    """14 query heads (7 per KV head) over 4 ranks: 4 + 4 + 3 + 3; rank 1 (heads 4-7) straddles both groups."""
    s = get_preset("qwen2.5-0.5b").shape
    ranks = per_rank(s, 4, seq=1024, dtype="bf16")["per_rank"]
    assert [r["query_heads"] for r in ranks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert [r["kv_heads"] for r in ranks] == [[0], [0, 1], [1], [1]]
    d, hd = 896, 64
    for r in ranks:
        nq, nkv = len(r["query_heads"]), len(r["kv_heads"])
        assert r["params"]["attention_per_layer"] == 2 * d * nq * hd + 2 * d * nkv * hd + (nq + 2 * nkv) * hd
    assert sum(r["kv_cache"]["bytes_per_token"] for r in ranks) == 5 * 24 * 2 * hd * 2


def test_tp_command_on_gemma():
    rep = cost_json("gemma-3-270m", "--tp", "3", "--seq", "32k")
    assert [len(r["query_heads"]) for r in rep["per_rank"]] == [2, 1, 1]
    result = runner.invoke(app, ["cost", "gemma-3-270m", "--tp", "3", "--seq", "32k"])
    assert result.exit_code == 0, result.output
    assert "0*" in result.stdout and "3 held over the ranks for the model's 1" in result.stdout


def test_report_runs_for_every_new_preset():
    for name in ("gemma-3-270m", "qwen2.5-0.5b", "qwen2.5-1.5b"):
        rep = report(get_preset(name).shape, seq=4096, dtype="bf16")
        assert json.loads(json.dumps(rep))["params"]["total"] == param_counts(get_preset(name).shape)["total"]


@pytest.mark.parametrize("n, w", [(5, 2), (9, 4), (12, 12), (7, 20)])
def test_a_banded_kernel_holds_every_pair_of_the_band(n, w):
    """n x min(n, w) slots per head: enough for every query's keys in the band, and all used but the
    first min(n, w) - 1 queries' missing ones."""
    s = ModelShape(d_model=8, n_heads=1, n_layers=1, sliding_window=w)
    slots = score_memory(s, 1, n, 1)["banded_per_local_layer"]
    per_query = [sum(1 for (i, _) in _band(n, w) if i == q) for q in range(n)]
    assert max(per_query) == min(n, w) and slots == n * min(n, w) >= len(_band(n, w))


# ------------------------------------------------------------------------ against headcount's module
def test_measured_module_matches_qk_norm_and_windowed_cache():
    """MultiHeadAttention built from the preset: its parameters (q/k norm included) and its caches (a global
    layer's KVCache, a local layer's SlidingKVCache of min(n, 512) positions) equal the formulas."""
    pytest.importorskip("torch")
    from headcount.cost import measure

    shape, left_out = measure.buildable(GEMMA)
    if left_out:
        pytest.skip(f"MultiHeadAttention cannot build {left_out} here")
    rows = measure.check_kv(shape, 2, 1000, "bf16", kv_heads=(1,))
    assert [r["measured"] for r in rows] == [2 * 1 * 256 * 1000 * 2 * 2, 2 * 1 * 256 * 512 * 2 * 2]
    assert all(r["ok"] for r in rows) and "local layer" in rows[1]["check"]
    one = shape.replace(n_layers=1, layer_types=(FULL,))
    params = measure.measure_params(one)
    assert all(r["ok"] for r in params) and params[0]["measured"] == param_counts(GEMMA)["attention_per_layer"]
