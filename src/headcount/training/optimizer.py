"""One optimizer set-up for every run that trains: AdamW, gradients clipped by their norm, a schedule per step.

    opt = Optimizer(params, lr=..., schedule=WarmupCosine(...), weight_decay=0.0, clip=1.0, betas=..., maximize=...)
    loss.backward(); opt.step()       clip, AdamW's step, the gradients dropped (None), the schedule advanced
    opt.back_off(factor, step)        after the weights went back: the peak lr x factor, AdamW's moments reset
    clipped_step(optimizer, params, clip)   the step alone, for a caller that holds its own torch optimizer

AdamW with weight_decay 0 is Adam (torch's AdamW is Adam with the decay decoupled, and skips a decay of 0), so the
gates' Adam on log_alpha and their multipliers' ascent run here too (schedule None: a constant lr; clip None).
The gradients are dropped after the step, not before the next backward: no gradient is held through the next
forward, and the numbers are the same (a backward into None gradients).
"""

from __future__ import annotations

import torch

from headcount.arguments import fraction, positive_float


def clipped_step(optimizer: torch.optim.Optimizer, params: list, clip: float | None = 1.0) -> None:
    """Clip the gradients of `params` to a total norm of `clip` (None: no clipping), step, drop the gradients."""
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class Optimizer:
    """AdamW over `params` with a schedule (a callable of the step giving the lr's factor; None: constant) and the
    gradients clipped at `clip` before each step. `adamw` and `scheduler` are torch's own objects."""

    def __init__(self, params, *, lr: float, schedule=None, weight_decay: float = 0.0, clip: float | None = 1.0,
                 betas: tuple[float, float] = (0.9, 0.999), maximize: bool = False):
        self.params = list(params)
        if not self.params:
            raise ValueError("params: expected at least one parameter to train, got none")
        positive_float("lr", lr, expected="a positive learning rate")
        positive_float("clip", clip, none=True, finite=False, expected="a positive gradient norm or None")
        self.clip, self.schedule = clip, schedule
        self.adamw = torch.optim.AdamW(self.params, lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize)
        self.scheduler = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(self.adamw, schedule)

    def step(self) -> None:
        """After backward: clip, AdamW's step, the gradients dropped, the schedule advanced."""
        clipped_step(self.adamw, self.params, self.clip)
        self.advance()

    def advance(self) -> None:
        """The schedule's step alone (for a caller that took the optimizer's step itself: clipped_step)."""
        if self.scheduler is not None:
            self.scheduler.step()

    @property
    def peak_lr(self) -> float:
        """The lr the schedule's factors multiply (after any back-off)."""
        return self.scheduler.base_lrs[0] if self.scheduler is not None else self.adamw.param_groups[0]["lr"]

    def back_off(self, factor: float, step: int) -> float:
        """The peak lr scaled by `factor` from `step` on and AdamW's moments reset (the weights have just gone back
        to earlier ones, which the moments were not gathered on); returns the new peak lr."""
        fraction("factor", factor, include_high=True, expected="a share of the lr in (0, 1]")
        self.adamw.state.clear()
        if self.scheduler is None:
            for group in self.adamw.param_groups:
                group["lr"] = group["lr"] * factor
            return self.peak_lr
        self.scheduler.base_lrs = [b * factor for b in self.scheduler.base_lrs]
        for group, base in zip(self.adamw.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * self.schedule(step)
        return self.peak_lr
