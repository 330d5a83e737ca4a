"""HeadRMSNorm: the per-head query/key RMSNorm of Qwen3 and Gemma 3 (MultiHeadAttention's qk_norm_eps).

One weight of shape [head_dim], shared by every head, applied over the last dim of q [B, nh, T, dh] and
k [B, nkv, T, dh] after the heads are split and before rotary. The statistics are taken in float32
for half-precision inputs (float64 stays float64), then cast back to the input dtype.

Gemma stores its norm weights as w and multiplies by (1 + w); the loaders store 1 + w here, so this
module always multiplies by a plain weight.
"""

from __future__ import annotations

import torch
from torch import nn

Tensor = torch.Tensor


class HeadRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2, -1) + eps) * weight over the last dim (head_dim).

    cast_before_weight: False (default, Gemma 3's order) multiplies by the weight in float32 and casts
        the product; True (Qwen3's / Llama's order) casts the normalised x back first and multiplies in
        the input dtype. Identical in float32; differs by rounding in bf16 / fp16.
    """

    def __init__(self, head_dim: int, *, eps: float, cast_before_weight: bool = False, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim, device=device, dtype=dtype))
        self.eps = float(eps)
        self.cast_before_weight = bool(cast_before_weight)

    def forward(self, x: Tensor) -> Tensor:
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        x32 = x.to(compute)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.cast_before_weight:
            return self.weight * normed.to(x.dtype)
        return (normed * self.weight.to(compute)).to(x.dtype)

    def extra_repr(self) -> str:
        order = ", cast_before_weight=True" if self.cast_before_weight else ""
        return f"head_dim={self.weight.shape[0]}, eps={self.eps:g}{order}"


class FullRMSNorm(nn.Module):
    """OLMo 2's q/k norm: one RMSNorm over the WHOLE projection (n heads x head_dim), taken before the split
    into heads, applied here to the split tensor [B, n, T, head_dim]: the statistics run over (n, head_dim)
    jointly, the weight [n * head_dim] (transformers' layout, head-major) is read as [n, 1, head_dim].

    Every head's normalisation depends on every other head's values: removing a head (keep()) changes the
    statistics of the heads left (see head_surgery.prune_heads). Multiplies by the weight in float32 and
    casts the product (OLMo 2's order); cast_before_weight=True casts first, as HeadRMSNorm.
    """

    def __init__(self, n: int, head_dim: int, *, eps: float, cast_before_weight: bool = False, device=None,
                 dtype=None):
        super().__init__()
        self.head_dim = head_dim
        self.cast_before_weight = bool(cast_before_weight)
        # tensor parallelism (parallel/shard.py sets these on a shard): the per-token sum of squares of the
        # heads this rank counts (`own`, [n] 0/1; a KV head held by two ranks counts on one) is summed over
        # the ranks by `reduce` and divided by `total` (the unsharded width), so every rank's heads get the
        # unsharded statistics exactly
        self.reduce = None
        self.own: Tensor | None = None
        self.total: int | None = None
        self.weight = nn.Parameter(torch.ones(n * head_dim, device=device, dtype=dtype))
        self.eps = float(eps)

    @property
    def n(self) -> int:
        return self.weight.shape[0] // self.head_dim

    def forward(self, x: Tensor) -> Tensor:  # x [B, n, T, head_dim]
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        x32 = x.to(compute)
        if self.reduce is None:
            mean_sq = x32.pow(2).mean(dim=(1, 3), keepdim=True)
        else:
            sq = x32.pow(2)
            if self.own is not None:
                sq = sq * self.own.to(sq).view(1, -1, 1, 1)
            mean_sq = self.reduce(sq.sum(dim=(1, 3), keepdim=True)) / self.total
        normed = x32 * torch.rsqrt(mean_sq + self.eps)
        weight = self.weight.view(self.n, 1, self.head_dim)
        if self.cast_before_weight:
            return weight * normed.to(x.dtype)
        return (normed * weight.to(compute)).to(x.dtype)

    def keep(self, heads: list[int]) -> None:
        """Keep only these heads' weights (their statistics then run over the heads kept)."""
        with torch.no_grad():
            w = self.weight.view(self.n, self.head_dim)[torch.tensor(heads, device=self.weight.device)]
            self.weight = nn.Parameter(w.flatten().clone(), requires_grad=self.weight.requires_grad)

    def pool(self, n: int) -> None:
        """Mean-pool runs of consecutive heads' weights down to n heads (K/V merging)."""
        with torch.no_grad():
            w = self.weight.view(n, self.n // n, self.head_dim).mean(dim=1)
            self.weight = nn.Parameter(w.flatten().clone(), requires_grad=self.weight.requires_grad)

    def extra_repr(self) -> str:
        return f"n={self.n}, head_dim={self.head_dim}, eps={self.eps:g}, full width"
