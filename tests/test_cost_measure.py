"""The accounts against a run of headcount.MultiHeadAttention: parameters, FLOPs (FlopCounterMode, eager
path), KV cache bytes, and score memory (peak RSS in a process of its own)."""

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from headcount.cli import app  # noqa: E402
from headcount.cost import ModelShape, attention_flops, attention_params, kv_cache, score_memory  # noqa: E402
from headcount.cost import measure  # noqa: E402

SHAPES = {
    "mha": ModelShape(d_model=64, n_heads=8),
    "gqa": ModelShape(d_model=64, n_heads=8, n_kv_heads=2),
    "mqa": ModelShape(d_model=64, n_heads=8, n_kv_heads=1),
    "decoupled": ModelShape(d_model=48, n_heads=6, n_kv_heads=3, head_dim=16),  # 6 x 16 = 96 != 48
    "bias": ModelShape(d_model=64, n_heads=4, n_kv_heads=2, attn_bias=True),
    "qkv-bias-only": ModelShape(d_model=64, n_heads=4, attn_bias=True, o_bias=False),
}


def _ok(rows):
    return all(r["ok"] for r in rows if r["ok"] is not None)


# ----------------------------------------------------------------------------------------- params
@pytest.mark.parametrize("name", SHAPES)
def test_params_equal_numel(name):
    shape = SHAPES[name]
    attn = measure.build_attention(shape)
    assert sum(p.numel() for p in attn.parameters()) == attention_params(shape)["total"]
    rows = measure.measure_params(shape)
    assert _ok(rows) and len(rows) == 3


# ------------------------------------------------------------------------------------------ FLOPs
@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("batch, seq", [(1, 7), (2, 33)])
def test_flops_exact_on_the_eager_path(name, batch, seq):
    shape = SHAPES[name]
    got = measure.count_flops(shape, batch, seq)
    f = attention_flops(shape, batch, seq)
    assert got["total"] == f["total"]
    assert got["projections"] == f["projections"] and got["output"] == f["output"]
    assert got["scores_and_read"] == f["scores"] + f["read"]
    assert _ok(measure.check_flops(shape, batch, seq))


def _forgets_read(shape, b, n, causal=False):
    f = dict(attention_flops(shape, b, n))
    f["total"] -= f["read"]
    f["read"] = 0
    return f


def _scores_with_kv_heads(shape, b, n, causal=False):
    f = dict(attention_flops(shape, b, n))
    wrong = 2 * b * shape.n_kv_heads * n * n * shape.head_dim
    f["total"] += 2 * (wrong - f["scores"])
    f["scores"] = f["read"] = wrong
    return f


def _projections_with_query_heads_only(shape, b, n, causal=False):  # forgets that K/V have n_kv heads
    f = dict(attention_flops(shape, b, n))
    wrong = 2 * b * n * shape.d_model * 3 * shape.n_heads * shape.head_dim
    f["total"] += wrong - f["projections"]
    f["projections"] = wrong
    return f


@pytest.mark.parametrize("wrong", [_forgets_read, _scores_with_kv_heads, _projections_with_query_heads_only])
def test_the_flop_check_catches_a_wrong_formula(wrong):
    shape = SHAPES["gqa"]  # n_kv_heads != n_heads, so every wrong formula differs here
    rows = measure.check_flops(shape, 2, 16, formula=wrong)
    assert not _ok(rows)
    assert any(r["check"] == "FLOPs, total" and not r["ok"] for r in rows)


def test_flop_counter_never_halves_causal():
    shape = SHAPES["gqa"]
    causal = measure.count_flops(shape, 1, 32, causal=True)["total"]
    assert causal == attention_flops(shape, 1, 32)["total"]
    assert causal > attention_flops(shape, 1, 32, causal=True)["total"]


def test_flop_counter_and_the_fused_kernel():
    """On CPU FlopCounterMode may count the fused SDPA kernel as 0; whatever it counts, never more than the
    formula, and the projections are always seen."""
    shape = SHAPES["mha"]
    fused = measure.count_flops(shape, 1, 32, need_weights=False)
    f = attention_flops(shape, 1, 32)
    assert fused["projections"] == f["projections"] and fused["output"] == f["output"]
    assert fused["scores_and_read"] in (0, f["scores"] + f["read"])


# --------------------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("n_kv", [8, 4, 2, 1])
@pytest.mark.parametrize("dtype, torch_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                                ("fp16", torch.float16)])
def test_kv_cache_nbytes_exact(n_kv, dtype, torch_dtype):
    shape = ModelShape(d_model=64, n_heads=8, n_kv_heads=n_kv, n_layers=1)
    attn = measure.build_attention(shape)
    cache = attn.new_cache(3, 50, torch_dtype)
    assert cache.nbytes == kv_cache(shape, 3, 50, torch_dtype.itemsize)["bytes_for_context"]
    assert cache.nbytes == 2 * 3 * n_kv * 50 * 8 * torch_dtype.itemsize


def test_check_kv_rows_mha_gqa_mqa():
    rows = measure.check_kv(ModelShape(d_model=128, n_heads=16, n_kv_heads=4), 2, 64, "bf16")
    assert _ok(rows)
    kinds = {r["check"].split(",")[1].split()[0] for r in rows}
    assert kinds == {"MHA", "GQA", "MQA"}


# ----------------------------------------------------------------------------------- score memory
@pytest.fixture(scope="module")
def memory_rows():
    return measure.check_score_memory()


def test_eager_peak_matches_formula_within_10_percent(memory_rows):
    eager = [r for r in memory_rows if r["check"].startswith("score memory, eager")]
    assert len(eager) == len(measure.EAGER_GRID) >= 3
    for r in eager:
        assert abs(r["measured"] - r["formula"]) <= 0.10 * r["formula"], r
    # the formula, written out: scores + softmax output, fp32
    for (h, n), r in zip(measure.EAGER_GRID, eager):
        assert r["formula"] == 2 * h * n * n * 4


def test_eager_peak_grows_with_heads_and_n_squared(memory_rows):
    by_point = {(h, n): r["measured"] for (h, n), r in zip(
        measure.EAGER_GRID, [r for r in memory_rows if r["check"].startswith("score memory, eager")])}
    assert 3.2 < by_point[(8, 2048)] / by_point[(2, 2048)] < 4.8  # 4x the heads: ~4x the memory
    assert 3.2 < by_point[(2, 4096)] / by_point[(2, 2048)] < 4.8  # 2x n: ~4x the memory


def test_fused_does_not_grow_with_n_squared(memory_rows):
    fused = [r for r in memory_rows if r["check"].startswith("score memory, fused")]
    assert len(fused) == 2
    small, large = (r["measured"] for r in fused)
    assert large < 3 * small  # doubling n must not quadruple it
    eager_scores = score_memory(ModelShape(d_model=512, n_heads=8), 1, 4096, 4)["eager_per_layer"]
    assert large < eager_scores / 4
    growth = [r for r in memory_rows if r["check"].startswith("fused growth")]
    assert growth and growth[0]["ok"]


# --------------------------------------------------------------------------------------- the CLI
def test_cli_measure(monkeypatch, memory_rows):
    monkeypatch.setattr(measure, "check_score_memory", lambda **kw: memory_rows)  # measured once, above
    result = CliRunner().invoke(app, ["cost", "--measure", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["measure"]
    assert _ok(rows)
    checks = {r["check"] for r in rows}
    assert {"FLOPs, total", "params, attention (as configured)"} <= checks
    table = CliRunner().invoke(app, ["cost", "--measure", "--d-model", "128", "--heads", "4", "--seq", "64"])
    assert table.exit_code == 0, table.output
    assert "measured vs formula" in table.stdout and "MISMATCH" not in table.stdout


def test_cli_measure_refuses_a_huge_layer():
    result = CliRunner().invoke(app, ["cost", "llama-3-405b", "--measure", "--seq", "8192"])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--measure" in result.stderr
