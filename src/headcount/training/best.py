"""The best-weights policy of a run with a validation split: keep the weights of the lowest validation loss, go
back to them when a measurement finds nothing better, stop after `patience` such measurements in a row.

    best = BestWeights(params, patience=3)
    decision = best.observe(step, value, final=...)   NEW_BEST, BACK_OFF, STOP or HOLD
    best.restore()                                    the best weights copied back into params

BACK_OFF: no new best, fewer than `patience` in a row, and not the run's last step: the caller restores the best
weights and scales its lr down (Optimizer.back_off). STOP: `patience` measurements in a row without a new best.
HOLD: no new best at the last step (the run ends; the caller restores the best weights as at every end).
"""

from __future__ import annotations

import math

import torch

from headcount.arguments import positive_int

NEW_BEST, BACK_OFF, STOP, HOLD = "new best", "back off", "stop", "hold"


class BestWeights:
    def __init__(self, params, *, patience: int):
        self.params = list(params)
        self.patience = positive_int("patience", patience)
        self.value = math.inf  # the lowest validation loss so far
        self.step = 0  # the step it was measured at
        self.state: list[torch.Tensor] | None = None
        self.since = 0  # measurements in a row without a new best

    def observe(self, step: int, value: float, *, final: bool = False) -> str:
        """One validation measurement at `step` (final: the run's last step) -> what the run does next."""
        if value < self.value:
            self.value, self.step, self.since = value, step, 0
            self.state = [p.detach().clone() for p in self.params]
            return NEW_BEST
        self.since += 1
        if self.since >= self.patience:
            return STOP
        return HOLD if final else BACK_OFF

    @torch.no_grad()
    def restore(self) -> None:
        """The weights of the best measurement copied back into the parameters."""
        if self.state is None:
            raise RuntimeError("BestWeights.restore: no measurement was ever better than +inf (all NaN?)")
        for p, saved in zip(self.params, self.state):
            p.copy_(saved)
