"""The chapter's formula, head by head: the truth the tests compare against.

    MultiHead(X) = Concat(head_1, ..., head_nh) W_O
    head_i       = softmax(Q_i K_j^T / sqrt(d_k) + mask) V_j,   Q_i = X W_i^Q, K_j = C W_j^K, V_j = C W_j^V

with n_heads separate matrices W_i^Q, W_i^K, W_i^V in R^{d_model x d_k} (the chapter's orientation:
X on the left), j = the KV head query head i reads, and an explicit Concat. Written for clarity,
with a Python loop over heads; nothing here is fused or clever. A row whose keys are all masked
gives a zero head output (headcount's documented behaviour).

Two options, written out the same way: a q/k RMSNorm per head (each row of Q_i and K_j divided by its
root mean square, times a weight shared by the heads), and a sliding window (query at position p sees
key j when p - window < j <= p, causal, or |p - j| < window, bidirectional; query t sits at S - T + t).

`per_head_from_fused` / `fused_from_per_head` convert between these per-head matrices and the fused
qkv_proj / o_proj layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class PerHeadWeights:
    """The chapter's matrices, one per head. W_q[i]: [d_model, d_k]; W_o: [n_heads * d_v, d_model]."""

    W_q: list[Tensor]
    W_k: list[Tensor]
    W_v: list[Tensor]
    W_o: Tensor
    b_q: list[Tensor] | None = None
    b_k: list[Tensor] | None = None
    b_v: list[Tensor] | None = None
    b_o: Tensor | None = None
    kv_head_of: tuple[int, ...] | None = None  # None: i // (n_heads // n_kv_heads)
    q_norm: Tensor | None = None  # [d_k] RMSNorm weight on every Q_i row (qk_norm_eps)
    k_norm: Tensor | None = None  # [d_k] RMSNorm weight on every K_j row
    norm_eps: float | None = None

    @property
    def n_heads(self) -> int:
        return len(self.W_q)

    @property
    def n_kv_heads(self) -> int:
        return len(self.W_k)

    def kv_head(self, i: int) -> int:
        if self.kv_head_of is not None:
            return self.kv_head_of[i]
        return i // (self.n_heads // self.n_kv_heads)


def per_head_from_fused(qkv_weight: Tensor, qkv_bias: Tensor | None, o_weight: Tensor, o_bias: Tensor | None, *,
                        n_heads: int, n_kv_heads: int, head_dim: int,
                        kv_head_of: tuple[int, ...] | None = None) -> PerHeadWeights:
    """Cut nn.Linear-layout fused weights ([out, in]) into the chapter's per-head matrices ([in, out])."""
    def rows(start: int, count: int) -> list[slice]:
        return [slice(start + h * head_dim, start + (h + 1) * head_dim) for h in range(count)]

    q_rows, k_rows = rows(0, n_heads), rows(n_heads * head_dim, n_kv_heads)
    v_rows = rows((n_heads + n_kv_heads) * head_dim, n_kv_heads)
    bias = (lambda sl: [qkv_bias[s] for s in sl]) if qkv_bias is not None else (lambda sl: None)
    return PerHeadWeights(
        W_q=[qkv_weight[s].T for s in q_rows], W_k=[qkv_weight[s].T for s in k_rows],
        W_v=[qkv_weight[s].T for s in v_rows], W_o=o_weight.T,
        b_q=bias(q_rows), b_k=bias(k_rows), b_v=bias(v_rows), b_o=o_bias, kv_head_of=kv_head_of)


def per_head(attn) -> PerHeadWeights:
    """The per-head matrices of a headcount.MultiHeadAttention (views of its weights)."""
    uneven = None if attn.is_uniform else tuple(attn.kv_head_of)
    w = per_head_from_fused(attn.qkv_proj.weight, attn.qkv_proj.bias, attn.o_proj.weight, attn.o_proj.bias,
                            n_heads=attn.n_heads, n_kv_heads=attn.n_kv_heads, head_dim=attn.head_dim,
                            kv_head_of=uneven)
    if getattr(attn, "q_norm", None) is not None:
        w.q_norm, w.k_norm, w.norm_eps = attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps
    return w


def rms_norm(rows: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Each row r (last dim) -> r / sqrt(mean(r^2) + eps) * weight."""
    return rows / torch.sqrt((rows * rows).mean(dim=-1, keepdim=True) + eps) * weight


def in_window(query_pos: int, key_pos: int, window: int, *, causal: bool) -> bool:
    """May the query at query_pos see the key at key_pos, under a sliding window?"""
    if causal:
        return query_pos - window < key_pos <= query_pos
    return abs(query_pos - key_pos) < window


def fused_from_per_head(w: PerHeadWeights) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
    """Stack per-head matrices into (qkv_weight, qkv_bias, o_weight, o_bias) in nn.Linear layout."""
    qkv_weight = torch.cat([m.T for m in (*w.W_q, *w.W_k, *w.W_v)], dim=0)
    qkv_bias = torch.cat([*w.b_q, *w.b_k, *w.b_v]) if w.b_q is not None else None
    return qkv_weight, qkv_bias, w.W_o.T, w.b_o


def multi_head(x: Tensor, w: PerHeadWeights, context: Tensor | None = None, *, attn_mask: Tensor | None = None,
               key_padding_mask: Tensor | None = None, is_causal: bool = False, head_gates: Tensor | None = None,
               scale: float | None = None, sliding_window: int | None = None) -> tuple[Tensor, Tensor]:
    """The chapter's MultiHead(X) for x [B, T, d_model] -> (output [B, T, d_model], weights [B, nh, T, S]).

    Masks: bool True = may attend, float added; attn_mask broadcastable to [B, nh, T, S];
    key_padding_mask [B, S] True = real token; is_causal aligned bottom-right.
    sliding_window: see in_window(); w.q_norm / w.k_norm: see rms_norm().
    """
    ctx = x if context is None else context
    batch, tgt_len, src_len = x.shape[0], x.shape[1], ctx.shape[1]
    d_k = w.W_q[0].shape[1]
    scale = d_k ** -0.5 if scale is None else scale

    # One additive mask [B, nh, T, S] of 0 / -inf (bool) plus the float mask.
    add = torch.zeros(batch, w.n_heads, tgt_len, src_len, dtype=x.dtype, device=x.device)
    blocked = torch.zeros(batch, w.n_heads, tgt_len, src_len, dtype=torch.bool, device=x.device)
    if attn_mask is not None:
        m = attn_mask if attn_mask.dim() != 3 else attn_mask.unsqueeze(1)
        if m.dtype == torch.bool:
            blocked = blocked | ~m
        else:
            add = add + m
    if key_padding_mask is not None:
        blocked = blocked | ~key_padding_mask[:, None, None, :]
    if is_causal:
        offset = src_len - tgt_len
        for t in range(tgt_len):
            blocked[:, :, t, max(0, offset + t + 1):] = True  # a negative start would wrap
    if sliding_window is not None:
        offset = src_len - tgt_len
        for t in range(tgt_len):
            for j in range(src_len):
                if not in_window(offset + t, j, sliding_window, causal=is_causal):
                    blocked[:, :, t, j] = True

    heads, all_weights = [], []
    for i in range(w.n_heads):
        j = w.kv_head(i)
        q = x @ w.W_q[i] + (w.b_q[i] if w.b_q is not None else 0)  # (B, T, d_k)
        k = ctx @ w.W_k[j] + (w.b_k[j] if w.b_k is not None else 0)  # (B, S, d_k)
        v = ctx @ w.W_v[j] + (w.b_v[j] if w.b_v is not None else 0)  # (B, S, d_v)
        if w.q_norm is not None:
            q, k = rms_norm(q, w.q_norm, w.norm_eps), rms_norm(k, w.k_norm, w.norm_eps)
        scores = (q @ k.transpose(1, 2)) * scale + add[:, i]  # (B, T, S)
        scores = scores.masked_fill(blocked[:, i], float("-inf"))
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # every key masked
        weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        head = weights @ v  # (B, T, d_v): one weighted average of V rows per position
        if head_gates is not None:
            gate = head_gates[..., i]
            head = head * (gate[:, None, None] if gate.dim() == 1 else gate)
        heads.append(head)
        all_weights.append(weights)
    concat = torch.cat(heads, dim=-1)  # (B, T, nh * d_v): head i written to slice i
    out = concat @ w.W_o + (w.b_o if w.b_o is not None else 0)  # W_O mixes the slices
    return out, torch.stack(all_weights, dim=1)
