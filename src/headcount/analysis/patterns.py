"""Role scores as pure functions of attention weights: [B, H, T, S] in, per-head sums out.

Every function returns sums (numerator, count) per head so batches accumulate exactly; the score is
their ratio. Nothing here runs a model.

Pattern scores (TransformerLens's head detector, error measure "mul"): for a 0/1 pattern P [B, T, S],
    score = sum(A * P) / sum(A)
with both sums over the query rows where P has support (TransformerLens sums over every row, which
caps e.g. the induction score at the share of repeated positions; restricting to rows that have a
target makes 1 mean "all of this head's weight sits on the pattern"). Padded queries are excluded.

    previous_token   P[t, t-1] = 1
    duplicate_token  P[i, j] = 1 where token j == token i, j != i (j < i for a causal model)
    induction        P[i, j] = 1 where token j-1 == token i, j-1 < i (attend to what followed the
                     earlier occurrence), on repeated random token sequences

Argmax scores (Voita et al. 2019): the key with the maximum weight (the first one on ties).
    positional       the share of query tokens whose argmax sits at the most common relative offset
    pointer hits     how often the argmax of a given query lands on a given target token
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def _as4(weights: Tensor) -> Tensor:
    if weights.dim() == 3:
        return weights.unsqueeze(0)
    if weights.dim() != 4:
        raise ValueError(f"weights: expected [B, H, T, S] or [H, T, S], got shape {list(weights.shape)}")
    return weights


def _query_mask(weights: Tensor, query_mask: Tensor | None) -> Tensor:
    b, _, t, _ = weights.shape
    if query_mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=weights.device)
    return query_mask.reshape(-1, t).expand(b, t).bool()


# ------------------------------------------------------------------------------------- patterns
def previous_token_pattern(tgt_len: int, src_len: int | None = None) -> Tensor:
    """[T, S] bool: query t -> key t-1 (aligned at the start: S == T for self-attention)."""
    src_len = tgt_len if src_len is None else src_len
    t = torch.arange(tgt_len)
    p = torch.zeros(tgt_len, src_len, dtype=torch.bool)
    ok = (t >= 1) & (t - 1 < src_len)
    p[t[ok], t[ok] - 1] = True
    return p


def duplicate_token_pattern(ids: Tensor, *, causal: bool = True) -> Tensor:
    """[B, T, T] bool: key j holds the same token as query i, j != i (and j < i when causal)."""
    ids = ids if ids.dim() == 2 else ids.unsqueeze(0)
    same = ids[:, :, None] == ids[:, None, :]
    n = ids.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril(-1) if causal else ~torch.eye(n, dtype=torch.bool)
    return same & allowed.to(ids.device)


def induction_pattern(ids: Tensor) -> Tensor:
    """[B, T, T] bool: key j where token j-1 == token i and j-1 < i (the token after an earlier copy)."""
    dup = duplicate_token_pattern(ids, causal=True)  # [B, i, j'] with j' < i
    out = torch.zeros_like(dup)
    out[:, :, 1:] = dup[:, :, :-1]  # j = j' + 1 <= i
    return out


def pattern_sums(weights: Tensor, pattern: Tensor, query_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(sum(A * P), sum(A)) per head [H] over the query rows where P has support (and query_mask).

    weights [B, H, T, S] (or [H, T, S]); pattern [T, S] or [B, T, S], bool or 0/1.
    """
    w = _as4(weights)
    b, h, t, s = w.shape
    p = pattern.to(w.device)
    p = p.reshape(-1, t, s).expand(b, t, s).to(w.dtype)
    rows = (p.sum(-1) > 0) & _query_mask(w, query_mask)  # [B, T]
    rows_f = rows.to(w.dtype)[:, None, :]  # [B, 1, T]
    num = ((w * p[:, None]).sum(-1) * rows_f).sum((0, 2))
    den = (w.sum(-1) * rows_f).sum((0, 2))
    return num.double().cpu(), den.double().cpu()


def pattern_score(weights: Tensor, pattern: Tensor, query_mask: Tensor | None = None) -> Tensor:
    """sum(A * P) / sum(A) per head [H] (0 where no row has a target)."""
    num, den = pattern_sums(weights, pattern, query_mask)
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


# ------------------------------------------------------------------------------------ argmaxes
def offset_counts(weights: Tensor, query_mask: Tensor | None = None) -> Tensor:
    """[H, 2S - 1] counts of (argmax key - query position) over the real queries; index o + S - 1."""
    w = _as4(weights)
    b, h, t, s = w.shape
    width = 2 * s - 1
    top = w.argmax(-1)  # [B, H, T]
    offsets = top - torch.arange(t, device=w.device)[None, None, :] + (s - 1)
    offsets = offsets + torch.arange(h, device=w.device)[None, :, None] * width  # one bincount for all heads
    q = _query_mask(w, query_mask)[:, None, :].expand(b, h, t)
    counts = torch.bincount(offsets[q].cpu(), minlength=h * width)
    return counts.view(h, width).double()


def positional_from_counts(counts: Tensor) -> tuple[Tensor, Tensor]:
    """(share at the most common offset [H], that offset [H]) from offset_counts (summed over batches)."""
    s = (counts.shape[1] + 1) // 2
    total = counts.sum(-1).clamp_min(1)
    best, index = counts.max(-1)
    return best / total, index - (s - 1)


def positional_score(weights: Tensor, query_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(share, offset) per head: the share of queries whose argmax sits at the most common offset."""
    return positional_from_counts(offset_counts(weights, query_mask))


def pointer_hits(weights: Tensor, queries: Tensor, groups: Tensor | None = None,
                 n_groups: int = 1) -> Tensor:
    """How many of the (batch, query, target) rows of `queries` [N, 3] have argmax == target, per head:
    [H], or [n_groups, H] when `groups` [N] assigns each row to a group (one pass for many relations)."""
    w = _as4(weights)
    h = w.shape[1]
    if queries.numel() == 0:
        out = torch.zeros(n_groups, h, dtype=torch.float64)
        return out if groups is not None else out[0]
    q = queries.to(w.device)
    top = w.argmax(-1)  # [B, H, T]
    hit = (top[q[:, 0], :, q[:, 1]] == q[:, 2:3]).double().cpu()  # [N, H]
    if groups is None:
        return hit.sum(0)
    return torch.zeros(n_groups, h, dtype=torch.float64).index_add_(0, groups.cpu(), hit)


def first_token_sums(weights: Tensor, query_mask: Tensor | None = None, *, min_position: int = 0) -> tuple[Tensor, Tensor]:
    """(sum of the weight on key 0, number of rows) per head, over real queries at positions >= min_position."""
    w = _as4(weights)
    b, h, t, _ = w.shape
    rows = _query_mask(w, query_mask).clone()
    rows[:, :min_position] = False
    num = (w[..., 0] * rows[:, None, :].to(w.dtype)).sum((0, 2))
    return num.double().cpu(), torch.full((h,), float(rows.sum()), dtype=torch.float64)
