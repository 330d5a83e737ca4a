"""Masks in one polarity: SDPA's. Boolean True = MAY attend; a float mask is ADDED to the scores.

WARNING for users coming from torch.nn.MultiheadAttention: it uses the OPPOSITE boolean polarity
(True = NOT allowed) for both attn_mask and key_padding_mask. `from_torch_mask` converts.

key_padding_mask here is [B, S] bool with True = a real token (may be attended to).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def from_torch_mask(mask: Tensor | None) -> Tensor | None:
    """Translate a torch.nn.MultiheadAttention mask (bool True = blocked) to headcount's polarity.

    Float masks are additive in both libraries and are returned unchanged.
    """
    if mask is None or mask.dtype != torch.bool:
        return mask
    return ~mask


def to_torch_mask(mask: Tensor | None) -> Tensor | None:
    """Translate a headcount bool mask (True = may attend) to torch.nn.MultiheadAttention's."""
    return from_torch_mask(mask)


def check_attn_mask(mask: Tensor, *, batch: int, n_heads: int, tgt_len: int, src_len: int, dtype: torch.dtype,
                    device: torch.device) -> Tensor:
    """Validate `attn_mask` and return it shaped to broadcast against [B, n_heads, T, S]."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attn_mask: expected a torch.Tensor (bool or float) or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask: expected dtype bool (True = may attend) or a float dtype (added to scores), "
                        f"got {mask.dtype}")
    if mask.is_floating_point() and mask.dtype != dtype:
        raise TypeError(f"attn_mask: a float mask must have the query dtype {dtype}, got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"attn_mask: expected device {device} (the input's), got {mask.device}")
    if mask.dim() == 2:
        ok = mask.shape == (tgt_len, src_len)
        mask4 = mask
    elif mask.dim() == 3:
        ok = mask.shape[0] in (1, batch) and mask.shape[1:] == (tgt_len, src_len)
        mask4 = mask.unsqueeze(1)
    elif mask.dim() == 4:
        ok = (mask.shape[0] in (1, batch) and mask.shape[1] in (1, n_heads)
              and mask.shape[2:] == (tgt_len, src_len))
        mask4 = mask
    else:
        ok, mask4 = False, mask
    if not ok:
        raise ValueError(
            f"attn_mask: expected shape [T, S], [B or 1, T, S] or [B or 1, n_heads or 1, T, S] with "
            f"B={batch}, n_heads={n_heads}, T={tgt_len}, S={src_len}; got {list(mask.shape)}")
    return mask4


def check_key_padding_mask(mask: Tensor, *, batch: int, src_len: int, device: torch.device) -> Tensor:
    """Validate `key_padding_mask` ([B, S] bool, True = real token) and return it as [B, 1, 1, S]."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"key_padding_mask: expected a bool torch.Tensor [B, S] or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask: expected dtype torch.bool (True = real token), got {mask.dtype}")
    if mask.shape != (batch, src_len):
        raise ValueError(f"key_padding_mask: expected shape [B, S] = [{batch}, {src_len}], got {list(mask.shape)}")
    if mask.device != device:
        raise ValueError(f"key_padding_mask: expected device {device} (the input's), got {mask.device}")
    return mask[:, None, None, :]


def causal_mask(tgt_len: int, src_len: int, device: torch.device | None = None) -> Tensor:
    """Bottom-right aligned causal mask [T, S]: query i (the (S - T + i)-th position) sees keys <= it.

    With S == T this is the usual lower triangle; with a KV cache (S > T) the new queries sit at the
    end of the sequence, which is what decoding needs (SDPA's is_causal aligns top-left instead).
    """
    q_pos = torch.arange(src_len - tgt_len, src_len, device=device)[:, None]
    k_pos = torch.arange(src_len, device=device)[None, :]
    return k_pos <= q_pos


def window_band(q_start: int, n_queries: int, k_start: int, n_keys: int, window: int, *, causal: bool,
                device: torch.device | None = None) -> Tensor:
    """Sliding-window mask [n_queries, n_keys] for queries at positions q_start.. and keys at k_start...

    causal: p - window < j <= p (transformers' sliding_window_causal_mask_function: kv_idx > q_idx -
        sliding_window AND kv_idx <= q_idx), so a query sees `window` keys, itself included.
    not causal: |p - j| < window (Gemma 3's bidirectional overlay, `abs(q_idx - kv_idx) < sliding_window`).
    """
    dist = (torch.arange(q_start, q_start + n_queries, device=device)[:, None]
            - torch.arange(k_start, k_start + n_keys, device=device)[None, :])  # query pos - key pos
    return (dist >= 0) & (dist < window) if causal else dist.abs() < window


def window_mask(tgt_len: int, src_len: int, window: int, *, causal: bool,
                device: torch.device | None = None) -> Tensor:
    """Bottom-right aligned sliding-window mask [T, S] (query i sits at position S - T + i), as causal_mask."""
    return window_band(src_len - tgt_len, tgt_len, 0, src_len, window, causal=causal, device=device)


def combine(*masks: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Combine masks into one that SDPA accepts: AND of bool masks; float masks are summed in.

    The result is bool if every input is bool, else float (blocked entries of bool masks -> -inf).
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    bools = [m for m in present if m.dtype == torch.bool]
    floats = [m for m in present if m.dtype != torch.bool]
    allowed = None
    for m in bools:
        allowed = m if allowed is None else allowed & m
    if not floats:
        return allowed
    total = floats[0]
    for m in floats[1:]:
        total = total + m
    if allowed is not None:
        total = torch.where(allowed, total, torch.tensor(float("-inf"), dtype=total.dtype, device=total.device))
    return total.to(dtype)
