"""A run's clock and its wall-clock budget (max_seconds).

    budget = TimeBudget(max_seconds)      None: no budget, only the clock
    budget.start()
    with budget.paused(): ...             time that is not the run's (heal's held-out measurements)
    budget.fit(step, schedule)            at step `timed` (3): the schedule cut to the steps that fit; True if cut
    budget.elapsed()                      the run's seconds so far

The first `timed` steps are timed and the plan is cut once, to max(least, int(max_seconds / seconds a step)) steps
when that is fewer than planned. Cutting the schedule (WarmupCosine.shorten) rather than stopping early keeps the
run ending at its floor learning rate. `agree`: under data parallelism every rank must plan the same number of
steps, so the caller passes the mean over ranks of the seconds a step.
"""

from __future__ import annotations

import contextlib
import time

from headcount.arguments import positive_float

TIMED = 3  # steps timed before the plan is fitted to the budget
LEAST = 4  # a budget never cuts a run below this many steps


class TimeBudget:
    def __init__(self, max_seconds: float | None = None, *, timed: int = TIMED, least: int = LEAST,
                 clock=time.perf_counter):
        positive_float("max_seconds", max_seconds, none=True, expected="a positive number of seconds or None")
        self.max_seconds, self.timed, self.least, self.clock = max_seconds, timed, least, clock
        self.started = None
        self.excluded = 0.0  # seconds spent paused

    def start(self) -> None:
        self.started, self.excluded = self.clock(), 0.0

    def elapsed(self) -> float:
        """Seconds since start(), less the time paused."""
        if self.started is None:
            raise RuntimeError("TimeBudget.elapsed: start() was never called")
        return self.clock() - self.started - self.excluded

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside is not the run's: neither counted in elapsed() nor in the seconds a step."""
        t0 = self.clock()
        try:
            yield
        finally:
            self.excluded += self.clock() - t0

    def fit(self, step: int, schedule, *, agree=None) -> bool:
        """Before step `step`: at step `timed`, shorten `schedule` (a WarmupCosine) to the steps that fit the
        budget when they are fewer than planned. agree(seconds a step) -> the value every rank plans with."""
        if self.max_seconds is None or step != self.timed:
            return False
        per_step = self.elapsed() / self.timed
        if agree is not None:
            per_step = agree(per_step)
        fit = max(self.least, int(self.max_seconds / per_step))
        if fit >= schedule.total:
            return False
        schedule.shorten(fit)
        return True
