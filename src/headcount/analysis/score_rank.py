"""rank(model, texts=None) -> RankResult: the numerical rank of each head's pre-softmax score matrix.

One head's scores S = Q_h K_h^T (n x n, after rotary, before the scale, mask and softmax) have rank
at most min(head_dim, n) (Bhojanapalli et al. 2020): below n = head_dim a head can be full rank,
above it cannot. Measured on real inputs at lengths below and above head_dim.

How: a forward hook (with kwargs) on the public `model.layers[i].attn` sees the layer's input x and the
`qk_transform` (rotary) of the call; Q and K are recomputed from the public qkv_proj in float64
(float64 weights and input), rotated by the same hook, and S is formed in float64 per query head with
the KV head it reads (GQA: `kv_head_of`). The model's own forward is untouched.

Tolerance: rank = #{singular values s_i > rtol * s_1} with rtol = n * eps(float32) (n the length,
eps(float32) = 2^-23): differences the model's float32 arithmetic cannot resolve do not count.
`rank_float64` (rtol = n * eps(float64)) is also kept: the exact bound, which must always hold.
Causal models: S is the full matrix (the causal mask is applied after it, and is not part of QK^T).
Per (head, length): the smallest rank over the windows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from headcount.analysis.batches import resolve_texts
from headcount.analysis.capturing import attention_modules, run_model

Tensor = torch.Tensor
EPS32 = float(torch.finfo(torch.float32).eps)
EPS64 = float(torch.finfo(torch.float64).eps)
TOLERANCE = "singular values > n * eps(float32) * s_max (eps(float32) = 2^-23 = 1.19e-07), QK^T in float64"


@dataclass
class RankResult:
    tolerance: str
    lengths: list[int]
    heads: list[dict]
    summary: list[dict]
    meta: dict = field(default_factory=dict)

    def to_json(self, *, meta: bool = False) -> dict:
        out = {"tolerance": self.tolerance, "lengths": self.lengths, "heads": self.heads, "summary": self.summary}
        if meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, data: dict) -> "RankResult":
        return cls(data["tolerance"], list(data["lengths"]), [dict(h) for h in data["heads"]],
                   [dict(s) for s in data["summary"]], dict(data.get("meta") or {}))


def numerical_rank(matrix: Tensor, rtol: float) -> int:
    """#{s_i > rtol * s_1} of a 2-D matrix (0 for the zero matrix)."""
    return rank_from_singular_values(torch.linalg.svdvals(matrix.double()), rtol)


def rank_from_singular_values(s: Tensor, rtol: float) -> int:
    """#{s_i > rtol * s_1} for singular values s in decreasing order."""
    if s.numel() == 0 or s[0] == 0:
        return 0
    return int((s > rtol * s[0]).sum())


def score_matrices(attn, x: Tensor, qk_transform=None) -> Tensor:
    """[B, n_heads, T, T] float64 Q K^T per query head (after the q/k norms and qk_transform), recomputed from
    qkv_proj."""
    nh, nkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w = attn.qkv_proj.weight.double()
    b = attn.qkv_proj.bias.double() if attn.qkv_proj.bias is not None else None
    batch, t, _ = x.shape
    qkv = F.linear(x.double(), w, b).view(batch, t, nh + 2 * nkv, dh)
    q = qkv[:, :, :nh].transpose(1, 2)
    k = qkv[:, :, nh:nh + nkv].transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:  # per-head q/k RMSNorm (Gemma 3, Qwen3), before rotary
        q, k = attn.q_norm(q), attn.k_norm(k)
    if qk_transform is not None:
        q, k = qk_transform(q, k)
    index = torch.tensor(attn.kv_head_of, device=k.device)
    return q.double() @ k.double().index_select(1, index).transpose(-1, -2)


def _windows(model, texts, length: int, max_windows: int) -> Tensor:
    from headcount.analysis.role_scores import window_batches
    from headcount.models.evaluation import token_stream
    stream = token_stream(model, resolve_texts(texts))
    if len(stream) < length:
        raise ValueError(f"texts: {len(stream)} tokens is too short for rank at length {length}; "
                         f"it needs at least {length} tokens")
    batches = window_batches(model, stream, window=length, max_tokens=length * max_windows, batch_size=max_windows,
                             min_tokens=length)
    return torch.cat(batches)[:max_windows]


def rank(model, texts: str | Sequence[str] | None = None, *, lengths: Sequence[int] | None = None,
         rtol: float | None = None, max_windows: int = 2, progress: bool = True, seed: int = 0) -> RankResult:
    """Numerical rank of every head's QK^T against min(head_dim, n) at each length (default: head_dim / 2
    and 2 * head_dim). texts=None = the calibration part of the default corpus.
    rtol: singular values > rtol * s_max count; None = n * eps(float32) at each length n.
    `seed` is unused (the result is deterministic) and accepted for a uniform interface."""
    if rtol is not None and (isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 < rtol < 1):
        raise ValueError(f"rtol: expected a relative tolerance in (0, 1) or None, got {rtol!r}")
    mods = attention_modules(model)
    head_dim = mods[0].head_dim
    if lengths is None:
        lengths = [max(2, head_dim // 2), 2 * head_dim]
    lengths = sorted({int(n) for n in lengths})
    limit = model.config.max_position
    for n in lengths:
        if n < 2 or n > limit:
            raise ValueError(f"lengths: expected lengths in 2..{limit} (the model's context), got {n}")
    if isinstance(max_windows, bool) or not isinstance(max_windows, int) or max_windows < 1:
        raise ValueError(f"max_windows: expected a positive int, got {max_windows!r}")
    from tqdm.auto import tqdm
    bar = tqdm(total=len(lengths), desc="rank", unit="length", file=sys.stderr, disable=not progress, leave=False)
    found: dict[tuple[int, int, int], tuple[int, int, float]] = {}
    was_training = model.training
    model.eval()
    try:
        for n in lengths:
            ids = _windows(model, texts, n, max_windows).to(next(model.parameters()).device)
            handles = []
            for li, attn in enumerate(mods):
                def hook(module, args, kwargs, output, _li=li):
                    x = args[0] if args else kwargs["x"]
                    s = score_matrices(module, x, kwargs.get("qk_transform"))
                    t = s.shape[-1]
                    sv = torch.linalg.svdvals(s)  # [B, H, T], one batched SVD per layer
                    tol = t * EPS32 if rtol is None else float(rtol)
                    for h in range(s.shape[1]):
                        r32 = min(rank_from_singular_values(sv[b, h], tol) for b in range(s.shape[0]))
                        r64 = min(rank_from_singular_values(sv[b, h], t * EPS64) for b in range(s.shape[0]))
                        found[(_li, h, t)] = (r32, r64, min(module.head_dim, t))
                handles.append(attn.register_forward_hook(hook, with_kwargs=True))
            try:
                with torch.no_grad():
                    run_model(model, ids, None)
            finally:
                for h in handles:
                    h.remove()
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    actual = sorted({t for (_, _, t) in found})
    heads = [{"layer": l, "head": h, "length": t, "rank": r32, "bound": bound, "rank_float64": r64}
             for (l, h, t), (r32, r64, bound) in sorted(found.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1]))]
    summary = []
    for t in actual:
        rs = [e for e in heads if e["length"] == t]
        ranks = [e["rank"] for e in rs]
        bound = rs[0]["bound"]
        summary.append({"length": t, "bound": bound, "mean_rank": round(sum(ranks) / len(ranks), 4),
                        "min_rank": min(ranks), "max_rank": max(ranks),
                        "share_at_bound": round(sum(r == bound for r in ranks) / len(ranks), 4),
                        "max_rank_float64": max(e["rank_float64"] for e in rs)})
    meta = {"model": getattr(model, "name", None), "head_dim": head_dim, "windows": max_windows,
            "matrix": "Q K^T per query head after rotary, before scale, mask and softmax; float64",
            "per_head": "the smallest rank over the windows",
            "rank_float64": "rank with rtol = n * eps(float64): the exact-arithmetic bound check"}
    tolerance = TOLERANCE if rtol is None else f"singular values > {float(rtol):g} * s_max, QK^T in float64"
    return RankResult(tolerance, actual, heads, summary, meta)
