"""`headcount cost --tp N`: per-rank accounts of tensor parallelism by heads, against hand counts."""

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.cost import get_preset, kv_cache, param_counts
from headcount.cost.parallel import per_rank
from headcount.cost.shape import CostError, ModelShape

runner = CliRunner()


def cost_json(*args):
    result = runner.invoke(app, ["cost", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_llama3_70b_on_8_ranks_by_hand():
    rep = cost_json("llama-3-70b", "--tp", "8", "--seq", "8192", "--dtype", "bf16")
    d, h, kv, hd, L, n, nbytes = 8192, 64, 8, 128, 80, 8192, 2
    ranks = rep["per_rank"]
    assert [r["rank"] for r in ranks] == list(range(8))
    for r in ranks:
        assert r["query_heads"] == list(range(8 * r["rank"], 8 * r["rank"] + 8))
        assert r["kv_heads"] == [r["rank"]]  # 64 / 8 = 8 query heads: exactly one KV group per rank
        assert r["params"]["attention_per_layer"] == 2 * d * 8 * hd + 2 * d * 1 * hd
        assert r["kv_cache"]["bytes_per_token"] == 2 * L * 1 * hd * nbytes == 40_960
        assert r["kv_cache"]["bytes_for_context"] == 40_960 * n
        assert r["allreduce_bytes_per_token_per_layer"] == 2 * d * nbytes == 32_768
        assert r["score_memory_bytes"]["eager_per_layer"] == 8 * n * n * nbytes
    # the eight ranks hold the model once, plus the replicated parts 7 more times
    vocab, f = 128256, 28672
    replicated = 2 * vocab * d + d + L * 2 * d  # embeddings, LM head (untied), final norm, norms of every block
    assert sum(r["params"]["total"] for r in ranks) == 70_553_706_496 + 7 * replicated
    assert ranks[0]["params"]["total"] == L * (2 * d * 8 * hd + 2 * d * hd + 3 * d * f // 8 + 2 * d) + 2 * vocab * d + d
    assert rep["tensor_parallel"]["kv_heads_stored"] == kv and rep["tensor_parallel"]["kv_cache_replication"] == 1


def test_smollm2_uneven_split_replicates_kv_head_1():
    shape = get_preset("smollm2").shape  # 9 query heads over 3 KV heads (q -> kv 0 0 0 1 1 1 2 2 2)
    tp = per_rank(shape, 2, seq=1000, dtype="fp32")
    a, b = tp["per_rank"]
    assert (a["query_heads"], a["kv_heads"], b["query_heads"], b["kv_heads"]) == (
        [0, 1, 2, 3, 4], [0, 1], [5, 6, 7, 8], [1, 2])
    assert a["replicated_kv_heads"] == b["replicated_kv_heads"] == [1]
    per_token = 2 * 30 * 2 * 64 * 4  # 2 KV heads on each rank
    assert a["kv_cache"]["bytes_per_token"] == b["kv_cache"]["bytes_per_token"] == per_token
    assert tp["summary"]["kv_cache_bytes_per_token_all_ranks"] \
        == 2 * per_token == 4 * kv_cache(shape, 1, 1, 4)["bytes_per_token"] // 3
    d = 576
    assert a["params"]["attention_per_layer"] == 2 * d * 5 * 64 + 2 * d * 2 * 64
    assert b["params"]["attention_per_layer"] == 2 * d * 4 * 64 + 2 * d * 2 * 64
    assert a["mlp_units"] == [0, 768] and b["mlp_units"] == [768, 1536]
    assert a["score_memory_bytes"]["eager_per_layer"] == 5 * 1000 * 1000 * 4


@pytest.mark.parametrize("preset", ["llama-3-8b", "gpt3-small", "all-minilm-l6-v2", "transformer-base", "smollm2"])
def test_one_rank_is_the_single_process_account(preset):
    shape = get_preset(preset).shape
    (r,) = per_rank(shape, 1, batch=2, seq=512, dtype="bf16")["per_rank"]
    assert r["params"]["total"] == param_counts(shape)["total"]
    assert r["params"]["attention_per_layer"] == param_counts(shape)["attention_per_layer"]
    assert r["kv_cache"]["bytes_for_context"] == kv_cache(shape, 2, 512, 2)["bytes_for_context"]
    assert r["allreduce_bytes_per_token_per_layer"] == 0 and r["replicated_kv_heads"] == []


@pytest.mark.parametrize("tp", [2, 3, 5, 12])
def test_sharded_parts_add_up_to_the_model(tp):
    """Biases on: Q/O weights and MLP units are partitioned (sum = the model's); bias of W_O / down once."""
    shape = ModelShape(d_model=96, n_heads=12, n_kv_heads=4, n_layers=3, d_ff=200, vocab_size=50, attn_bias=True,
                       mlp="gated", norm="rmsnorm", final_norm=True, tied_embeddings=False)
    ranks = per_rank(shape, tp, dtype="fp32")["per_rank"]
    full = param_counts(shape)
    stored = sum(len(r["kv_heads"]) for r in ranks)
    kv_params = 2 * (96 * 8 + 8)  # one KV head: its K and V rows (weights and biases)
    assert sum(r["params"]["attention_per_layer"] for r in ranks) == full["attention_per_layer"] + \
        (stored - 4) * kv_params
    assert sum(r["params"]["mlp_per_layer"] for r in ranks) == full["mlp_per_layer"]
    assert sorted(h for r in ranks for h in r["query_heads"]) == list(range(12))


def test_table_lists_every_rank_and_marks_replicated_kv_heads():
    result = runner.invoke(app, ["cost", "smollm2", "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert "0-4" in result.stdout and "5-8" in result.stdout and "1*" in result.stdout
    assert "4 held over the ranks for the model's 3" in result.stdout
    result = runner.invoke(app, ["cost", "smollm2", "--tp", "1"])
    assert result.exit_code == 0 and "one rank" in result.stdout


def test_variants_each_get_per_rank():
    rep = cost_json("llama-3-8b", "--kv-heads", "8,1", "--tp", "4")
    assert [len(v["per_rank"]) for v in rep["variants"]] == [4, 4]
    assert [v["per_rank"][0]["kv_heads"] for v in rep["variants"]] == [[0, 1], [0]]


@pytest.mark.parametrize("args, fragment", [
    (["llama-3-8b", "--tp", "0"], "--tp"),
    (["llama-3-8b", "--tp", "two"], "--tp"),
    (["llama-3-8b", "--tp", "33"], "more than the 32 query heads"),
])
def test_bad_tp_one_line_exit_2(args, fragment):
    result = runner.invoke(app, ["cost", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.output


def test_per_rank_bad_input():
    with pytest.raises(CostError, match="--tp"):
        per_rank(get_preset("smollm2").shape, True)


def test_tp_accounts_never_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    import headcount.cost

    package = Path(headcount.cost.__file__).resolve().parents[1]
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('headcount'); pkg.__path__ = [{str(package)!r}]; sys.modules['headcount'] = pkg\n"
        "import typer, headcount.cost.cli\n"
        "from typer.testing import CliRunner\n"
        "app = typer.Typer(); headcount.cost.cli.register(app)\n"
        "r = CliRunner().invoke(app, ['smollm2', '--tp', '2', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(package.parent), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
