"""Paired timing: every repeat runs each contender once, in turn, so drift on a shared machine hits all
of them alike. Report medians, and ratios as the median of per-repeat ratios."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def paired_times(contenders: dict[str, Callable[[], object]], *, repeats: int = 7,
                 warmup: int = 1) -> dict[str, list[float]]:
    """{name: [seconds per repeat]}; within a repeat the contenders run back to back."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over repeats of t(num) / t(den), both measured in the same repeat."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def paired_medians(contenders: dict[str, Callable[[], object]], *, repeats: int = 7, warmup: int = 1,
                   baseline: str) -> dict[str, dict[str, float]]:
    """{name: {"median_s": ..., "ratio": median over repeats of t(name) / t(baseline)}}."""
    times = paired_times(contenders, repeats=repeats, warmup=warmup)
    return {name: {"median_s": statistics.median(ts), "ratio": paired_ratio(times, name, baseline),
                   "times": ts} for name, ts in times.items()}
