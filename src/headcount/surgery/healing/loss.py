"""The distillation loss: KL(teacher || student) of next-token distributions, chunked over positions so no
[T, vocab] tensor is built for a large vocabulary (models.decoder.chunked_nll's budget).

    distill_kl(student_hidden [N, d], teacher_hidden [N, d], student_head, teacher_head) -> KL summed (float32)
    distill_kl(..., mask=[N] bool)       the sum over the rows where mask is True only (the others are no target)

Both hidden states are the decoders' final-norm outputs (Decoder(..., compute_logits=False).hidden_states),
one row per predicted position. The teacher's side carries no gradient.

Two paths, the same value and gradient:
- plain heads (both exactly nn.Linear without bias, every zoo decoder but Gemma 2's soft-capped and Granite's
  scaled heads): one pass per chunk computes both logits, the KL and, when a gradient is wanted, the gradient
  at once (d KL / d student logits = softmax(student) - softmax(teacher)), projected straight onto the
  student's hidden states and head weight (the fused linear-loss trick: no logits saved, none recomputed,
  so the healing step costs no more than a plain PyTorch step; docs/healing.md has the timing).
- any other head: each chunk's logits are recomputed in backward (torch.utils.checkpoint), so training holds
  one chunk of logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from headcount.arguments import positive_int
from headcount.models.decoder import LOGIT_ELEMENTS, LOGIT_ELEMENTS_GRAD

Tensor = torch.Tensor


def _piece(h_s: Tensor, h_t: Tensor, student_head, teacher_head) -> Tensor:
    # [n, vocab] rows: log-softmax over the last dim, in float32 whatever the weights' dtype
    with torch.no_grad():
        target = F.log_softmax(teacher_head(h_t).float(), dim=-1)
    student = F.log_softmax(student_head(h_s).float(), dim=-1)
    return F.kl_div(student, target, log_target=True, reduction="sum")


def _fused(h_s: Tensor, h_t: Tensor, w_s: Tensor, w_t: Tensor, chunk: int, want_h: bool, want_w: bool):
    """(KL summed over rows, d KL / d h_s or None, d KL / d w_s in float32 or None), chunk by chunk."""
    total = torch.zeros((), dtype=torch.float32, device=h_s.device)
    grad_h = torch.empty_like(h_s) if want_h else None
    grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device) if want_w else None
    for start in range(0, h_s.shape[0], chunk):
        hs, ht = h_s[start:start + chunk], h_t[start:start + chunk]
        target = F.log_softmax(F.linear(ht, w_t).float(), dim=-1)
        student = F.log_softmax(F.linear(hs, w_s).float(), dim=-1)
        p_t = target.exp()
        total += target.sub_(student).mul_(p_t).sum()  # F.kl_div(student, target, log_target=True), in place
        del target
        if want_h or want_w:
            g = student.exp_().sub_(p_t)  # d KL / d student logits: softmax(s) - softmax(t)
            del p_t
            if want_h:
                grad_h[start:start + chunk] = g.to(w_s.dtype) @ w_s
            if want_w:
                grad_w.addmm_(g.t(), hs.float())
    return total, grad_h, grad_w


class _FusedKL(torch.autograd.Function):
    """Sum of KL over rows for plain linear heads; the gradient is computed in forward (see the module doc)."""

    @staticmethod
    def forward(ctx, h_s: Tensor, h_t: Tensor, w_s: Tensor, w_t: Tensor, chunk: int) -> Tensor:
        total, grad_h, grad_w = _fused(h_s, h_t, w_s, w_t, chunk, ctx.needs_input_grad[0], ctx.needs_input_grad[2])
        ctx.save_for_backward(grad_h, grad_w)
        ctx.w_dtype = w_s.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return (None if grad_h is None else grad_h * grad_out.to(grad_h.dtype), None,
                None if grad_w is None else (grad_w * grad_out).to(ctx.w_dtype), None, None)


def _plain(head) -> bool:
    return type(head) is torch.nn.Linear and head.bias is None


def distill_kl(student_hidden: Tensor, teacher_hidden: Tensor, student_head, teacher_head=None, *,
               chunk: int | None = None, mask: Tensor | None = None) -> Tensor:
    """Sum over rows of KL(softmax(teacher_head(teacher_hidden)) || softmax(student_head(student_hidden))), nats.

    student_hidden, teacher_hidden: [..., d_model] with the same leading shape. teacher_head defaults to the
    student's (a pruned model shares its lm_head with its teacher). chunk: rows at a time (None = the
    chunked_nll budget: LOGIT_ELEMENTS // vocab rows, a quarter of that with gradients or fused); plain linear heads
    take the fused path (see the module doc), any other head is checkpointed chunk by chunk. mask: a bool tensor
    of the hidden states' leading shape; only the rows where it is True are summed (the others are selected away
    before any logit is computed: no value and no gradient from them)."""
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(f"teacher_hidden: expected the student's leading shape {list(student_hidden.shape[:-1])}, "
                         f"got {list(teacher_hidden.shape[:-1])}")
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape != student_hidden.shape[:-1]:
            raise ValueError(f"mask: expected a bool tensor of shape {list(student_hidden.shape[:-1])}, got "
                             f"{mask.dtype} {list(mask.shape)}")
        mask = mask.to(student_hidden.device)
        student_hidden, teacher_hidden = student_hidden[mask], teacher_hidden[mask]  # [n_true, d] each
    teacher_head = student_head if teacher_head is None else teacher_head
    vocab = student_head.weight.shape[0]
    grad = torch.is_grad_enabled() and (student_hidden.requires_grad
                                        or any(p.requires_grad for p in student_head.parameters()))
    fused = _plain(student_head) and _plain(teacher_head)
    if positive_int("chunk", chunk, none=True) is None:  # the fused path holds ~3 fp32 [chunk, vocab] tensors
        chunk = max(1, (LOGIT_ELEMENTS_GRAD if grad or fused else LOGIT_ELEMENTS) // vocab)  # with or without grad
    h_s = student_hidden.reshape(-1, student_hidden.shape[-1])
    h_t = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).detach()
    if fused:
        w_t = teacher_head.weight.detach()
        if not grad:
            with torch.no_grad():
                return _fused(h_s, h_t, student_head.weight, w_t, chunk, False, False)[0]
        return _FusedKL.apply(h_s, h_t, student_head.weight, w_t, chunk)
    n = h_s.shape[0]
    if n <= chunk:
        return _piece(h_s, h_t, student_head, teacher_head)
    total = h_s.new_zeros((), dtype=torch.float32)
    for start in range(0, n, chunk):
        args = (h_s[start:start + chunk], h_t[start:start + chunk], student_head, teacher_head)
        total = total + (checkpoint(_piece, *args, use_reentrant=False) if grad else _piece(*args))
    return total

