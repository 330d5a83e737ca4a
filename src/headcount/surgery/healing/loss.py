"""The distillation loss: KL(teacher || student) of next-token distributions, chunked over positions so no
[T, vocab] tensor is built for a large vocabulary (models.decoder.chunked_nll's budget).

    distill_kl(student_hidden [N, d], teacher_hidden [N, d], student_head, teacher_head) -> KL summed (float32)

Both hidden states are the decoders' final-norm outputs (Decoder(..., compute_logits=False).hidden_states),
one row per predicted position. The teacher's side carries no gradient; with gradients each chunk of the
student's logits is recomputed in backward (torch.utils.checkpoint), so training holds one chunk of logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from headcount.models.decoder import LOGIT_ELEMENTS, LOGIT_ELEMENTS_GRAD

Tensor = torch.Tensor


def _piece(h_s: Tensor, h_t: Tensor, student_head, teacher_head) -> Tensor:
    # [n, vocab] rows: log-softmax over the last dim, in float32 whatever the weights' dtype
    with torch.no_grad():
        target = F.log_softmax(teacher_head(h_t).float(), dim=-1)
    student = F.log_softmax(student_head(h_s).float(), dim=-1)
    return F.kl_div(student, target, log_target=True, reduction="sum")


def distill_kl(student_hidden: Tensor, teacher_hidden: Tensor, student_head, teacher_head=None, *,
               chunk: int | None = None) -> Tensor:
    """Sum over rows of KL(softmax(teacher_head(teacher_hidden)) || softmax(student_head(student_hidden))), nats.

    student_hidden, teacher_hidden: [..., d_model] with the same leading shape. teacher_head defaults to the
    student's (a pruned model shares its lm_head with its teacher). chunk: rows at a time (None = the
    chunked_nll budget: LOGIT_ELEMENTS // vocab rows, a quarter of that with gradients); when every row fits
    in one chunk, no checkpoint (nothing to save)."""
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(f"teacher_hidden: expected the student's leading shape {list(student_hidden.shape[:-1])}, "
                         f"got {list(teacher_hidden.shape[:-1])}")
    teacher_head = student_head if teacher_head is None else teacher_head
    vocab = student_head.weight.shape[0]
    grad = torch.is_grad_enabled() and (student_hidden.requires_grad
                                        or any(p.requires_grad for p in student_head.parameters()))
    if chunk is None:
        chunk = max(1, (LOGIT_ELEMENTS_GRAD if grad else LOGIT_ELEMENTS) // vocab)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk: expected a positive int or None, got {chunk!r}")
    h_s = student_hidden.reshape(-1, student_hidden.shape[-1])
    h_t = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).detach()
    n = h_s.shape[0]
    if n <= chunk:
        return _piece(h_s, h_t, student_head, teacher_head)
    total = h_s.new_zeros((), dtype=torch.float32)
    for start in range(0, n, chunk):
        args = (h_s[start:start + chunk], h_t[start:start + chunk], student_head, teacher_head)
        total = total + (checkpoint(_piece, *args, use_reentrant=False) if grad else _piece(*args))
    return total
