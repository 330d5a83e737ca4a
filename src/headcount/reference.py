"""The chapter's formula, head by head: the truth the tests compare against.

    MultiHead(X) = Concat(head_1, ..., head_nh) W_O
    head_i       = softmax(Q_i K_j^T / sqrt(d_k) + mask) V_j,   Q_i = X W_i^Q, K_j = C W_j^K, V_j = C W_j^V

with n_heads separate matrices W_i^Q, W_i^K, W_i^V in R^{d_model x d_k} (the chapter's orientation:
X on the left), j = the KV head query head i reads, and an explicit Concat. Written for clarity,
with a Python loop over heads; nothing here is fused or clever. A row whose keys are all masked
gives a zero head output (headcount's documented behaviour).

Options, written out the same way:
- a q/k RMSNorm per head (each row of Q_i and K_j divided by its root mean square, times a weight [d_k]
  shared by the heads), or over the WHOLE projection (OLMo 2 / OLMoE: a weight [n_heads x d_k]; each
  token's row of Concat(Q_1, ..., Q_nh) divided by its root mean square over all heads, times the weight,
  and only then cut back into heads, as transformers' OLMo 2 does; likewise K over the n_kv_heads);
- a sliding window (query at position p sees key j when p - window < j <= p, causal, or |p - j| < window,
  bidirectional; query t sits at S - T + t);
- attention-logit soft-capping (Gemma 2): scores -> softcap * tanh(scores / softcap) after the scale,
  before the mask;
- a learned sink logit per head (GPT-OSS): sink_i joins head i's softmax as one more column with no value,
  dropped after, so each row's weights sum to 1 - (the sink's share).

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
    q_norm: Tensor | None = None  # [d_k] RMSNorm weight on every Q_i row, or [n_heads * d_k]: over all heads
    k_norm: Tensor | None = None  # [d_k] RMSNorm weight on every K_j row, or [n_kv_heads * d_k]: over all
    norm_eps: float | None = None
    sinks: Tensor | None = None  # [n_heads] one sink logit per query head (in the scores' units)

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
    if getattr(attn, "sinks", None) is not None:
        w.sinks = attn.sinks
    return w


def rms_norm(rows: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Each row r (last dim) -> r / sqrt(mean(r^2) + eps) * weight."""
    return rows / torch.sqrt((rows * rows).mean(dim=-1, keepdim=True) + eps) * weight


def _normed_heads(rows: list[Tensor], weight: Tensor | None, eps: float | None) -> list[Tensor]:
    """Each head's rows [B, T, d_k] after the q (or k) norm: per head when the weight is [d_k]; when it is
    [n * d_k], over the whole projection Concat(rows) (one statistic per token over every head), then cut
    back into the n heads."""
    if weight is None:
        return rows
    d_k = rows[0].shape[-1]
    if weight.numel() == d_k:
        return [rms_norm(r, weight, eps) for r in rows]
    if weight.numel() != len(rows) * d_k:
        raise ValueError(f"q/k norm weight: expected {d_k} (per head) or {len(rows)} x {d_k} = {len(rows) * d_k} "
                         f"(over all heads) values, got {weight.numel()}")
    full = rms_norm(torch.cat(rows, dim=-1), weight, eps)  # (B, T, n * d_k)
    return list(full.split(d_k, dim=-1))


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
               scale: float | None = None, sliding_window: int | None = None,
               softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """The chapter's MultiHead(X) for x [B, T, d_model] -> (output [B, T, d_model], weights [B, nh, T, S]).

    Masks: bool True = may attend, float added; attn_mask broadcastable to [B, nh, T, S];
    key_padding_mask [B, S] True = real token; is_causal aligned bottom-right.
    sliding_window: see in_window(); w.q_norm / w.k_norm: see _normed_heads(); softcap: scores ->
    softcap * tanh(scores / softcap) before the mask; w.sinks: one more softmax column per head, dropped after.
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

    # Q_i = X W_i^Q, K_j = C W_j^K, V_j = C W_j^V, each head its own matrix; the q/k norms (when any) next:
    # per head, or over all heads' rows at once (the one step that looks across heads)
    Q = _normed_heads([x @ w.W_q[i] + (w.b_q[i] if w.b_q is not None else 0) for i in range(w.n_heads)],
                      w.q_norm, w.norm_eps)  # n_heads x (B, T, d_k)
    K = _normed_heads([ctx @ w.W_k[j] + (w.b_k[j] if w.b_k is not None else 0) for j in range(w.n_kv_heads)],
                      w.k_norm, w.norm_eps)  # n_kv_heads x (B, S, d_k)
    V = [ctx @ w.W_v[j] + (w.b_v[j] if w.b_v is not None else 0) for j in range(w.n_kv_heads)]  # (B, S, d_v)

    heads, all_weights = [], []
    for i in range(w.n_heads):
        j = w.kv_head(i)
        q, k, v = Q[i], K[j], V[j]
        scores = (q @ k.transpose(1, 2)) * scale  # (B, T, S)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = (scores + add[:, i]).masked_fill(blocked[:, i], float("-inf"))
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # every key masked
        scores = scores.masked_fill(dead, 0.0)
        if w.sinks is not None:  # one more column, the sink's logit, in the softmax; dropped after
            sink = w.sinks[i].to(scores.dtype).expand(*scores.shape[:-1], 1)
            weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1)
        weights = weights.masked_fill(dead, 0.0)
        head = weights @ v  # (B, T, d_v): one weighted average of V rows per position
        if head_gates is not None:
            gate = head_gates[..., i]
            head = head * (gate[:, None, None] if gate.dim() == 1 else gate)
        heads.append(head)
        all_weights.append(weights)
    concat = torch.cat(heads, dim=-1)  # (B, T, nh * d_v): head i written to slice i
    out = concat @ w.W_o + (w.b_o if w.b_o is not None else 0)  # W_O mixes the slices
    return out, torch.stack(all_weights, dim=1)
