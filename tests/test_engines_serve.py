"""`headcount bench serve` on tiny random models: the rows' keys, the KV bytes each engine allocates against the
accounts, one line for an engine that cannot run, and bad input (exit 2, one line)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headcount.cli import app
from headcount.engines.rows import ROW_KEYS
from headcount.head_surgery import merge_kv_heads
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.formats.native import save

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
NODE_LLAMA = ROOT / "tools" / "llamacpp" / "node_modules" / "node-llama-cpp"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def tiny(vocab=96, n_layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=vocab, d_model=64, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=32,
                        d_ff=96, max_position=256)
    return Decoder(cfg).eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny model and its every-layer MQA, saved."""
    root = tmp_path_factory.mktemp("serve")
    model = tiny()
    save(model, root / "base")
    for layer in model.layers:
        merge_kv_heads(layer.attn, 1)
    save(model, root / "mqa")
    return root


def serve(*args):
    return runner.invoke(app, ["bench", "serve", *args])


def test_headcount_rows_and_a_missing_engine(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_LLAMACPP_DIR", str(tmp_path / "nowhere"))
    result = serve("--model", str(pair / "base"), "--edited", str(pair / "mqa"), "--engines", "headcount,llamacpp",
                   "--context", "32", "--batch", "1,2", "--new-tokens", "4", "--repeats", "2",
                   "--workdir", str(tmp_path / "w"), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{"):])
    rows = out["rows"]
    assert out["settings"]["repeats"] == 2
    assert len(rows) == 4 and all(tuple(r) == ROW_KEYS for r in rows)
    assert "llamacpp" in out["skipped"] and "\n" not in out["skipped"]["llamacpp"]
    from headcount.engines.rows import ServeResult

    assert ServeResult.from_json(out).to_json() == out  # a saved run redraws its table and PNG
    by = {(r["edited"] is not None, r["batch"]): r for r in rows}
    for batch in (1, 2):
        base, mqa = by[(False, batch)], by[(True, batch)]
        # 2 layers x 2 K/V heads x 32 x (K and V) x 4 bytes x (32 + 4) positions x batch
        assert base["kv_bytes"] == 2 * 2 * 32 * 2 * 4 * 36 * batch
        assert mqa["kv_bytes"] / base["kv_bytes"] == pytest.approx(mqa["predicted_kv_ratio"]) == 0.5
        assert base["predicted_kv_ratio"] is None and mqa["predicted_decode_speedup"] > 1
        assert mqa["peak_rss_bytes"] > 0 and mqa["prefill_tokens_per_s"] > 0 and mqa["decode_tokens_per_s"] > 0


@pytest.mark.parametrize("args,words", [
    (["--engines", "headcount,sglang"], ["--engines", "headcount, llamacpp, vllm", "sglang"]),
    (["--context", "512"], ["--context 512", "context of 256"]),
    (["--context", "many"], ["--context"]),
    (["--png", "plot.svg"], ["--png", ".png"]),
    (["--repeats", "0"], ["--repeats"]),
])
def test_bad_input_exits_2_in_one_line(pair, args, words):
    result = serve("--model", str(pair / "base"), *args)
    assert result.exit_code == 2, result.output
    errors = [l for l in result.output.splitlines() if l.startswith("headcount bench serve:")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), result.output


def test_edited_of_another_model_is_refused(pair, tmp_path):
    save(tiny(vocab=80), tmp_path / "other")
    result = serve("--model", str(pair / "base"), "--edited", str(tmp_path / "other"), "--context", "16")
    assert result.exit_code == 2
    assert "vocabulary (80)" in result.output and "not an edit of that model" in result.output
    save(tiny(n_layers=3), tmp_path / "deeper")
    result = serve("--model", str(pair / "base"), "--edited", str(tmp_path / "deeper"), "--context", "16")
    assert result.exit_code == 2 and "layer count (3)" in result.output


@pytest.mark.skipif(not NODE_LLAMA.is_dir(), reason="node-llama-cpp is not installed (`make llamacpp`)")
def test_llamacpp_kv_bytes_from_its_context_state(tmp_path):
    from headcount.models.zoo import smollm2_gguf

    model = tiny(vocab=49152)  # smollm2's vocabulary: llama.cpp needs a tokenizer, copied from its GGUF
    model.source_gguf = smollm2_gguf()
    save(model, tmp_path / "base")
    for layer in model.layers:
        merge_kv_heads(layer.attn, 1)
    save(model, tmp_path / "mqa")
    result = serve("--model", str(tmp_path / "base"), "--edited", str(tmp_path / "mqa"), "--engines", "llamacpp",
                   "--context", "40", "--batch", "1,2", "--new-tokens", "4", "--workdir", str(tmp_path / "w"), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout[result.stdout.index("{"):])["rows"]
    by = {(r["edited"] is not None, r["batch"]): r for r in rows}
    for batch in (1, 2):
        # llama.cpp's f16 cache: 2 layers x 2 K/V heads x 32 x (K and V) x 2 bytes for each cell in use (the prompt
        # and every new token but the last, never fed back), plus its state's few bytes of bookkeeping per cell
        cells = (40 + 4 - 1) * batch
        base, mqa = by[(False, batch)]["kv_bytes"], by[(True, batch)]["kv_bytes"]
        assert 512 * cells <= base <= 512 * cells + 16 * cells + 256
        assert 256 * cells <= mqa <= 256 * cells + 16 * cells + 256


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM is not installed (`make vllm` creates .venv-vllm)")
def test_vllm_capacity_is_the_accounts_kv_only_fit(pair, tmp_path):
    """vLLM's KV blocks in its 1 GiB budget hold what `headcount cost DIR --fit 1GiB --kv-only` says, within 5%."""
    result = serve("--model", str(pair / "base"), "--edited", str(pair / "mqa"), "--engines", "vllm",
                   "--context", "120", "--batch", "1", "--new-tokens", "8", "--workdir", str(tmp_path / "w"), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{"):])
    caps = {c["edited"] is not None: c for c in out["capacity"]}
    for cap in caps.values():
        raw = cap["num_blocks"] * cap["block_size"]
        assert abs(raw / cap["accounts_kv_tokens"] - 1) < 0.05
        cost = runner.invoke(app, ["cost", str(pair / ("mqa" if cap["edited"] else "base")), "--fit", "1GiB",
                                   "--kv-only", "--dtype", "fp32", "--seq", "128", "--json"])
        assert json.loads(cost.stdout)["fit"]["kv_tokens"] == cap["accounts_kv_tokens"]
    assert caps[True]["num_blocks"] / caps[False]["num_blocks"] == pytest.approx(2.0, rel=0.01)
    rows = {r["edited"] is not None: r for r in out["rows"]}
    assert rows[True]["kv_bytes"] * 2 == rows[False]["kv_bytes"]


def test_a_padded_layout_gets_the_accounts_of_the_heads_llama_cpp_computes():
    from headcount.cost.edited import EditedShape, predict
    from headcount.engines.serve import Variant, _base_shape, run_shape_note

    model = tiny()
    base = _base_shape(model)
    pruned = Variant("p", "p", "p", ((3, 2), (4, 2)), "d", {})  # layer 0 lost a query head: groups 2 + 1
    assert run_shape_note(base, pruned, pruned.heads, 64, 1) == []  # computed as kept: nothing to add
    padded = ((4, 2), (4, 2))  # the zero head written back: llama.cpp computes the unedited shape
    (note,) = run_shape_note(base, pruned, padded, 64, 1)
    assert "8 query heads, 4 K/V heads; the edit keeps 7 and 4" in note
    assert "prefill 1.000x" in note and "decode 1.000x" in note  # padding back to the model buys nothing
    p = predict(base, EditedShape(base.base, ((3, 2), (4, 2))), batch=1, seq=64, kv_dtype="fp16",
                weight_dtype="fp32")
    assert p["prefill_speedup"] > 1.0  # while the edit itself would have bought some
