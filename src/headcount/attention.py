"""MultiHeadAttention for MHA, GQA and MQA: project -> split heads -> attend -> merge -> gates -> W_O.

          n_heads query heads           n_kv_heads key/value heads
    MHA   q0 q1 q2 q3 q4 q5 q6 q7       k0 k1 k2 k3 k4 k5 k6 k7      n_kv_heads == n_heads
    GQA   q0 q1 q2 q3 q4 q5 q6 q7       k0    k1    k2    k3         1 < n_kv_heads < n_heads
    MQA   q0 q1 q2 q3 q4 q5 q6 q7       k0                           n_kv_heads == 1

Query head i reads KV head i // (n_heads // n_kv_heads) (the convention of SDPA, FlashAttention and
transformers), or `kv_head_of[i]` once uneven pruning has broken the groups.

Masks use SDPA's polarity: bool True = MAY attend, float = added to the scores.
!! torch.nn.MultiheadAttention uses the OPPOSITE bool polarity (True = blocked) !!
key_padding_mask is [B, S] bool with True = a real token.

Optional, per module: q/k RMSNorm per head (qk_norm_eps; Qwen3, Gemma 3) after the heads are split and
before qk_transform (rotary), and a sliding window (sliding_window; Gemma 3's local layers, Mistral)
with a KV cache that keeps only the window. S always counts every token seen, cached or evicted.
Per-head sink logits (sinks=True; GPT-OSS): `sinks` [n_heads] joins each head's softmax as a key with no
value (kernels.py says how the fused path keeps it); pruning a head removes its sink with it.
Also optional: q/k norms over the whole projection instead of each head (qk_norm_full; OLMo 2) and
attention-logit soft-capping (logit_softcap; Gemma 2), which runs the eager formula in query chunks
(kernels.py: SDPA's fused kernel cannot cap the scores).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from headcount import head_surgery, kernels, masks
from headcount.arguments import fraction, positive_float, positive_int
from headcount.cache import KVCache, SlidingKVCache
from headcount.norms import FullRMSNorm, HeadRMSNorm

Tensor = torch.Tensor
QKTransform = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


class AttentionOutput(NamedTuple):
    output: Tensor  # [B, T, d_model]
    weights: Tensor | None  # [B, n_heads, T, S] when need_weights, else None


# A wrong type is a TypeError here, a wrong value a ValueError (the module's contract since its first tests).
def _positive_int(name: str, value) -> int:
    return positive_int(name, value, type_error=TypeError)


def _check_sliding_window(value) -> int | None:
    return positive_int("sliding_window", value, none=True, type_error=TypeError,
                        expected="a positive int (tokens a query sees) or None")


def _check_qk_norm_eps(value) -> float | None:
    return positive_float("qk_norm_eps", value, none=True, type_error=TypeError,
                          expected="a positive finite float (the q/k RMSNorm epsilon) or None")


class MultiHeadAttention(nn.Module):
    """Multi-head attention with one fused qkv_proj and an o_proj (W_O).

    Args:
        d_model: model width.
        n_heads: query heads.
        n_kv_heads: key/value heads; None = n_heads (MHA), 1 = MQA, a divisor of n_heads = GQA.
        head_dim: width of each head; None = d_model // n_heads (must divide). When given,
            n_heads * head_dim may differ from d_model (GPT-3 XL: 24 x 128 on 2048); o_proj maps back.
        bias: bias on qkv_proj (and on o_proj unless o_bias says otherwise).
        o_bias: bias on o_proj; None = same as `bias` (Qwen2: bias=True, o_bias=False).
        dropout: attention-probability dropout in training mode.
        softmax_scale: multiplies Q K^T; None = 1 / sqrt(head_dim).
        qk_norm_eps: when set, RMSNorm each head's q and k over head_dim (q_norm, k_norm) before
            qk_transform and before K is cached; None = no norm (and no q_norm / k_norm parameters).
        sliding_window: when set, with is_causal query p attends keys p - sliding_window < j <= p; without,
            |p - j| < sliding_window (transformers' Mistral / Gemma 3 masks). Settable after construction.
        sinks: a learned sink logit per query head (`sinks` [n_heads], zeros) in every row's softmax.
        qk_norm_full: with qk_norm_eps, q_norm / k_norm are norms.FullRMSNorm over all heads' q (resp. k)
            together, weight [n_heads * head_dim] (resp. [n_kv_heads * head_dim]): OLMo 2.
        logit_softcap: scores -> logit_softcap * tanh(scores / logit_softcap) before the mask (Gemma 2);
            runs the eager formula in query chunks (kernels.attend), never SDPA's fused kernel.

    Parameters:
        qkv_proj: Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim); rows [all Q | all K | all V],
            each head a contiguous block of head_dim rows.
        o_proj: Linear(n_heads * head_dim, d_model); its block of columns i is head i's write address.
        q_norm, k_norm: HeadRMSNorm(head_dim) with weight [head_dim] (ones), shared by all heads; only
            when qk_norm_eps is set (else None).
    """

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, head_dim: int | None = None,
                 bias: bool = True, o_bias: bool | None = None, dropout: float = 0.0,
                 softmax_scale: float | None = None, qk_norm_eps: float | None = None,
                 sliding_window: int | None = None, sinks: bool = False, qk_norm_full: bool = False,
                 logit_softcap: float | None = None, device=None, dtype=None):
        super().__init__()
        _positive_int("d_model", d_model)
        _positive_int("n_heads", n_heads)
        n_kv_heads = n_heads if n_kv_heads is None else _positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={n_heads}, got {n_kv_heads}")
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"n_heads: expected a divisor of d_model={d_model} when head_dim is not given, "
                                 f"got {n_heads} (pass head_dim= to decouple them)")
            head_dim = d_model // n_heads
        _positive_int("head_dim", head_dim)
        fraction("dropout", dropout, include_low=True, expected="a probability in [0, 1)")
        positive_float("softmax_scale", softmax_scale, none=True)
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.dropout = float(dropout)
        self.softmax_scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias, **factory)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias if o_bias is None else o_bias, **factory)
        group = n_heads // n_kv_heads
        self.kv_head_of: tuple[int, ...] = tuple(i // group for i in range(n_heads))
        self.kept_heads: tuple[int, ...] = tuple(range(n_heads))  # original indices of the query heads left
        self.register_buffer("kv_index", None, persistent=False)  # [n_heads] long when groups are uneven
        eps = _check_qk_norm_eps(qk_norm_eps)
        if eps is not None and qk_norm_full:
            self.q_norm = FullRMSNorm(n_heads, head_dim, eps=eps, **factory)
            self.k_norm = FullRMSNorm(n_kv_heads, head_dim, eps=eps, **factory)
        else:
            self.q_norm = HeadRMSNorm(head_dim, eps=eps, **factory) if eps is not None else None
            self.k_norm = HeadRMSNorm(head_dim, eps=eps, **factory) if eps is not None else None
        self.logit_softcap = positive_float("logit_softcap", logit_softcap, none=True)
        self.sliding_window = sliding_window
        self.sinks = nn.Parameter(torch.zeros(n_heads, **factory)) if sinks else None

    @property
    def sliding_window(self) -> int | None:
        return self._sliding_window

    @sliding_window.setter
    def sliding_window(self, value: int | None) -> None:
        self._sliding_window = _check_sliding_window(value)

    # ----------------------------------------------------------------------------------------- info
    @property
    def is_uniform(self) -> bool:
        """True when query head i reads KV head i // (n_heads // n_kv_heads) (the fast path)."""
        return self.kv_index is None

    def extra_repr(self) -> str:
        kind = "MHA" if self.n_kv_heads == self.n_heads else ("MQA" if self.n_kv_heads == 1 else "GQA")
        extra = "" if self.is_uniform else f", kv_head_of={self.kv_head_of}"
        if self.q_norm is not None:
            extra += f", qk_norm(eps={self.q_norm.eps:g})"
        if self.sliding_window is not None:
            extra += f", sliding_window={self.sliding_window}"
        if self.sinks is not None:
            extra += ", sinks"
        if isinstance(self.q_norm, FullRMSNorm):
            extra += ", qk_norm over all heads"
        if self.logit_softcap is not None:
            extra += f", logit_softcap={self.logit_softcap:g}"
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads} ({kind}), "
                f"head_dim={self.head_dim}{extra}")

    # ----------------------------------------------------------------------------------------- cache
    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """A KVCache [batch_size, n_kv_heads, max_len, head_dim] on this module's device; with a
        sliding_window, a SlidingKVCache holding min(max_len, sliding_window) positions."""
        weight = self.qkv_proj.weight
        kw = {"dtype": dtype or weight.dtype, "device": weight.device, "owner": self}
        if self.sliding_window is not None:
            return SlidingKVCache(batch_size, max_len, self.n_kv_heads, self.head_dim, window=self.sliding_window,
                                  **kw)
        return KVCache(batch_size, max_len, self.n_kv_heads, self.head_dim, **kw)

    # ---------------------------------------------------------------------------------------- surgery
    def prune_heads(self, heads) -> None:
        """Remove query heads structurally (their Q rows and o_proj columns), and every KV head that no
        remaining query head reads. Indices refer to the current heads; `kept_heads` tracks originals."""
        head_surgery.prune_heads(self, heads)

    def merge_kv_heads(self, n_kv_heads: int) -> None:
        """MHA -> GQA -> MQA: mean-pool consecutive K/V heads down to n_kv_heads (see head_surgery.py)."""
        head_surgery.merge_kv_heads(self, n_kv_heads)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Copy a torch.nn.MultiheadAttention (its masks use the opposite bool polarity; see masks.py)."""
        from headcount.interop import from_torch
        return from_torch(cls, module)

    def to_torch(self) -> nn.MultiheadAttention:
        """A batch_first torch.nn.MultiheadAttention with the same weights (needs n_kv_heads == n_heads)."""
        from headcount.interop import to_torch
        return to_torch(self)

    # ---------------------------------------------------------------------------------------- forward
    def _check_input(self, name: str, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor [B, T, d_model], got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name}: expected rank 3 [B, T, d_model={self.d_model}], got shape {list(x.shape)}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{name}: expected last dim d_model={self.d_model}, got shape {list(x.shape)}")
        weight = self.qkv_proj.weight
        if x.dtype != weight.dtype:
            raise TypeError(f"{name}: expected dtype {weight.dtype} (the weights'), got {x.dtype}")
        if x.device != weight.device:
            raise ValueError(f"{name}: expected device {weight.device} (the weights'), got {x.device}")

    def _check_gates(self, gates, batch: int) -> Tensor:
        if not isinstance(gates, torch.Tensor) or not gates.is_floating_point():
            raise TypeError(f"head_gates: expected a float tensor [n_heads] or [B, n_heads], got "
                            f"{gates.dtype if isinstance(gates, torch.Tensor) else type(gates).__name__}")
        if gates.shape not in ((self.n_heads,), (batch, self.n_heads)):
            raise ValueError(f"head_gates: expected shape [{self.n_heads}] or [{batch}, {self.n_heads}] "
                             f"(n_heads={self.n_heads}), got {list(gates.shape)}")
        if gates.device != self.qkv_proj.weight.device:
            raise ValueError(f"head_gates: expected device {self.qkv_proj.weight.device}, got {gates.device}")
        return gates.reshape(-1, 1, self.n_heads, 1)  # (B or 1, 1, nh, 1) against (B, T, nh, dh)

    def forward(self, x: Tensor, context: Tensor | None = None, *, attn_mask: Tensor | None = None,
                key_padding_mask: Tensor | None = None, is_causal: bool = False, cache: KVCache | None = None,
                need_weights: bool = False, head_gates: Tensor | None = None,
                qk_transform: QKTransform | None = None) -> AttentionOutput:
        """Attend from x [B, T, d_model] over itself, or over `context` [B, S, d_model] (cross-attention).

        attn_mask: bool (True = may attend) or float (added), [T, S], [B, T, S] or [B, n_heads, T, S].
        key_padding_mask: [B, S] bool, True = a real token.
        is_causal: query t attends keys <= its position (bottom-right aligned, so it holds with a cache).
        cache: a KVCache from new_cache(); the new K/V are appended and everything cached is attended.
            S (masks, weights) counts every token seen, including those a SlidingKVCache has evicted.
        need_weights: take the eager path and return the weights [B, n_heads, T, S].
        head_gates: [n_heads] or [B, n_heads]; scales each head's context at the input of o_proj.
        qk_transform: hook for position encodings (rotary): (q [B, nh, T, dh], k [B, nkv, T, dh]) -> (q, k),
            applied to the new tokens before K is cached.
        """
        self._check_input("x", x)
        batch, tgt_len, _ = x.shape
        nh, nkv, dh = self.n_heads, self.n_kv_heads, self.head_dim
        if context is not None:
            if self.sliding_window is not None:
                raise ValueError(f"context: sliding_window={self.sliding_window} is a window over positions of "
                                 "one sequence (self-attention); it cannot be used with context=")
            self._check_input("context", context)
            if context.shape[0] != batch:
                raise ValueError(f"context: expected batch size {batch} (x's), got {context.shape[0]}")
            if cache is not None:
                raise ValueError("cache: a KVCache holds self-attention keys; it cannot be used with context=")
            new_len = context.shape[1]
        else:
            new_len = tgt_len
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache: expected a headcount.KVCache or None, got {type(cache).__name__}")
            cache.check(self, batch_size=batch, new_tokens=tgt_len)
            if cache.dtype != x.dtype:
                raise TypeError(f"cache: expected dtype {x.dtype} (x's), got a cache of {cache.dtype}")
        src_len = new_len + (cache.length if cache is not None else 0)
        # Validate everything before touching the cache, so an error leaves it as it was.
        mask = None
        if attn_mask is not None:
            mask = masks.check_attn_mask(attn_mask, batch=batch, n_heads=nh, tgt_len=tgt_len, src_len=src_len,
                                         dtype=x.dtype, device=x.device)
        if key_padding_mask is not None:
            kpm = masks.check_key_padding_mask(key_padding_mask, batch=batch, src_len=src_len, device=x.device)
            mask = masks.combine(mask, kpm, dtype=x.dtype)
        gates = self._check_gates(head_gates, batch) if head_gates is not None else None

        weight, bias = self.qkv_proj.weight, self.qkv_proj.bias
        if context is None:
            qkv = self.qkv_proj(x).view(batch, tgt_len, nh + 2 * nkv, dh)  # (B, T, nh + 2 nkv, dh)
            q = qkv[:, :, :nh].transpose(1, 2)  # (B, nh, T, dh)
            k = qkv[:, :, nh:nh + nkv].transpose(1, 2)  # (B, nkv, T, dh)
            v = qkv[:, :, nh + nkv:].transpose(1, 2)
        else:  # the same weight: Q rows on x, K/V rows on context (slices are views, no copy)
            nq = nh * dh
            q = F.linear(x, weight[:nq], None if bias is None else bias[:nq])
            q = q.view(batch, tgt_len, nh, dh).transpose(1, 2)  # (B, nh, T, dh)
            kv = F.linear(context, weight[nq:], None if bias is None else bias[nq:])
            kv = kv.view(batch, new_len, 2 * nkv, dh)  # (B, S, 2 nkv, dh)
            k, v = kv[:, :, :nkv].transpose(1, 2), kv[:, :, nkv:].transpose(1, 2)  # (B, nkv, S, dh)
        if self.q_norm is not None:  # per head, over head_dim: before rotary and before K is cached
            q, k = self.q_norm(q), self.k_norm(k)
        if qk_transform is not None:
            q_shape, k_shape = q.shape, k.shape
            q, k = qk_transform(q, k)
            if q.shape != q_shape or k.shape != k_shape:
                raise ValueError(f"qk_transform: must keep the shapes q {list(q_shape)}, k {list(k_shape)}; "
                                 f"returned q {list(q.shape)}, k {list(k.shape)}")
        held = None  # where the attended keys sit among the src_len positions; None = all, in order
        if cache is not None:
            k, v, held = cache.append_held(k, v)  # (B, nkv, S', dh); S' = src_len unless a window evicted some
            if held is not None and mask is not None:
                mask = mask[..., held]  # the columns of the keys held

        out, weights = kernels.attend(q, k, v, mask=mask, is_causal=is_causal, need_weights=need_weights,
                                      dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale,
                                      kv_index=self.kv_index, window=self.sliding_window, sinks=self.sinks,
                                      softcap=self.logit_softcap)
        if weights is not None and held is not None:  # evicted keys: weight 0, so weights stay [B, nh, T, S]
            full = weights.new_zeros(*weights.shape[:-1], src_len)
            full[..., held] = weights
            weights = full
        out = out.transpose(1, 2)  # (B, T, nh, dh)
        if gates is not None:
            out = out * gates.to(out.dtype)
        out = self.o_proj(out.reshape(batch, tgt_len, nh * dh))  # (B, T, d_model)
        return AttentionOutput(out, weights)
