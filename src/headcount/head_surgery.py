"""Structural head surgery on ONE MultiHeadAttention module: prune_heads, merge_kv_heads.

Model-level surgery (pruning with compensation, K/V merging across a whole model, save / export)
lives in the `headcount.surgery` package, above models; this file stays below attention.

Removing a query head removes its Q rows from qkv_proj and its block of columns from o_proj — the
input of W_O, where the head writes. A KV head goes once no remaining query head reads it. Uneven
pruning across GQA groups (say group sizes 3, 2, 3) keeps an explicit query-head -> KV-head map
(`kv_head_of`, and the `kv_index` buffer the kernels gather with); the uniform case stays on the
fast path with no map. q_norm / k_norm (per head_dim, shared by every head) are left unchanged. A head's
sink logit (`sinks`, GPT-OSS) goes with the head.
Full-width q/k norms (norms.FullRMSNorm, OLMo 2) keep the weights of the heads kept; their statistics
then run over those heads only, so the heads left are normalised differently than before the removal
(an approximation: docs/models.md gives its measured size and why headcount accepts it).
"""

from __future__ import annotations

import torch
from torch import nn

from headcount.arguments import positive_int


def _uniform(kv_head_of: tuple[int, ...], n_kv_heads: int) -> bool:
    n_heads = len(kv_head_of)
    if n_heads % n_kv_heads:
        return False
    group = n_heads // n_kv_heads
    return all(kv == i // group for i, kv in enumerate(kv_head_of))


def _shrink_linear(linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> None:
    """Keep only the given output rows / input columns of a Linear, in place (new Parameters)."""
    with torch.no_grad():
        weight = linear.weight
        if rows is not None:
            weight = weight.index_select(0, rows)
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias.index_select(0, rows).clone(),
                                           requires_grad=linear.bias.requires_grad)
        if cols is not None:
            weight = weight.index_select(1, cols)
        linear.weight = nn.Parameter(weight.clone(), requires_grad=linear.weight.requires_grad)
    linear.out_features, linear.in_features = linear.weight.shape


def prune_heads(attn, heads) -> None:
    """Remove query heads `heads` (current indices) from `attn`, in place."""
    try:
        heads = sorted({int(h) for h in heads})
    except TypeError as err:
        raise TypeError(f"heads: expected an iterable of head indices, got {heads!r}") from err
    n_heads, n_kv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"heads: expected indices in [0, {n_heads}) (n_heads={n_heads}), got {bad}")
    if not heads:
        return
    keep = [h for h in range(n_heads) if h not in set(heads)]
    if not keep:
        raise ValueError(f"heads: cannot prune all {n_heads} heads of a layer; gate them to 0 "
                         "(head_gates) or drop the layer instead")
    used_kv = sorted({attn.kv_head_of[h] for h in keep})
    renumber = {old: new for new, old in enumerate(used_kv)}
    device = attn.qkv_proj.weight.device

    def head_rows(offset: int, indices: list[int]) -> list[int]:
        return [offset + i * dh + j for i in indices for j in range(dh)]

    rows = head_rows(0, keep) + head_rows(n_heads * dh, used_kv) + head_rows((n_heads + n_kv) * dh, used_kv)
    _shrink_linear(attn.qkv_proj, rows=torch.tensor(rows, device=device))
    _shrink_linear(attn.o_proj, cols=torch.tensor(head_rows(0, keep), device=device))
    sinks = getattr(attn, "sinks", None)
    if sinks is not None:  # [n_heads]: one logit per query head
        attn.sinks = nn.Parameter(sinks.detach()[keep].clone(), requires_grad=sinks.requires_grad)

    if getattr(attn.q_norm, "keep", None) is not None:  # full-width norms: the kept heads' weights
        attn.q_norm.keep(keep)
        attn.k_norm.keep(used_kv)
    attn.kv_head_of = tuple(renumber[attn.kv_head_of[h]] for h in keep)
    attn.kept_heads = tuple(attn.kept_heads[h] for h in keep)
    attn.n_heads, attn.n_kv_heads = len(keep), len(used_kv)
    attn.kv_index = None if _uniform(attn.kv_head_of, attn.n_kv_heads) else \
        torch.tensor(attn.kv_head_of, dtype=torch.long, device=device)


def merge_kv_heads(attn, n_kv_heads: int) -> None:
    """MHA -> GQA -> MQA: mean-pool each run of consecutive K/V heads into one, in place.

    The conversion GQA's authors use before uptraining (Ainslie et al. 2023, arXiv 2305.13245): KV
    head j of the result is the mean of old KV heads j*r .. j*r + r - 1 (r = old / new), and query
    head i then reads i // (n_heads // n_kv_heads) as usual. Exact when the pooled heads are equal;
    otherwise it is an approximation whose cost is what the user measures.

    With a k_norm (qk_norm_eps) the pooled K rows give the mean of the keys BEFORE the RMSNorm, which
    is not the mean of the normalised keys the heads attended with: one more approximation (still exact
    when the pooled heads are equal). k_norm, one weight shared by all heads, is kept as it is.
    """
    positive_int("n_kv_heads", n_kv_heads)
    if not attn.is_uniform:
        raise ValueError("n_kv_heads: merging needs uniform groups; this module was pruned unevenly "
                         f"(kv_head_of={attn.kv_head_of})")
    old = attn.n_kv_heads
    if old % n_kv_heads or n_kv_heads > old:
        raise ValueError(f"n_kv_heads: expected a divisor of the current n_kv_heads={old}, got {n_kv_heads}")
    if n_kv_heads == old:
        return
    nh, dh, r = attn.n_heads, attn.head_dim, old // n_kv_heads

    def pool(t: torch.Tensor) -> torch.Tensor:  # (old * dh, ...) -> (new * dh, ...)
        return t.unflatten(0, (n_kv_heads, r, dh)).mean(dim=1).flatten(0, 1)

    with torch.no_grad():
        w = attn.qkv_proj.weight
        q, k, v = w.split([nh * dh, old * dh, old * dh])
        attn.qkv_proj.weight = nn.Parameter(torch.cat([q, pool(k), pool(v)]).clone(),
                                            requires_grad=w.requires_grad)
        if attn.qkv_proj.bias is not None:
            b = attn.qkv_proj.bias
            qb, kb, vb = b.split([nh * dh, old * dh, old * dh])
            attn.qkv_proj.bias = nn.Parameter(torch.cat([qb, pool(kb), pool(vb)]).clone(),
                                              requires_grad=b.requires_grad)
    attn.qkv_proj.out_features = attn.qkv_proj.weight.shape[0]
    if getattr(attn.k_norm, "pool", None) is not None:  # a full-width k_norm: its weights pooled the same way
        attn.k_norm.pool(n_kv_heads)
    attn.n_kv_heads = n_kv_heads
    attn.kv_head_of = tuple(i // (nh // n_kv_heads) for i in range(nh))
