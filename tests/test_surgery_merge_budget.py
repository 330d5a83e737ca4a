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
