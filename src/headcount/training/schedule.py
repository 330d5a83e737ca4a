"""One learning-rate schedule: a linear warm-up, then a cosine decay to a floor.

    warmup_cosine(step, warm, total, *, floor=0.0, peak_in_warmup=False) -> the lr's factor at `step`
    WarmupCosine(total, warm=..., share=..., ...)   the same as the callable torch's LambdaLR takes; shorten()

The warm-up is (step + 1) / (warm + 1) for step < warm: the peak is first reached at `warm`, where the cosine
starts (heal, uptrain, the joint gates). peak_in_warmup=True divides by `warm` instead, so that the last warm-up
step is already at the peak (the experiments' schedule, as their saved results were trained). From `warm` on:

    floor + (1 - floor) * (1 + cos(pi * p)) / 2,    p = min(1, (step - warm) / max(1, total - warm))

the peak at `warm`, the floor from `total` on.
"""

from __future__ import annotations

import math

from headcount.arguments import fraction, is_int, positive_int


def warmup_cosine(step: int, warm: int, total: int, *, floor: float = 0.0, peak_in_warmup: bool = False) -> float:
    """The learning rate's factor (of its peak) at `step`; see the module doc."""
    if step < warm:
        return (step + 1) / (warm if peak_in_warmup else warm + 1)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
    return floor + (1.0 - floor) * cosine


class WarmupCosine:
    """warmup_cosine over a plan of `total` steps, as a callable of the step (torch's LambdaLR takes it). The warm-up
    is `warm` steps, or int(share x total) steps. shorten(total): a shorter plan (a time budget's), its warm-up
    kept or cut to the same share of the new plan, so the run still ends at the floor."""

    def __init__(self, total: int, *, warm: int | None = None, share: float | None = None, floor: float = 0.0,
                 peak_in_warmup: bool = False):
        positive_int("total", total, expected="a positive number of steps")
        if (warm is None) == (share is None):
            raise ValueError(f"warm, share: expected exactly one (warm-up steps, or their share of the steps), got "
                             f"warm={warm!r}, share={share!r}")
        fraction("share", share, include_low=True, include_high=True, none=True,
                 expected="a share of the steps in [0, 1]")
        positive_int("warm", warm, 0, none=True, expected="a number of warm-up steps >= 0")
        fraction("floor", floor, include_low=True, include_high=True, expected="a share of the peak in [0, 1]")
        self.total, self.share, self.floor, self.peak_in_warmup = total, share, floor, peak_in_warmup
        self.warm = int(share * total) if warm is None else warm

    def __call__(self, step: int) -> float:
        return warmup_cosine(step, self.warm, self.total, floor=self.floor, peak_in_warmup=self.peak_in_warmup)

    def shorten(self, total: int) -> None:
        """Plan `total` steps from now on (fewer than planned): the cosine re-sized to end at the new total."""
        if not is_int(total) or not 1 <= total <= self.total:
            raise ValueError(f"total: expected a number of steps in [1, {self.total}], got {total!r}")
        self.warm = min(self.warm, int(self.share * total) if self.share is not None else total)
        self.total = total
