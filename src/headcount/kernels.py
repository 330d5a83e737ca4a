"""attend(): the two paths behind one forward.

- fused: F.scaled_dot_product_attention. No n x n tensor is materialised where torch has a fused
  kernel (on CPU it does, for fp32/bf16/fp16). Weights are not available.
- eager: explicit softmax(Q K^T * scale + mask) V, softmax in fp32 for fp16/bf16. Returns weights.

Sliding window (`window=`): a band of keys around each query, bottom-right aligned like is_causal.
The eager path folds it into its [T, S] mask. The fused path passes SDPA a boolean band mask; when the
sequence is long against the window it walks the queries in chunks, each chunk attending only the
keys its band can reach, so the mask is [chunk, chunk + window - 1] (not [T, S]) and the work is
O(T * window) instead of O(T * S).

Per-head sink logits (`sinks=`, GPT-OSS): a learned logit per head joins every row of scores in the
softmax and is dropped after, so a row's weights sum to less than 1. The eager path appends the sink
as one more column. The fused path cannot (SDPA has no sink) and uses the log-sum-exp identity

    out_with_sink = out_fused * sigmoid(L - sink),    L = logsumexp of the row's (masked) scores,

because softmax-with-sink = softmax * Z / (Z + e^sink) with Z = e^L. L comes from the CPU flash kernel
(aten._scaled_dot_product_flash_attention_for_cpu returns it beside the output) when no gradient is
needed; otherwise (and off the CPU) from _logsumexp, which walks the queries in chunks so at most
[chunk, S] scores exist at once (never [T, S] for a long T), and is differentiable.
Logit soft-capping (`softcap=`, Gemma 2: scores -> softcap * tanh(scores / softcap) after the scale, before
the mask): SDPA's fused kernel cannot apply a function to the scores, so a soft-capped attention always
runs the eager formula. Without need_weights it runs it over query chunks (`_capped`): each chunk's scores
are [B, nh, chunk, keys] with chunk sized to a budget (CAPPED_ELEMENTS), causal chunks reading only the
keys up to their last query and windowed chunks only their band, so a long input never holds [T, S] scores.

Both: GQA grouping (query head i reads KV head kv_index[i]; uniform grouping i // (n_heads //
n_kv_heads) never copies K/V), and a query row whose keys are all masked gives exactly 0 output and
0 gradient, never NaN. Uneven groups (a pruned GQA layer: 6 + 5 query heads over 2 K/V heads) on the fused
path with no gradient run one SDPA call per K/V head over its query heads (`_grouped`), so decoding never
copies the cache per query head; with a gradient K/V are gathered per query head, since CPU SDPA's
enable_gqa backward is several times slower than the gathered one.
"""

from __future__ import annotations

import functools

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
           kv_index: Tensor | None = None, window: int | None = None,
           sinks: Tensor | None = None, softcap: float | None = None) -> tuple[Tensor, Tensor | None]:
    """Attention for q [B, nh, T, dh] over k, v [B, nkv, S, dh] -> ([B, nh, T, dh], weights or None).

    mask: bool (True = may attend) or float (added), broadcastable to [B, nh, T, S].
    is_causal: bottom-right aligned (query t sits at position S - T + t), right for a KV cache.
    kv_index: [nh] long tensor mapping query head -> KV head when groups are uneven; None = uniform.
    window: sliding window (masks.window_band): with is_causal, query p sees keys p - window < j <= p;
        without, |p - j| < window. Key j sits at position j, query t at S - T + t.
    sinks: [nh] per-head sink logits (in the scores' units, after the scale): each joins its head's softmax
        as one more key with no value (see the module doc).
    softcap: scores -> softcap * tanh(scores / softcap) before the mask (the eager formula, in query chunks).
    """
    tgt_len, src_len = q.shape[2], k.shape[2]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if window is not None and window >= src_len:
        window = None  # the band reaches every key: plain (causal) attention
    if window is not None:
        chunk = 0 if need_weights else _chunk_size(tgt_len, src_len, window, is_causal)
        if chunk:
            return _fused_windowed(q, k, v, mask, is_causal, dropout_p, scale, kv_index, window, chunk, sinks,
                                   softcap), None
        mask = combine(mask, window_mask(tgt_len, src_len, window, causal=is_causal, device=q.device), dtype=q.dtype)
        is_causal = False  # the band already holds causality
    if is_causal and tgt_len == 1:
        is_causal = False  # one query at the last position sees every key: no mask to build
    if is_causal and (mask is not None or tgt_len != src_len or need_weights):
        mask = combine(mask, causal_mask(tgt_len, src_len, q.device), dtype=q.dtype)
        is_causal = False
    if need_weights:
        return _eager(q, k, v, mask, is_causal, dropout_p, scale, kv_index, sinks, softcap)
    return _fused(q, k, v, mask, is_causal, dropout_p, scale, kv_index, sinks, softcap), None


# The soft-capped path's budget: scores of at most this many elements per query chunk (64 MiB of fp32).
CAPPED_ELEMENTS = 1 << 24


def _capped(q, k, v, mask, is_causal, dropout_p, scale, kv_index, softcap, sinks=None) -> Tensor:
    """The eager formula with soft-capped scores over query chunks: chunk [a, b) reads keys [0, hi),
    hi = its last query's position + 1 when causal (the keys it may see), else every key."""
    batch, n_heads, tgt_len, _ = q.shape
    src_len = k.shape[2]
    offset = src_len - tgt_len  # position of query 0
    chunk = max(1, min(tgt_len, CAPPED_ELEMENTS // max(1, batch * n_heads * src_len)))
    outs = []
    for a in range(0, tgt_len, chunk):
        b = min(a + chunk, tgt_len)
        hi = offset + b if is_causal else src_len
        part = None
        if mask is not None:  # [..., T or 1, S]
            part = mask[..., a:b, :hi] if mask.shape[-2] != 1 else mask[..., :hi]
        if is_causal:
            part = combine(part, window_band(offset + a, b - a, 0, hi, hi + 1, causal=True, device=q.device),
                           dtype=q.dtype)
        outs.append(_eager(q[:, :, a:b], k[:, :, :hi], v[:, :, :hi], part, False, dropout_p, scale, kv_index,
                           sinks, softcap)[0])
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, nh, T, dh)


def _fused(q, k, v, mask, is_causal, dropout_p, scale, kv_index, sinks=None, softcap=None) -> Tensor:
    if softcap is not None:  # SDPA cannot cap the scores: the eager formula, in query chunks
        return _capped(q, k, v, mask, is_causal, dropout_p, scale, kv_index, softcap, sinks)
    if sinks is not None:
        return _fused_with_sinks(q, k, v, mask, is_causal, dropout_p, scale, kv_index, sinks)
    n_heads, n_kv = q.shape[1], k.shape[1]
    if kv_index is not None and _SDPA_HAS_GQA and not (torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad)):
        return _grouped(q, k, v, mask, is_causal, dropout_p, scale, kv_index)
    gqa = False
    if kv_index is not None or (n_kv != n_heads and not _SDPA_HAS_GQA):
        k, v = _expand_kv(k, v, n_heads, kv_index)
    elif n_kv != n_heads:
        gqa = True
    kwargs = {"enable_gqa": True} if gqa else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale, **kwargs)


def _grouped(q, k, v, mask, is_causal, dropout_p, scale, kv_index) -> Tensor:
    """Uneven groups without copying K/V: the query heads of each K/V head (gathered when they are not
    contiguous) attend that one head through SDPA's enable_gqa, and the outputs return to head order."""
    order, inverse, spans = _group_plan(tuple(kv_index.tolist()), q.device)
    per_head = mask is not None and mask.dim() == 4 and mask.shape[1] != 1  # a per-head mask follows its head
    if order is not None:
        q = q.index_select(1, order)
        if per_head:
            mask = mask.index_select(1, order)
    outs = [F.scaled_dot_product_attention(q[:, a:b], k[:, g:g + 1], v[:, g:g + 1],
                                           attn_mask=mask[:, a:b] if per_head else mask, dropout_p=dropout_p,
                                           is_causal=is_causal, scale=scale, enable_gqa=True)
            for g, a, b in spans]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (B, nh, T, dh), grouped order
    return out if inverse is None else out.index_select(1, inverse)


@functools.lru_cache(maxsize=64)  # a model has a few distinct maps, and every decode step asks again
def _group_plan(heads: tuple[int, ...], device) -> tuple[Tensor | None, Tensor | None, tuple]:
    """(the query heads sorted by K/V head, stable, or None when already sorted; its inverse permutation;
    (K/V head, first, end) spans of the sorted heads)."""
    order = sorted(range(len(heads)), key=heads.__getitem__)
    spans, start = [], 0
    for g in sorted(set(heads)):
        n = heads.count(g)
        spans.append((g, start, start + n))
        start += n
    if order == list(range(len(heads))):
        return None, None, tuple(spans)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return (torch.tensor(order, device=device), torch.tensor(inverse, device=device), tuple(spans))


# Queries per chunk on the windowed fused path: at least the window, and never so few that the
# per-call overhead of SDPA dominates.
_MIN_CHUNK = 256


def _chunk_size(tgt_len: int, src_len: int, window: int, causal: bool) -> int:
    """Queries per chunk for the windowed fused path, or 0 when one call with a [T, S] mask is cheaper:
    chunk only when it at least halves the keys each query scans."""
    chunk = max(window, _MIN_CHUNK)
    keys_per_chunk = chunk + (window - 1) * (1 if causal else 2)
    return chunk if tgt_len > chunk and 2 * keys_per_chunk <= src_len else 0


def _fused_windowed(q, k, v, mask, causal, dropout_p, scale, kv_index, window, chunk, sinks=None,
                    softcap=None) -> Tensor:
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
                           False, dropout_p, scale, kv_index, sinks, softcap))
    return torch.cat(outs, dim=2)  # (B, nh, T, dh)


# Scores per _logsumexp chunk (per batch row and head): queries per chunk = this // S, at least 1.
LSE_ELEMENTS = 1 << 18


def _float_mask(mask: Tensor | None, dtype) -> Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _logsumexp(q, k, mask, is_causal, scale, kv_index) -> Tensor:
    """L [B, nh, T] (float32): logsumexp over keys of each row's scaled, masked scores, the queries taken
    LSE_ELEMENTS // S at a time (at most [chunk, S] scores per head at once; causal: only the keys up to the
    chunk's last query). -inf for a row with no key (with a mask), its gradient kept finite."""
    batch, n_heads, tgt_len, _ = q.shape
    src_len = k.shape[2]
    if kv_index is not None:
        k = k.index_select(1, kv_index)
    n_kv = k.shape[1]
    group = n_heads // n_kv
    kt = k.float().transpose(-1, -2).unsqueeze(2)  # (B, nkv, 1, dh, S)
    qs = (q.float() * scale).unflatten(1, (n_kv, group))  # (B, nkv, g, T, dh)
    offset = src_len - tgt_len  # query t sits at position offset + t (bottom-right, as is_causal)
    chunk = max(1, LSE_ELEMENTS // max(1, src_len))
    parts = []
    for a in range(0, tgt_len, chunk):
        b = min(a + chunk, tgt_len)
        hi = offset + b if is_causal else src_len  # keys past the chunk's last query: never seen
        scores = torch.matmul(qs[..., a:b, :], kt[..., :hi]).flatten(1, 2)  # (B, nh, b - a, hi)
        if is_causal:  # only the last (b - a) keys can lie past a query of the chunk: mask that block in place
            c = min(b - a, hi)
            future = torch.ones(b - a, c, dtype=torch.bool, device=q.device).triu_(c - (b - a) + 1)
            scores[..., hi - c:].masked_fill_(future, float("-inf"))
        if mask is None:
            top = scores.amax(dim=-1, keepdim=True).detach()  # L = m + log sum exp(s - m), for any m
            parts.append((scores - top).exp_().sum(dim=-1).log_() + top.squeeze(-1))
            continue
        part = mask[..., a:b, :hi] if mask.shape[-2] != 1 else mask[..., :hi]
        scores = scores.masked_fill(~part, float("-inf")) if part.dtype == torch.bool else scores + part.float()
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
        lse = torch.logsumexp(scores.masked_fill(dead, 0.0), dim=-1)  # finite rows only: a NaN-free backward
        parts.append(lse.masked_fill(dead.squeeze(-1), float("-inf")))
    return torch.cat(parts, dim=2)


def _fused_with_sinks(q, k, v, mask, is_causal, dropout_p, scale, kv_index, sinks) -> Tensor:
    """SDPA's output times sigmoid(L - sink) per row (module doc): the sink's share taken out."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, sinks))
    if q.device.type == "cpu" and not grad and dropout_p == 0.0:
        kf, vf = (k, v) if k.shape[1] == q.shape[1] and kv_index is None else _expand_kv(k, v, q.shape[1], kv_index)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, kf, vf, 0.0, is_causal, attn_mask=_float_mask(mask, q.dtype), scale=scale)
        # the kernel gives L = 0 and output 0 for a row with no key: the product stays 0
    else:
        out = _fused(q, k, v, mask, is_causal, dropout_p, scale, kv_index)
        lse = _logsumexp(q, k, mask, is_causal, scale, kv_index)
    share = torch.sigmoid(lse - sinks.float().view(1, -1, 1))  # (B, nh, T): 1 - the sink's weight
    return out * share.unsqueeze(-1).to(out.dtype)


def _eager(q, k, v, mask, is_causal, dropout_p, scale, kv_index, sinks=None, softcap=None) -> tuple[Tensor, Tensor]:
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
    if softcap is not None:  # Gemma 2: softcap * tanh(scores / softcap), before the mask
        if scores.requires_grad:  # tanh's backward needs its output: no in-place op on it
            scores = torch.tanh(scores / softcap) * softcap
        else:
            scores.div_(softcap).tanh_().mul_(softcap)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
        # Rows with no key allowed: softmax would give 0/0. Give them zeros, with a NaN-free backward
        # (softmax of a finite row, then zeroed), instead of the NaN nn.MultiheadAttention returns.
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
        weights = _softmax(scores.masked_fill_(dead, 0.0), sinks)
        weights = weights.masked_fill(dead, 0.0) if weights.requires_grad else weights.masked_fill_(dead, 0.0)
    else:
        weights = _softmax(scores, sinks)
    weights = weights.to(q.dtype)
    probs = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = torch.matmul(probs.unflatten(1, (n_kv, group)), v.unsqueeze(2)).flatten(1, 2)  # (B, nh, T, dh)
    return out, weights


def _softmax(scores: Tensor, sinks: Tensor | None) -> Tensor:
    """softmax over the last dim; with sinks [nh], over [scores | sink] with the sink's column dropped after."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    b, nh, t, _ = scores.shape
    column = sinks.to(scores.dtype).view(1, nh, 1, 1).expand(b, nh, t, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
