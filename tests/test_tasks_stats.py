"""tasks/stats.py against independent truths: Wilson's interval against its closed form (the
interval is where the score test's statistic equals z), McNemar against scipy.stats.binomtest, the bootstraps
against the normal approximation's width from the closed-form variance, and properties over random inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from headcount.tasks.stats import bootstrap_interval, mcnemar_exact, paired, wilson_interval

scipy_stats = pytest.importorskip("scipy.stats")


@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
@settings(max_examples=200, deadline=None)
def test_wilson_bounds_are_where_the_score_test_reaches_z(case):
    passed, n = case
    lo, hi = wilson_interval(passed, n)
    p = passed / n
    assert 0.0 <= lo <= p <= hi <= 1.0

    def score(q):  # the score test's statistic: |p - q| / sqrt(q (1 - q) / n)
        return abs(p - q) / math.sqrt(q * (1 - q) / n)

    for bound, edge in ((lo, 0), (hi, n)):
        if passed == edge:  # the interval touches the edge exactly
            assert bound == float(edge == n)
        else:
            assert score(bound) == pytest.approx(1.96, rel=1e-9)
    # symmetric: the failures' interval is the mirror image
    lo2, hi2 = wilson_interval(n - passed, n)
    assert (lo2, hi2) == pytest.approx((1 - hi, 1 - lo), abs=1e-12)


def test_wilson_at_humaneval_size_is_about_seven_and_a_half_points_each_side():
    lo, hi = wilson_interval(87, 164)  # p = 0.53
    assert (hi - lo) / 2 == pytest.approx(0.075, abs=0.002)
    # scipy's binomtest gives the same Wilson interval (method="wilson", no continuity correction)
    ci = scipy_stats.binomtest(87, 164).proportion_ci(confidence_level=0.95, method="wilson")
    assert (lo, hi) == pytest.approx((ci.low, ci.high), abs=2e-5)  # scipy's z is 1.95996..., ours 1.96


@given(st.integers(0, 80), st.integers(0, 80))
@settings(max_examples=200, deadline=None)
def test_mcnemar_is_scipys_two_sided_binomial_test(wins, losses):
    p = mcnemar_exact(wins, losses)
    if wins + losses == 0:
        assert p == 1.0
        return
    assert p == pytest.approx(scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-9, abs=1e-15)
    assert p == mcnemar_exact(losses, wins)


def test_mcnemar_of_the_probe_in_the_design():
    # 18 problems only one prompt passed, 9 only the other: not significant at 5%
    assert mcnemar_exact(18, 9) == pytest.approx(scipy_stats.binomtest(18, 27).pvalue)
    assert 0.1 < mcnemar_exact(18, 9) < 0.15


def _verdicts(draw_bits):
    return {f"T/{i}": bool(b) for i, b in enumerate(draw_bits)}


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60), st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_paired_counts_and_its_interval_holds_the_difference(pairs, seed):
    this = _verdicts(a for a, _ in pairs)
    base = _verdicts(b for _, b in pairs)
    result = paired(this, base, resamples=500, seed=seed)
    wins = sum(a and not b for a, b in pairs)
    losses = sum(b and not a for a, b in pairs)
    assert (result.wins, result.losses, result.n) == (wins, losses, len(pairs))
    assert result.difference == pytest.approx(sum(this.values()) / len(pairs) - sum(base.values()) / len(pairs))
    lo, hi = result.ci95
    assert -1.0 <= lo <= result.difference <= hi <= 1.0
    assert result.p_value == mcnemar_exact(wins, losses)
    assert paired(this, base, resamples=500, seed=seed) == result  # a fixed seed: the same interval
    swapped = paired(base, this, resamples=500, seed=seed)
    assert (swapped.wins, swapped.losses, swapped.p_value) == (losses, wins, result.p_value)


def test_paired_interval_width_is_the_closed_form_variances():
    # 164 problems, 18 won and 9 lost: the mean difference's bootstrap sd is sqrt(var(d) / n)
    n, wins, losses = 164, 18, 9
    d = [1] * wins + [-1] * losses + [0] * (n - wins - losses)
    this = {f"T/{i}": v == 1 for i, v in enumerate(d)}
    base = {f"T/{i}": v == -1 for i, v in enumerate(d)}
    result = paired(this, base)
    mean = sum(d) / n
    sd = math.sqrt((sum(x * x for x in d) / n - mean ** 2) / n)
    lo, hi = result.ci95
    assert result.to_json()["difference"] == pytest.approx(9 / 164, abs=1e-6)
    assert (hi - lo) / (2 * 1.96 * sd) == pytest.approx(1.0, abs=0.06)
    assert set(result.to_json()) == {"wins", "losses", "difference", "ci95", "p_value"}


def test_bootstrap_interval_of_pass_at_k_is_the_normal_width():
    import random

    rng = random.Random(0)
    values = [rng.random() for _ in range(200)]
    lo, hi = bootstrap_interval(values)
    mean = sum(values) / len(values)
    sd = math.sqrt((sum(v * v for v in values) / len(values) - mean ** 2) / len(values))
    assert lo < mean < hi
    assert (hi - lo) / (2 * 1.96 * sd) == pytest.approx(1.0, abs=0.06)
    assert bootstrap_interval(values) == (lo, hi)  # fixed seed
    assert bootstrap_interval([0.5] * 10) == (0.5, 0.5)


def test_missing_problems_are_named():
    with pytest.raises(ValueError, match=r"1 only in this run \(T/2\); 1 only in the base \(T/3\)"):
        paired({"T/1": True, "T/2": False}, {"T/1": True, "T/3": True})
    with pytest.raises(ValueError, match="no problems"):
        paired({}, {})


@pytest.mark.parametrize("call, message", [
    (lambda: wilson_interval(5, 4), "0 <= passed <= n"),
    (lambda: wilson_interval(0, 0), "n >= 1"),
    (lambda: wilson_interval(1.5, 4), "whole number"),
    (lambda: mcnemar_exact(-1, 2), "wins"),
    (lambda: bootstrap_interval([]), "no problems"),
    (lambda: bootstrap_interval([1.0], resamples=0), "resamples"),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
