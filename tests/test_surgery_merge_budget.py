"""merge_plan's budgets (parse_budget / check_budget, shared by merge-kv --budget and the frontier's merge:B) and
the by="kl" sensitivity, against a full forward of the model with one layer merged."""

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from headcount.models import Decoder, DecoderConfig
from headcount.surgery.merging import planner
from headcount.surgery.merging.planner import check_budget, merge_plan, parse_budget, sensitivity

pytestmark = pytest.mark.usefixtures("one_thread")
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "kB": 1000, "KB": 1000, "MB": 1000**2}


def _tiny(n_layers=3, n_heads=4, n_kv=2, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=61, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8,
                        d_ff=64, max_position=128)
    model = Decoder(cfg).double().eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.qkv_proj.weight.mul_(3.0)
    return model


def _ids(n=4, t=24, seed=1):
    return torch.randint(0, 61, (n, t), generator=torch.Generator().manual_seed(seed))


@given(st.integers(1, 10_000), st.sampled_from(sorted(UNITS)), st.sampled_from(["", " "]))
def test_bytes_with_a_unit(n, unit, space):
    assert parse_budget(f"{n}{space}{unit}") == n * UNITS[unit]


@given(st.integers(1, 999))
def test_fractions_and_percentages(k):
    assert parse_budget(f"{k / 1000}") == pytest.approx(k / 1000)
    assert parse_budget(f"{k / 10}%") == pytest.approx(k / 1000)
    assert parse_budget(str(k)) == k and isinstance(parse_budget(str(k)), int)  # a whole number: bytes


@pytest.mark.parametrize("text,match", [
    ("0", "positive number of KV bytes"), ("0.0", "fraction in \\(0, 1\\]"), ("-0.5", "expected a fraction"),
    ("1.5", "fraction in \\(0, 1\\]"), ("150%", "fraction"), ("12Kb", "unit of bytes"), ("12 tokens", "unit of bytes"),
    ("12 heads", "unit of bytes"), ("1.5B", "whole number of bytes"), ("lots", "expected a fraction"), ("", "expected"),
])
def test_bad_budgets_name_the_flag(text, match):
    with pytest.raises(ValueError, match=f"^--budget: .*{match}"):
        parse_budget(text)


def test_a_budget_the_model_cannot_hold():
    model = _tiny()  # 3 layers x 2 K/V heads x 8 dims x 2 (K and V) x 8 bytes: 768 bytes per token, MQA 384
    assert check_budget(model, 0.75) == 576 and check_budget(model, 384) == 384
    with pytest.raises(ValueError, match="^--budget: 383 KV bytes per token is below what every-layer MQA reaches "
                                         "\\(384 of 768\\)"):
        check_budget(model, parse_budget("383"), flag="--budget")
    with pytest.raises(ValueError, match="--budget"):
        check_budget(model, 0.49, flag="--budget")


def _full_kl(model, merged, ids):
    with torch.no_grad():
        p = F.log_softmax(model(ids).logits.double(), -1)
        q = F.log_softmax(merged(ids).logits.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_kl_sensitivity_is_the_kl_of_the_whole_model_with_that_layer_merged():
    model = _tiny()
    ids = _ids()
    base, table = sensitivity(model, calibration=ids, method="mean", by="kl", n_windows=2, n_eval_windows=2,
                              progress=False)
    assert base == 0.0 and set(table) == {0, 1, 2} and all(set(v) == {1} for v in table.values())
    for layer in range(3):
        merged = copy.deepcopy(model)
        merged.layers[layer].attn.merge_kv_heads(1)
        assert table[layer][1] == pytest.approx(_full_kl(model, merged, ids[2:]), rel=1e-6)
    plan = merge_plan(model, 0.7, sensitivity_from=merge_plan(model, 1.0, calibration=ids, method="mean", by="kl",
                                                              n_windows=2, n_eval_windows=2, progress=False))
    assert plan.by == "kl" and plan.kv_bytes_per_token_after <= 0.7 * 768
    cheapest = sorted(table, key=lambda l: table[l][1])[:2]  # 0.7 of 768 leaves room to merge two of the three
    assert sorted(plan.kv_heads) == sorted(cheapest)


def test_kl_calibrates_on_the_models_own_chat_answers_by_default(monkeypatch):
    model = _tiny()
    asked = []

    def chat_windows(teacher, n, window):
        asked.append((teacher, n, window))
        return _ids(n, 24, seed=5)

    monkeypatch.setattr(planner, "_chat_windows", chat_windows)
    base, table = sensitivity(model, method="mean", by="kl", n_windows=2, n_eval_windows=2, progress=False)
    assert asked == [(model, 4, 128)]
    merged = copy.deepcopy(model)
    merged.layers[0].attn.merge_kv_heads(1)
    assert table[0][1] == pytest.approx(_full_kl(model, merged, _ids(4, 24, seed=5)[2:]), rel=1e-6)


def test_kl_without_a_chat_template_says_what_to_do():
    model = _tiny()  # no tokenizer, so no chat answers to calibrate on
    with pytest.raises(ValueError, match="^by: 'kl' measures on the model's own chat answers.*by='loss'"):
        sensitivity(model, by="kl", progress=False)
    with pytest.raises(ValueError, match="by: expected one of loss, kl"):
        sensitivity(model, by="nll", calibration=_ids(), progress=False)


def test_auto_measures_kl_where_the_model_has_a_chat_template_else_loss(monkeypatch):
    from types import SimpleNamespace

    model, ids = _tiny(), _ids()
    monkeypatch.setattr(planner, "_chat_windows", lambda teacher, n, window: _ids(n, 24, seed=5))

    def plan(by=None):
        return merge_plan(model, 0.75, method="mean", progress=False,
                          **({} if by is None else {"by": by}))

    assert planner.resolve_by(model, "auto") == "loss"  # no tokenizer: nothing to ask for chat answers
    auto = merge_plan(model, 0.75, method="mean", calibration=ids, progress=False)
    assert auto.by == "loss"
    assert auto.sensitivity == merge_plan(model, 0.75, method="mean", calibration=ids, by="loss",
                                          progress=False).sensitivity
    model.tokenizer = SimpleNamespace(chat_template="{{ messages }}")
    assert planner.resolve_by(model, "auto") == "kl" and planner.resolve_by(model, "loss") == "loss"
    auto = plan()
    assert auto.by == "kl" and auto.sensitivity == plan("kl").sensitivity


def test_a_models_sensitivity_is_measured_once_and_read_back_at_any_budget(tmp_path, monkeypatch):
    """merge_plan(cache=): the table kept by weights hash, calibration and settings
    (surgery/merging/sensitivity_cache.py); read back it is the table measured, and it gives the same plans;
    another weight, calibration or `by`, or a damaged entry, is measured again."""
    model, ids = _tiny(), _ids()
    calls, real = [], planner.sensitivity
    monkeypatch.setattr(planner, "sensitivity", lambda *a, **k: calls.append(1) or real(*a, **k))
    options = {"calibration": ids, "method": "mean", "n_windows": 2, "n_eval_windows": 2, "progress": False}
    first = merge_plan(model, 0.7, cache=tmp_path, **options)
    again = merge_plan(model, 0.5, cache=tmp_path, **options)
    assert calls == [1] and again.sensitivity == first.sensitivity and again.base_loss == first.base_loss
    assert again.kv_heads == merge_plan(model, 0.5, **options).kv_heads and calls == [1, 1]
    merge_plan(model, 0.7, cache=tmp_path, **{**options, "calibration": _ids(seed=9)})
    merge_plan(model, 0.7, cache=tmp_path, by="kl", **options)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.layers[2].mlp.down_proj.weight[0, 0] += 1e-3
    merge_plan(other, 0.7, cache=tmp_path, **options)
    assert calls == [1] * 5
    for path in tmp_path.glob("sensitivity-*.json"):
        path.write_text("{")
    assert merge_plan(model, 0.7, cache=tmp_path, **options).sensitivity == first.sensitivity and len(calls) == 6


# ------------------------------------------------------------------------------------------ merge-kv --budget
TEXT = "\n\n".join(f"Paragraph {i}: the heads of layer {i % 3} read the keys that the queries ask for. " * 6
                   for i in range(8))
FAST = ["--local-steps", "0", "--uptrain-steps", "0", "--calibration-windows", "2", "--eval-windows", "1"]


def _saved(tmp_path):
    from conftest import tiny_byte_decoder
    from headcount.models.formats.native import save

    save(tiny_byte_decoder(), tmp_path / "tiny")
    (tmp_path / "text.txt").write_text(TEXT)
    return ["--model", str(tmp_path / "tiny"), "--text", str(tmp_path / "text.txt")]


def test_merge_kv_budget_merges_the_planned_layers_and_records_the_plan(tmp_path):
    import json

    from typer.testing import CliRunner

    from headcount.cli import app

    model = _saved(tmp_path)
    result = CliRunner().invoke(app, ["merge-kv", *model, "--budget", "0.75", *FAST, "--out",
                                      str(tmp_path / "m"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    before, after = data["kv_bytes_per_token_before"], data["kv_bytes_per_token_after"]
    assert before == 2 * 2 * 2 * 8 * 4 and after <= 0.75 * before  # 2 layers x 2 K/V heads x (K, V) x 8 dims x fp32
    assert data["plan"] and all(v == 1 for v in data["plan"].values())
    assert after == before - sum(2 * (2 - v) * 8 * 4 for v in data["plan"].values())
    assert isinstance(data["predicted_loss_increase"], float) and data["budget"] == "0.75"
    saved = json.loads((tmp_path / "m" / "headcount.json").read_text())
    assert saved["merge_plan"]["plan"] == data["plan"]
    assert data["sensitivity"] == "loss"
    kl = CliRunner().invoke(app, ["merge-kv", *model, "--budget", "0.75", "--sensitivity", "kl", *FAST,
                                  "--json"])
    assert kl.exit_code == 0, kl.output
    assert json.loads(kl.stdout)["sensitivity"] == "kl" and "read back" not in kl.stderr
    second = CliRunner().invoke(app, ["merge-kv", *model, "--budget", "0.6", "--sensitivity", "kl", *FAST,
                                      "--json"])
    assert second.exit_code == 0 and "merge sensitivity read back from" in second.stderr, second.output
    assert [layer["n_kv_heads"] for layer in saved["layers"]] == [1 if str(i) in data["plan"] else 2 for i in range(2)]


@pytest.mark.parametrize("args,match", [
    (["--budget", "0.75", "--kv-heads", "1"], "^headcount merge-kv: --budget: .*not both"),
    (["--budget", "0.75", "--layers", "0"], "^headcount merge-kv: --budget: .*not both"),
    (["--budget", "12Kb"], "^headcount merge-kv: --budget: expected a unit of bytes"),
    (["--budget", "1.5"], "^headcount merge-kv: --budget: expected a fraction"),
    (["--budget", "100"], "^headcount merge-kv: --budget: 100 KV bytes per token is below what every-layer MQA"),
    (["--kv-heads", "1", "--sensitivity", "kl"], "^headcount merge-kv: --sensitivity: chooses --budget's plan"),
    (["--budget", "0.75", "--sensitivity", "vibes"], "^headcount merge-kv: --sensitivity: expected one of loss, kl"),
    ([], "^headcount merge-kv: --kv-heads: .*or --budget"),
])
def test_merge_kv_budget_bad_input_exits_2_writing_nothing(tmp_path, args, match):
    import re

    from typer.testing import CliRunner

    from headcount.cli import app

    result = CliRunner().invoke(app, ["merge-kv", *_saved(tmp_path), *args, *FAST, "--out", str(tmp_path / "m")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), result.output
    assert not (tmp_path / "m").exists()
