"""attend(): the two paths behind one forward.

- fused: F.scaled_dot_product_attention. No n x n tensor is materialised where torch has a fused
  kernel (on CPU it does, for fp32/bf16/fp16). Weights are not available.
- eager: explicit softmax(Q K^T * scale + mask) V, softmax in fp32 for fp16/bf16. Returns weights.

Sliding window (`window=`): a band of keys around each query, bottom-right aligned like is_causal.
The eager path folds it into its [T, S] mask. The fused path passes SDPA a boolean band mask; when the
sequence is long against the window it walks the queries in chunks, each chunk attending only the
keys its band can reach, so the mask is [chunk, chunk + window - 1] (not [T, S]) and the work is
O(T * window) instead of O(T * S).

Both: GQA grouping (query head i reads KV head kv_index[i]; uniform grouping i // (n_heads //
n_kv_heads) never copies K/V), and a query row whose keys are all masked gives exactly 0 output and
0 gradient, never NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headcount.masks import causal_mask, combine, window_band, window_mask

Tensor = torch.Tensor

def _sdpa_has_gqa() -> bool:
    """torch >= 2.5 takes enable_gqa; older releases need K/V repeated per query head. SDPA is a
    builtin with no inspectable signature, so ask it."""
    x = torch.zeros(1, 2, 1, 1)
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        return True
    except TypeError:
        return False


_SDPA_HAS_GQA = _sdpa_has_gqa()


def _expand_kv(k: Tensor, v: Tensor, n_heads: int, kv_index: Tensor | None) -> tuple[Tensor, Tensor]:
    """K/V with one head per query head: gather by kv_index (uneven groups) or repeat (uniform)."""
    if kv_index is not None:
        return k.index_select(1, kv_index), v.index_select(1, kv_index)
    group = n_heads // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def attend(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
           need_weights: bool = False, dropout_p: float = 0.0, scale: float | None = None,
           kv_index: Tensor | None = None, window: int | None = None) -> tuple[Tensor, Tensor | None]:
    """Attention for q [B, nh, T, dh] over k, v [B, nkv, S, dh] -> ([B, nh, T, dh], weights or None).

    mask: bool (True = may attend) or float (added), broadcastable to [B, nh, T, S].
    is_causal: bottom-right aligned (query t sits at position S - T + t), right for a KV cache.
    kv_index: [nh] long tensor mapping query head -> KV head when groups are uneven; None = uniform.
    window: sliding window (masks.window_band): with is_causal, query p sees keys p - window < j <= p;
        without, |p - j| < window. Key j sits at position j, query t at S - T + t.
    """
    tgt_len, src_len = q.shape[2], k.shape[2]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if window is not None and window >= src_len:
        window = None  # the band reaches every key: plain (causal) attention
    if window is not None:
        chunk = 0 if need_weights else _chunk_size(tgt_len, src_len, window, is_causal)
        if chunk:
            return _fused_windowed(q, k, v, mask, is_causal, dropout_p, scale, kv_index, window, chunk), None
        mask = combine(mask, window_mask(tgt_len, src_len, window, causal=is_causal, device=q.device), dtype=q.dtype)
        is_causal = False  # the band already holds causality
    if is_causal and tgt_len == 1:
        is_causal = False  # one query at the last position sees every key: no mask to build
    if is_causal and (mask is not None or tgt_len != src_len or need_weights):
        mask = combine(mask, causal_mask(tgt_len, src_len, q.device), dtype=q.dtype)
        is_causal = False
    if need_weights:
        return _eager(q, k, v, mask, is_causal, dropout_p, scale, kv_index)
    return _fused(q, k, v, mask, is_causal, dropout_p, scale, kv_index), None


def _fused(q, k, v, mask, is_causal, dropout_p, scale, kv_index) -> Tensor:
    n_heads, n_kv = q.shape[1], k.shape[1]
    gqa = False
    if kv_index is not None or (n_kv != n_heads and not _SDPA_HAS_GQA):
        k, v = _expand_kv(k, v, n_heads, kv_index)
    elif n_kv != n_heads:
        gqa = True
    kwargs = {"enable_gqa": True} if gqa else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale, **kwargs)


# Queries per chunk on the windowed fused path: at least the window, and never so few that the
# per-call overhead of SDPA dominates.
_MIN_CHUNK = 256


def _chunk_size(tgt_len: int, src_len: int, window: int, causal: bool) -> int:
    """Queries per chunk for the windowed fused path, or 0 when one call with a [T, S] mask is cheaper:
    chunk only when it at least halves the keys each query scans."""
    chunk = max(window, _MIN_CHUNK)
    keys_per_chunk = chunk + (window - 1) * (1 if causal else 2)
    return chunk if tgt_len > chunk and 2 * keys_per_chunk <= src_len else 0


def _fused_windowed(q, k, v, mask, causal, dropout_p, scale, kv_index, window, chunk) -> Tensor:
    """The fused path over query chunks: chunk [a, b) attends keys [lo, hi), the only ones its band
    reaches, with a [b - a, hi - lo] band mask (and the matching slice of `mask`)."""
    tgt_len, src_len = q.shape[2], k.shape[2]
    offset = src_len - tgt_len  # position of query 0
    outs = []
    for a in range(0, tgt_len, chunk):
        b = min(a + chunk, tgt_len)
        lo = max(0, offset + a - window + 1)
        hi = offset + b if causal else min(src_len, offset + b - 1 + window)
        band = window_band(offset + a, b - a, lo, hi - lo, window, causal=causal, device=q.device)
        part = None
        if mask is not None:  # [..., T or 1, S]
            part = mask[..., a:b, lo:hi] if mask.shape[-2] != 1 else mask[..., lo:hi]
        outs.append(_fused(q[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], combine(part, band, dtype=q.dtype),
                           False, dropout_p, scale, kv_index))
    return torch.cat(outs, dim=2)  # (B, nh, T, dh)


def _eager(q, k, v, mask, is_causal, dropout_p, scale, kv_index) -> tuple[Tensor, Tensor]:
    batch, n_heads, tgt_len, head_dim = q.shape
    if kv_index is not None:
        k, v = _expand_kv(k, v, n_heads, kv_index)
    n_kv = k.shape[1]
    group = n_heads // n_kv
    # Grouped matmul: (B, nkv, g, T, dh) @ (B, nkv, 1, dh, S) -> (B, nkv, g, T, S); no K/V copy.
    qg = q.unflatten(1, (n_kv, group))
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)  # (B, nh, T, S)
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()  # softmax in fp32 for half precision
    # In-place from here to the softmax: none of these ops needs its input for backward, and each
    # out-of-place copy would be one more n x n tensor (the eager path holds scores + weights only).
    scores.mul_(scale)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
        # Rows with no key allowed: softmax would give 0/0. Give them zeros, with a NaN-free backward
        # (softmax of a finite row, then zeroed), instead of the NaN nn.MultiheadAttention returns.
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill_(dead, 0.0), dim=-1)
        weights = weights.masked_fill(dead, 0.0) if weights.requires_grad else weights.masked_fill_(dead, 0.0)
    else:
        weights = torch.softmax(scores, dim=-1)
    weights = weights.to(q.dtype)
    probs = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = torch.matmul(probs.unflatten(1, (n_kv, group)), v.unsqueeze(2)).flatten(1, 2)  # (B, nh, T, dh)
    return out, weights
