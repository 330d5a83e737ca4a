"""`headcount cost DIR` for an edited model and `--fit --kv-only`: per-layer accounts from accounts.py's own
formulas, the saving against the original shape, the KV cache's own budget."""

import json

import pytest
import torch
from typer.testing import CliRunner

from headcount.cli import app
from headcount.cost import get_preset
from headcount.cost.edited import EditedShape, edited_fit, predict, read_edited, saving, totals
from headcount.head_surgery import merge_kv_heads
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.formats.native import save

runner = CliRunner()


def edited_model():
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=96, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=96,
                        max_position=256)
    model = Decoder(cfg)
    merge_kv_heads(model.layers[0].attn, 1)  # layer 0: MQA
    model.layers[2].attn.prune_heads([1])  # layer 2: 3 query heads over 2 K/V heads (uneven groups)
    return model


def test_saved_edit_counts_every_parameter_and_kv_byte(tmp_path):
    model = edited_model()
    save(model, tmp_path / "e")
    edited = read_edited(tmp_path / "e")
    assert edited.heads == ((4, 1), (4, 2), (3, 2))
    t = totals(edited, batch=2, seq=50, dtype="fp32")
    assert t["params"] == sum(p.numel() for p in model.parameters())
    assert t["kv_bytes"] == sum(c.nbytes for c in model.new_cache(2, 50))
    s = saving(edited, seq=50, dtype="fp32")
    assert s["change"]["kv_bytes_per_token"] == pytest.approx(-1 / 6)  # 5 of 6 K/V head-layers left


def test_unedited_totals_agree_with_the_uniform_accounts():
    shape = get_preset("llama-3-8b").shape
    from headcount.cost import kv_cache, param_counts

    t = totals(EditedShape.unedited(shape), batch=1, seq=4096, dtype="bf16")
    assert t["params"] == param_counts(shape)["total"]
    assert t["kv_bytes"] == kv_cache(shape, 1, 4096, 2)["bytes_for_context"]


def test_predictions_of_every_layer_mqa():
    base = EditedShape.unedited(get_preset("llama-3-8b").shape)
    mqa = EditedShape(base.base, tuple((32, 1) for _ in range(32)))
    p = predict(base, mqa, batch=1, seq=4096, kv_dtype="fp16", weight_dtype="fp16")
    assert p["kv_ratio"] == pytest.approx(1 / 8)
    assert p["decode_speedup"] > 1 and p["prefill_speedup"] > 1


def test_kv_only_fit_and_the_cli(tmp_path):
    save(edited_model(), tmp_path / "e")
    result = runner.invoke(app, ["cost", str(tmp_path / "e"), "--fit", "1MiB", "--kv-only", "--dtype", "fp32",
                                 "--seq", "100", "--json"])
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert rep["fit"]["kv_tokens"] == 2**20 // ((1 + 2 + 2) * 2 * 32 * 4) and rep["fit"]["kv_only"]
    assert [r["n_kv_heads"] for r in rep["edited"]["layers"]] == [1, 2, 2]
    table = runner.invoke(app, ["cost", str(tmp_path / "e"), "--seq", "100"])
    assert table.exit_code == 0 and "the edit against the model it came from" in table.output
    uniform = runner.invoke(app, ["cost", "llama-3-8b", "--fit", "8GiB", "--kv-only", "--dtype", "bf16", "--json"])
    fit = json.loads(uniform.stdout)["fit"]
    assert fit["weights_bytes"] == 0 and fit["max_context"] == 8 * 2**30 // 131_072
    bad = runner.invoke(app, ["cost", "llama-3-8b", "--kv-only"])
    assert bad.exit_code == 2 and "--kv-only" in bad.output and "--fit" in bad.output


def test_fit_matches_edited_fit_for_an_unedited_model():
    shape = get_preset("llama-3-8b").shape
    from headcount.cost import fit

    a = fit(shape, 2**33, seq=4096, dtype="bf16", kv_only=True)
    b = edited_fit(EditedShape.unedited(shape), 2**33, seq=4096, dtype="bf16", kv_only=True)
    assert a["max_context"] == b["max_context"] and a["max_batch"] == b["max_batch"]
