"""The one quality measure (surgery/quality.py) and the one edit pipeline (surgery/editing.py), on tiny models:
perplexity against a cross-entropy written out here, each stage measured on the weights of that stage, the
accounts against the model's own head counts, healing's figures reused rather than measured twice."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_byte_decoder
from headcount.models.fingerprint import weights_hash
from headcount.surgery import prune
from headcount.surgery.editing import EditReport, accounts, run_edit
from headcount.surgery.quality import Quality, QualityMeter

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = ["the cat sat on the mat and then the dog sat on the log. " * 6,
         "a quick brown fox jumps over the lazy dog near the river bank. " * 6,
         "then the other one went home, and the rest of them stayed there. " * 6]


def _ppl_by_hand(model, windows: torch.Tensor) -> float:
    """exp(mean NLL) of tokens 1.. of each window from the full logits."""
    with torch.no_grad():
        logits = model(windows).logits
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).double(), windows[:, 1:].reshape(-1),
                          reduction="mean")
    return math.exp(float(nll))


def test_the_meter_measures_perplexity_on_each_domain_as_cross_entropy_says():
    model = tiny_byte_decoder()
    meter = QualityMeter({"a": TEXTS[:2], "b": TEXTS[1:]}, eval_windows=2, window=32)
    quality = meter.measure(model)
    assert list(quality.perplexity) == ["a", "b"] and not quality.fidelity and not quality.tasks
    for name, windows in meter.sets(model).items():
        assert windows.shape == (2, 32)
        assert quality.perplexity[name] == pytest.approx(_ppl_by_hand(model, windows), rel=1e-6)
    assert quality.headline == quality.perplexity["a"]


def test_known_figures_are_used_and_only_the_rest_is_measured(monkeypatch):
    model = tiny_byte_decoder()
    meter = QualityMeter({"a": TEXTS[:2], "b": TEXTS[1:]}, eval_windows=1, window=32)
    truth = meter.measure(model)
    import headcount.surgery.held_out as held_out
    measured, real = [], held_out.evaluate
    monkeypatch.setattr(held_out, "evaluate", lambda m, sets, refs=None: measured.append(list(sets)) or real(m, sets))
    again = meter.measure(model, known={"a": 123.0, "not-a-domain": 1.0})
    assert measured == [["b"]]
    assert again.perplexity == {"a": 123.0, "b": truth.perplexity["b"]}


def test_quality_round_trips_and_refuses_what_is_not_one():
    q = Quality({"prose": 9.5, "code": 7.25}, {}, {"humaneval:5": 0.4})
    assert Quality.from_json(q.to_json()) == q
    assert q.ratios(Quality({"prose": 9.5, "code": 5.0})) == {"prose": 1.0, "code": 1.45}
    with pytest.raises(ValueError, match="Quality.from_json"):
        Quality.from_json({"perplexity": {}, "loss": 3})


@pytest.mark.parametrize("kwargs,match", [({"eval_windows": 0}, "eval_windows"), ({"window": 1}, "window"),
                                          ({"eval_windows": True}, "eval_windows"),
                                          ({"extra": {"text": []}}, "extra")])
def test_bad_meter_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QualityMeter(**kwargs)


def test_a_nan_perplexity_is_an_error_naming_what_broke():
    with pytest.raises(ValueError, match="the pruned model"):
        Quality({"prose": float("nan")}).check_finite("the pruned model's held-out quality", torch.float16)


def test_run_edit_measures_each_stage_on_its_own_weights_and_reuses_healing_figures(monkeypatch):
    model = tiny_byte_decoder()
    teacher = copy.deepcopy(model)
    meter = QualityMeter({"a": TEXTS}, eval_windows=2, window=32)
    seen = []
    real = QualityMeter.held_out_quality

    def spy(self, m, known=None):
        seen.append((weights_hash(m), dict(known or {})))
        return real(self, m, known)

    monkeypatch.setattr(QualityMeter, "held_out_quality", spy)
    before_hash = weights_hash(model)

    def heal(m, before, after):
        assert before.perplexity != after.perplexity
        with torch.no_grad():
            m.layers[0].attn.o_proj.weight.mul_(0.5)
        return {"held_out": {"after_heal": {"a": 42.0}}, "steps": 1}

    report = run_edit(model, lambda m: prune(m, {0: [1], 1: [0, 3]}, compensate="none"), meter=meter, heal=heal)
    assert [h for h, _ in seen] == [before_hash, report.edited_weights_sha256, weights_hash(model)]
    assert seen[2][1] == {"a": 42.0}  # the heal's own after-heal figure, not measured again
    assert report.weights_sha256 == before_hash == weights_hash(teacher)
    assert report.quality["before_edit"].perplexity["a"] == pytest.approx(
        _ppl_by_hand(teacher, meter.sets(teacher)["a"]), rel=1e-6)
    assert report.quality["after_heal"].perplexity == {"a": 42.0}
    assert report.accounts_before == accounts(teacher)
    assert (report.accounts_before["heads"], report.accounts_after["heads"]) == (8, 5)
    assert report.accounts_after["kv_bytes_per_token"] <= report.accounts_before["kv_bytes_per_token"]
    data = report.to_json()
    assert data["held_out"]["before_edit"] == report.quality["before_edit"].perplexity
    assert data["ppl_before"] == report.quality["before_edit"].perplexity["a"]
    assert data["ppl_by_domain_before"] is None  # one domain: the headline alone
    assert data["heads_before"] == 8 and data["heads_after"] == 5 and data["heal"]["steps"] == 1
    back = EditReport.from_json(data)
    assert back.quality == report.quality and back.accounts_after == report.accounts_after


def test_run_edit_on_a_model_that_arrives_edited_measures_the_unedited_one_first():
    teacher = tiny_byte_decoder()
    student = copy.deepcopy(teacher)
    prune(student, {0: [2]}, compensate="none")
    meter = QualityMeter({"a": TEXTS}, eval_windows=1, window=32)
    report = run_edit(student, None, unedited=teacher, meter=meter)
    assert report.weights_sha256 == weights_hash(teacher)
    assert report.edited_weights_sha256 == weights_hash(student)
    assert report.accounts_before["heads"] == 8 and report.accounts_after["heads"] == 7
    assert "after_heal" not in report.quality
    with pytest.raises(ValueError, match="unedited"):
        run_edit(student, None, meter=meter)


def test_an_encoder_is_measured_against_its_own_unedited_embeddings(minilm):
    meter = QualityMeter({"a": TEXTS * 3}, eval_windows=1)
    same = meter.measure(minilm)
    assert same.fidelity["a"]["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert same.fidelity["a"]["spearman"] == pytest.approx(1.0, abs=1e-6)
    assert same.headline == (same.fidelity["a"]["cosine"], same.fidelity["a"]["spearman"])
