"""The losses head importance is measured with: one per model family.

    decoder (Decoder, has lm_head): next-token cross-entropy. `lm_nll(model, ids, head_gates)` ->
        [B] summed NLL (nats) of tokens 1..T-1 of each row; differentiable when grad is enabled.
    encoder (Encoder): embedding fidelity, as the model is used (sentence-transformers' recipe):
        `pooled(model, ids, mask, head_gates)` -> [B, d] L2-normalised mean-pooled embeddings;
        `fidelity(emb, ref)` -> [B] 1 - cos(emb, ref) against the unmodified model's embeddings.
        Its gradient is ZERO at the unmodified model (a minimum), so first-order scores say nothing
        there; the second-order (Gauss-Newton) term 1/2 ||d emb / d gate||^2 is what importance's
        "gradient" method estimates on an encoder, with random probes (see importance.py).
    scored_positions(ids, mask, decoder) -> [B, T] bool: the positions whose head outputs reach the
        loss (a decoder: all but the last, whose prediction is not scored; an encoder: real tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headcount.models.decoder import chunked_nll

Tensor = torch.Tensor



def is_decoder(model) -> bool:
    return hasattr(model, "lm_head")


def require_finite(t: Tensor, where: str, dtype: torch.dtype | None = None) -> Tensor:
    """t unchanged, or a ValueError when it holds inf / NaN: the calibration pass overflowed (fp16 activations
    past 65,504 are the usual cause). One vectorised sum, so the check costs ~nothing per layer.
    dtype: the model's weights' dtype, named in the message (default: t's)."""
    dtype = t.dtype if dtype is None else dtype
    if t.numel() and not bool(torch.isfinite(t.detach().sum())) and not bool(torch.isfinite(t.detach()).all()):
        hint = (" (fp16 overflows past 65,504: use --dtype bf16 or fp32)" if dtype == torch.float16 else "")
        raise ValueError(f"--dtype: the calibration pass holds inf/NaN at {where} in {dtype}{hint}; "
                         f"nothing was written")
    return t


def lm_nll(model, ids: Tensor, head_gates=None, *, replicas: int = 1) -> Tensor:
    """[B] float64 summed next-token NLL of tokens 1..T-1 of each row of ids [B, T].

    The logits are made a chunk of positions at a time (decoder.chunked_nll; with gradients each chunk is
    checkpointed): never a [B, T, vocab] tensor, which is 1.2 GiB per 2 x 512 tokens of Qwen2.5's vocabulary.
    replicas: the forward returns replicas x B rows (a hook repeated the batch inside the model, see
    importance._replicate_from); row r * B + b is scored against ids[b]: result [replicas * B]."""
    hidden = model(ids, head_gates=head_gates, compute_logits=False).hidden_states  # (B', T, d)
    ids = ids.repeat(replicas, 1) if replicas > 1 else ids
    return chunked_nll(hidden[:, :-1], ids[:, 1:], model.lm_head).double().sum(1)


def pooled(model, ids: Tensor, mask: Tensor, head_gates=None, *, replicas: int = 1) -> Tensor:
    """[B, d] L2-normalised mean-pooled sentence embeddings over real tokens ([replicas * B, d], see lm_nll)."""
    hidden = model(ids, mask, head_gates=head_gates).last_hidden_state
    m = (mask.repeat(replicas, 1) if replicas > 1 else mask).unsqueeze(-1).to(hidden.dtype)
    emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(emb, dim=-1)


def fidelity(emb: Tensor, ref: Tensor) -> Tensor:
    """[B] 1 - cosine similarity of (normalised) embeddings to the reference ones, float64."""
    return 1.0 - (emb.double() * ref.double()).sum(-1)


def scored_positions(ids: Tensor, mask: Tensor | None, decoder: bool) -> Tensor:
    """[B, T] bool: positions whose attention output reaches the loss."""
    if decoder:
        out = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
        out[:, -1] = False
        return out
    if mask is None:
        return torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    return mask.bool()
