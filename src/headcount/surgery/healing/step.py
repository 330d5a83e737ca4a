"""One healing step: the teacher's cached hidden states, the KL of a batch, the data-parallel share of it, fp32
master weights, and train_step (what `heal` repeats; the bench times it against plain PyTorch).

    source = Teacher(teacher, windows)            [T - 1, d] hidden states per window, cached when they fit
    source = Teacher(teacher, windows, mask)      mask [N, T] bool: True where the token is a target (an answer's)
    kl, positions = distilled(model, source, rows, head_t)
    train_step(model, source, rows, head_t, optimizer, trainable, masters=...) -> the mean KL per position

The teacher's final hidden states are computed once per window and cached (exact: the teacher never changes), so
a step costs the student's forward and backward plus the teacher's lm_head on its rows; a run whose cache would
pass CACHE_BYTES recomputes the teacher's forward instead.
"""

from __future__ import annotations

import torch

from headcount.surgery.healing.loss import distill_kl
from headcount.training.optimizer import clipped_step

CACHE_BYTES = 1 << 30


class Teacher:
    """The teacher's final hidden states per window [T - 1, d] (all but the last position), cached when they fit
    (budget 0: never cached, a forward every time). mask: None (every token is a target) or [N, T] bool, True
    where the token is a target: the KL at position j - 1 (which predicts token j) counts only where mask[:, j]."""

    def __init__(self, teacher, windows: torch.Tensor, budget: int = CACHE_BYTES, mask: torch.Tensor | None = None):
        if mask is not None and (mask.dtype != torch.bool or mask.shape != windows.shape):
            raise ValueError(f"mask: expected a bool tensor of the windows' shape {list(windows.shape)}, got "
                             f"{mask.dtype} {list(mask.shape)}")
        self.teacher, self.windows, self.mask = teacher, windows, mask
        n, t = windows.shape
        per = (t - 1) * teacher.config.d_model * teacher.embed.weight.element_size()
        self.cache = {} if 0 < budget and n * per <= budget else None
        self.forwards = 0  # teacher tokens run

    @torch.no_grad()
    def hidden(self, rows: list[int]) -> torch.Tensor:
        if self.cache is not None and all(r in self.cache for r in rows):
            return torch.stack([self.cache[r] for r in rows])
        ids = self.windows[rows]
        h = self.teacher(ids, compute_logits=False).hidden_states[:, :-1]
        self.forwards += ids.numel()
        if self.cache is not None:
            for r, row in zip(rows, h):
                self.cache[r] = row
        return h

    def targets(self, rows: list[int]) -> torch.Tensor | None:
        """[len(rows), T - 1] bool: which predicted positions count (None: all of them)."""
        return None if self.mask is None else self.mask[rows][:, 1:]

    def positions(self, rows: list[int]) -> int:
        """The predicted positions of `rows` that count: the denominator of their mean KL."""
        targets = self.targets(rows)
        return len(rows) * (self.windows.shape[1] - 1) if targets is None else int(targets.sum())


def distilled(model, teacher: Teacher, rows: list[int], head_t, head_gates=None) -> tuple[torch.Tensor, int]:
    """(KL summed over the rows' positions that count, those positions); head_gates: the student's (joint L0
    gates)."""
    h_t = teacher.hidden(rows)
    h_s = model(teacher.windows[rows], compute_logits=False, head_gates=head_gates).hidden_states[:, :-1]
    return distill_kl(h_s, h_t, model.lm_head, head_t, mask=teacher.targets(rows)), teacher.positions(rows)


class Share(torch.nn.Module):
    """This rank's share of the global mean KL: KL summed over its rows x world / the global positions, so that
    DistributedDataParallel's gradient average is the gradient of the global mean. The student is a submodule
    (DDP syncs and all-reduces its trainable parameters); the teacher is not (never registered)."""

    def __init__(self, model, source: Teacher, head_t):
        super().__init__()
        self.model = model
        self._side = (source, head_t)

    def forward(self, rows: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        source, head_t = self._side
        kl, _ = distilled(self.model, source, rows, head_t)
        return kl * scale, kl.detach()


class Masters:
    """fp32 master copies of the trainable weights stored in a lower precision (bf16 / fp16), the optimizer's
    parameters in their place; fp32 weights are their own masters (no copy)."""

    def __init__(self, trainable: list):
        low = (torch.bfloat16, torch.float16)
        self.pairs = [(p, torch.nn.Parameter(p.detach().float().clone()) if p.dtype in low else p) for p in trainable]
        self.copied = [(p, m) for p, m in self.pairs if m is not p]

    def params(self) -> list:
        return [m for _, m in self.pairs]

    def grads_to_masters(self) -> None:
        for p, m in self.copied:
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        for p, m in self.copied:
            p.copy_(m)

    @torch.no_grad()
    def model_to_masters(self) -> None:
        """After the model's weights were set (back to the best ones): the masters follow."""
        for p, m in self.copied:
            m.copy_(p.float())


def train_step(model, source: Teacher, rows: list[int], head_t, optimizer, trainable, *, ddp=None,
               dp=None, positions: int | None = None, masters: Masters | None = None) -> float:
    """One optimizer step on the windows `rows`: the mean KL per position, backward, clip at 1, AdamW.
    Data-parallel: `rows` are this rank's share, `ddp` the DistributedDataParallel(Share) wrapper, `dp` the
    DataParallel of the group and `positions` the global batch's positions; returns the global mean KL.
    masters: fp32 master weights (see Masters): the step is taken on them, then copied into the model.
    optimizer: a torch optimizer (the schedule, if any, is the caller's to step)."""
    if ddp is None:
        kl, n = distilled(model, source, rows, head_t)
        loss, value = kl / n, None
    else:
        loss, kl = ddp(rows, dp.world / positions)
        value = dp.sum_float(float(kl)) / positions  # the same number on every rank (the NaN check agrees)
    loss.backward()
    if masters is not None:
        masters.grads_to_masters()
        trainable = masters.params()
    clipped_step(optimizer, trainable, 1.0)  # gradients dropped: none held through the next forward
    if masters is not None:
        masters.masters_to_model()
    return float(loss.detach()) if value is None else value
