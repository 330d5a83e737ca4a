"""Gates trained on a FROZEN model (train_gates' default): the run gates.py's loop drives when joint=False, with the
same face as gates_joint.JointRun, so the loop never asks which variant it runs.

    run = FrozenRun(model, calibration=..., n_windows=..., window=..., batch_size=...)
    run.batch_rows(step)              examples in step's batch (one gate draw each)
    loss, n = run.loss(step, head_gates)
    run.step()                        nothing: no weight of the model trains
    run.close()

The calibration is `n_windows` windows (decoders; encoders: up to 32 x n_windows sentences in batches of 32), cycled.
The teacher is the model itself without gates (its weights never move), so it is a no_grad forward of the same
weights: no copy. Costs: every token of a batch runs through the teacher once (teacher_tokens = tokens_seen).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distill(model, batch, decoder: bool, gates: list) -> tuple[torch.Tensor, int]:
    """(distillation loss of the gated model against the same model without gates on this batch, positions
    scored)."""
    from headcount.analysis import objectives

    ids, mask = batch
    if decoder:
        with torch.no_grad():
            teacher = F.log_softmax(model(ids, attention_mask=mask).logits.float(), dim=-1)
        student = F.log_softmax(model(ids, attention_mask=mask, head_gates=gates).logits.float(), dim=-1)
        if mask is not None:
            keep = mask.bool()
            teacher, student = teacher[keep], student[keep]
        v = teacher.shape[-1]
        teacher, student = teacher.reshape(-1, v), student.reshape(-1, v)
        kl = F.kl_div(student, teacher, log_target=True, reduction="sum") / teacher.shape[0]
        return kl, teacher.shape[0]
    with torch.no_grad():
        ref = objectives.pooled(model, ids, mask)
    emb = objectives.pooled(model, ids, mask, head_gates=gates)
    return objectives.fidelity(emb, ref).mean().float(), ids.shape[0]


class FrozenRun:
    trained: list = []  # no weight of the model moves

    def __init__(self, model, *, calibration, n_windows: int, window: int, batch_size: int):
        from headcount.analysis.batches import calibration_batches, is_decoder

        self.model, self.decoder = model, is_decoder(model)
        self.batches = calibration_batches(model, calibration, n_windows=n_windows, window=window,
                                           batch_size=batch_size, n_sentences=32 * n_windows)
        self.calibration_tokens = sum(b.n_tokens for b in self.batches)
        self.tokens_seen = 0

    @property
    def teacher_tokens(self) -> int:
        return self.tokens_seen

    def batch_rows(self, step: int) -> int:
        return self.batches[step % len(self.batches)].ids.shape[0]

    def loss(self, step: int, head_gates) -> tuple:
        batch = self.batches[step % len(self.batches)]
        self.tokens_seen += batch.n_tokens
        return distill(self.model, batch, self.decoder, head_gates)

    def step(self) -> None:
        pass

    def close(self) -> None:
        pass
