"""`headcount cost`: the JSON contract, the chapter's comparison, bad input, and no torch on import."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headcount.cost
from headcount.cli import app

runner = CliRunner()
PACKAGE_DIR = Path(headcount.cost.__file__).resolve().parents[1]  # src/headcount
SRC = PACKAGE_DIR.parent


def cost(*args):
    return runner.invoke(app, ["cost", *args])


def cost_json(*args):
    result = cost(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ------------------------------------------------------------------------------------ the contract
def test_llama3_8b_json_contract():
    rep = cost_json("llama-3-8b", "--seq", "8192", "--batch", "1", "--dtype", "bf16")
    d, h, kv, hd, L, n, B, nbytes = 4096, 32, 8, 128, 32, 8192, 1, 2
    assert rep["params"]["attention_per_layer"] == d * h * hd + 2 * d * kv * hd + h * hd * d
    assert rep["params"]["total"] == 8_030_261_248
    per_layer = rep["flops"]["attention_per_layer"]
    assert per_layer["projections"] == 2 * B * n * d * (h + 2 * kv) * hd
    assert per_layer["scores"] == per_layer["read"] == 2 * B * h * n * n * hd
    assert per_layer["output"] == 2 * B * n * h * hd * d
    full = sum(per_layer[k] for k in ("projections", "scores", "read", "output"))
    assert rep["flops"]["attention_total"] == L * full
    assert rep["flops"]["attention_total_causal"] == L * (full - h * n * n * hd * 2)  # scores and read halved
    assert rep["score_memory_bytes"]["eager_per_layer"] == B * h * n * n * nbytes
    assert rep["score_memory_bytes"]["fused_per_layer"] == 0
    assert rep["kv_cache"]["bytes_per_token"] == 2 * L * kv * hd * nbytes == 131_072
    assert rep["kv_cache"]["bytes_for_context"] == 131_072 * n * B
    assert "multiply-add is 2 FLOPs" in rep["conventions"]["flops"]


def test_table_says_a_multiply_add_is_two_flops():
    result = cost("llama-3-8b", "--seq", "8192", "--batch", "1", "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    assert "multiply-add is 2 FLOPs" in result.stdout
    assert "8,030,261,248" in result.stdout and "131,072" in result.stdout


def test_chapter_comparison_side_by_side():
    args = ("--d-model", "4096", "--heads", "8,32,128", "--seq", "4096", "--dtype", "fp16")
    result = cost(*args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("268,435,456", "0.25 GiB", "1 GiB", "4 GiB", "8 heads", "32 heads", "128 heads", "2 FLOPs"):
        assert text in out, text
    variants = cost_json(*args)["variants"]
    assert len(variants) == 3
    assert {v["params"]["attention_per_layer"] for v in variants} == {4 * 4096**2}
    assert len({v["flops"]["attention_total"] for v in variants}) == 1
    assert [v["score_memory_bytes"]["eager_per_layer"] for v in variants] == [
        h * 4096**2 * 2 for h in (8, 32, 128)] == [268_435_456, 2**30, 2**32]


def test_kv_heads_mha_gqa_mqa():
    variants = cost_json("llama-3-8b", "--kv-heads", "32,8,1", "--dtype", "fp16")["variants"]
    per_token = [v["kv_cache"]["bytes_per_token"] for v in variants]
    assert per_token == [4 * 131_072, 131_072, 131_072 // 8]
    assert [v["shape"]["attention_kind"] for v in variants] == ["MHA", "GQA", "MQA"]
    result = cost("llama-3-8b", "--kv-heads", "32,8,1", "--dtype", "fp16")
    assert "MQA" in result.stdout and "524,288" in result.stdout


def test_fit_budget():
    rep = cost_json("llama-3-8b", "--fit", "80GiB", "--dtype", "bf16", "--seq", "8192")
    budget, weights = 80 * 2**30, 8_030_261_248 * 2
    assert rep["fit"]["max_context"] == (budget - weights) // 131_072
    assert rep["fit"]["max_batch"] == (budget - weights) // (131_072 * 8192)
    result = cost("llama-3-8b", "--fit", "80GiB")
    assert result.exit_code == 0 and "longest context" in result.stdout


def test_flag_overrides():
    rep = cost_json("llama-3-8b", "--n-layers", "16", "--vocab", "32000", "--d-ff", "8192")
    d = 4096
    layer = (2 * d * d + 2 * d * 1024) + 3 * d * 8192 + 2 * d
    assert rep["params"]["total"] == 16 * layer + 2 * 32000 * d + d
    rep = cost_json("gpt3-xl", "--heads", "16", "--head-dim", "128")
    assert rep["shape"]["n_heads"] == 16 and abs(rep["params"]["total"] / 1.3e9 - 1) < 0.02


def test_config_flag(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
           "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rep = cost_json("--config", str(tmp_path / "config.json"))
    assert rep["params"]["total"] == 134_515_008  # SmolLM2-135M, the number


def test_unknown_model_type_is_refused_and_family_counts_it(tmp_path):
    """A model_type headcount does not know is refused (its biases, q/k norms and windows would be a guess);
    --family llama counts it as Llama, which for a Llama-shaped config gives the same numbers as model_type llama."""
    cfg = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
           "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
           "max_position_embeddings": 8192, "hidden_act": "silu"}
    (tmp_path / "new.json").write_text(json.dumps(cfg | {"model_type": "somethingnew"}))
    (tmp_path / "llama.json").write_text(json.dumps(cfg | {"model_type": "llama"}))
    result = cost(str(tmp_path / "new.json"))
    assert result.exit_code == 2 and result.stdout == ""
    assert "unknown model_type 'somethingnew'" in result.stderr and "--family" in result.stderr
    counted, llama = cost_json(str(tmp_path / "new.json"), "--family", "llama"), cost_json(str(tmp_path / "llama.json"))
    assert counted["params"] == llama["params"] and counted["params"]["total"] == 134_515_008
    for args, fragment in ((["llama-3-8b", "--family", "llama"], "--family"),
                           ([str(tmp_path / "new.json"), "--family", "nope"], "--family: expected one of")):
        result = cost(*args)
        assert result.exit_code == 2 and fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_list_presets():
    result = cost("--list")
    assert result.exit_code == 0
    for name in ("gpt3-small", "gpt3-175b", "llama-3-405b", "all-minilm-l6-v2", "transformer-big"):
        assert name in result.stdout


# ------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("args, fragment", [
    (["llama-9b"], "unknown preset"),
    (["llama-3-8b", "--seq", "0"], "seq"),
    (["llama-3-8b", "--seq", "-8"], "seq"),
    (["llama-3-8b", "--batch", "0"], "--batch"),
    (["llama-3-8b", "--batch", "two"], "--batch"),
    (["llama-3-8b", "--fit", "80 gigs"], "memory budget"),
    (["llama-3-8b", "--fit", "-1GiB"], "memory budget"),
    (["llama-3-8b", "--dtype", "fp13"], "dtype"),
    (["llama-3-8b", "--n-layers", "-2"], "--n-layers"),
    (["llama-3-8b", "--heads", "48"], "do not divide d_model"),
    (["llama-3-8b", "--heads", "4"], "more than"),
    (["llama-3-8b", "--kv-heads", "3"], "do not divide"),
    (["llama-3-8b", "--heads", "8,x"], "--heads"),
    (["--d-model", "4096", "--heads", "6"], "do not divide d_model"),
    (["--d-model", "0", "--heads", "8"], "--d-model"),
    (["--d-model", "4096"], "--heads"),
    ([], "give a preset"),
    (["llama-3-8b", "--config", "x.json"], "not both"),
    (["--config", "/nonexistent/config.json"], "no such file"),
])
def test_bad_input_one_line_exit_2(args, fragment):
    result = cost(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_bad_config_one_line_exit_2(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096,
                                                      "n_embd": 2048, "num_attention_heads": 32}))
    result = cost("--config", str(tmp_path / "config.json"))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "contradictory" in result.stderr


def test_bad_input_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "headcount.cli", "cost", "not-a-model"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "known:" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------- no torch
def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})


def test_cost_room_never_imports_torch():
    """Every module of headcount/cost (measure.py included, until its functions run) without torch,
    with the headcount package's own __init__ stubbed out so only this room is judged."""
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('headcount'); pkg.__path__ = [{str(PACKAGE_DIR)!r}]; sys.modules['headcount'] = pkg\n"
        "import headcount.cost, headcount.cost.cli, headcount.cost.format, headcount.cost.measure\n"
        "import typer\n"
        "app = typer.Typer(); headcount.cost.cli.register(app)\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['llama-3-8b', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('torch' in sys.modules)\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_import_headcount_cost_does_not_import_torch():
    proc = _run("import sys, headcount.cost; print('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
