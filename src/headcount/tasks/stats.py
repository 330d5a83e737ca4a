"""How sure a pass@k is, and whether two runs on the same problems differ: numbers, no I/O.

    wilson_interval(passed, n) -> (lo, hi)           greedy pass@1 over n problems: Wilson's 95% score interval
    bootstrap_interval(per_problem) -> (lo, hi)      pass@k with n > 1 samples: percentile bootstrap over problems
    mcnemar_exact(wins, losses) -> p                 two-sided exact McNemar: binomial test of wins in wins + losses
    paired(this, base) -> Paired                     {task_id: passed} twice: wins, losses, difference, ci95, p_value

Two runs on the same problems are paired: only the problems where they disagree carry information about which
is better (McNemar), and the difference's interval comes from resampling problems, both runs together, so the
problems' own difficulty cancels. A fixed seed makes every interval reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

Z95 = 1.96  # the standard normal's 97.5th percentile (1.95996...), as the interval is usually quoted
RESAMPLES = 10_000


def wilson_interval(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion passed / n: the p whose normal test at z does not reject;
    never outside [0, 1], never empty at 0 or n (unlike p +- z sqrt(p(1-p)/n))."""
    for name, value in (("passed", passed), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"wilson_interval: {name} should be a whole number, got {value!r}")
    if n < 1 or not 0 <= passed <= n:
        raise ValueError(f"wilson_interval: expected n >= 1 and 0 <= passed <= n, got passed={passed}, n={n}")
    if not z > 0:
        raise ValueError(f"wilson_interval: z should be > 0, got {z!r}")
    p = passed / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at 0 or n the bound that touches the edge is exactly the edge (the formula rounds a hair away from it)
    lo = 0.0 if passed == 0 else max(0.0, centre - half)
    hi = 1.0 if passed == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(wins: int, losses: int) -> float:
    """The two-sided exact McNemar test: P(a split of wins + losses discordant problems at least as uneven as this
    one) when each is a fair coin; 1.0 when there are none."""
    for name, value in (("wins", wins), ("losses", losses)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"mcnemar_exact: {name} should be a whole number >= 0, got {value!r}")
    n, low = wins + losses, min(wins, losses)
    if n == 0 or wins == losses:
        return 1.0
    # symmetric at 1/2: the two tails are equal, so two-sided = 2 * P(X <= low), summed exactly in integers
    tail = sum(math.comb(n, i) for i in range(low + 1))
    return min(1.0, 2 * tail / 2 ** n)


def bootstrap_interval(per_problem: Iterable[float], *, resamples: int = RESAMPLES, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of a mean over problems (pass@k with n > 1 samples a problem: each
    problem's unbiased pass@k in, problems resampled with replacement, `resamples` times, a fixed seed)."""
    import numpy as np

    values = np.asarray(list(per_problem), dtype=np.float64)
    _check_resampling(len(values), resamples, level)
    means = _resampled_means(values, resamples, seed)
    return _percentiles(means, level)


@dataclass(frozen=True)
class Paired:
    """Two runs on the same problems: this one against a base."""

    n: int  # problems both ran
    wins: int  # problems this run passes and the base fails
    losses: int  # the reverse
    difference: float  # this run's pass@1 minus the base's = (wins - losses) / n
    ci95: tuple[float, float]  # the difference's paired-bootstrap 95% interval
    p_value: float  # exact McNemar

    def to_json(self) -> dict:
        # the p-value to 6 significant digits: a clear difference's is far below 1e-6
        return {"wins": self.wins, "losses": self.losses, "difference": round(self.difference, 6),
                "ci95": [round(self.ci95[0], 6), round(self.ci95[1], 6)], "p_value": float(f"{self.p_value:.6g}")}


def paired(this: Mapping[str, bool], base: Mapping[str, bool], *, resamples: int = RESAMPLES,
           seed: int = 0) -> Paired:
    """Compare two runs' verdicts {task_id: passed} on the same problems; problems missing from either side are an
    error that names them (a comparison over different problems would not be paired)."""
    import numpy as np

    only_this = [t for t in this if t not in base]
    only_base = [t for t in base if t not in this]
    if only_this or only_base:
        parts = [f"{len(ids)} only in {side} ({listed(ids)})"
                 for side, ids in (("this run", only_this), ("the base", only_base)) if ids]
        raise ValueError(f"paired: the runs must cover the same problems; {'; '.join(parts)}")
    if not this:
        raise ValueError("paired: no problems to compare")
    _check_resampling(len(this), resamples, 0.95)
    ids = list(this)
    a = np.array([bool(this[t]) for t in ids], dtype=np.int8)
    b = np.array([bool(base[t]) for t in ids], dtype=np.int8)
    wins, losses = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    means = _resampled_means((a - b).astype(np.float64), resamples, seed)
    return Paired(len(ids), wins, losses, (wins - losses) / len(ids), _percentiles(means, 0.95),
                  mcnemar_exact(wins, losses))


def _check_resampling(n: int, resamples: int, level: float) -> None:
    if n < 1:
        raise ValueError("bootstrap: no problems to resample")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples: expected a whole number >= 1, got {resamples!r}")
    if not 0 < level < 1:
        raise ValueError(f"level: expected a fraction in (0, 1), got {level!r}")


def _resampled_means(values, resamples: int, seed: int):
    """[resamples] means of `values` resampled with replacement (in chunks: a bounded index array)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(values)
    out = np.empty(resamples, dtype=np.float64)
    chunk = max(1, (1 << 22) // n)
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        out[start:start + rows] = values[rng.integers(0, n, size=(rows, n))].mean(axis=1)
    return out


def _percentiles(means, level: float) -> tuple[float, float]:
    import numpy as np

    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def listed(ids: list[str], shown: int = 5) -> str:
    """The first `shown` ids, and how many more."""
    more = f", ... {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more
