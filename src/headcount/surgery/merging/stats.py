"""Calibration statistics of ONE attention layer for the K/V merge (fit.py): second moments of its keys,
queries and attention-averaged values, per frequency pair when the layer uses rotary.

Partial rotary (Phi-4-mini, GPT-NeoX / Pythia: only the first rotary_dim dims of a head turn, as pairs
(f, f + rotary_dim/2)): the turning dims get the per-pair statistics, the dims rotary_dim..head_dim the plain
ones (k_pass / q_pass). A layer whose attention gets no qk_transform (learned positions, SmolLM3's NoPE layers)
is a plain layer. rotary_dim is read off the layer's own hook (rotary_dim_of), not from a config."""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class LayerStats:
    """Second moments of one layer on calibration tokens (float64 sums)."""

    rotary: bool
    n_tokens: int
    k_sigma: Tensor  # rotary: [r/2, n_kv, n_kv] complex (r = rotary_dim); else [n_kv*d, n_kv*d]
    q_weight: Tensor  # rotary: [n_heads, r/2] (sum |q_f|^2); else [n_heads, d, d] (sum q q^T)
    v_sigma: Tensor  # [n_heads, n_kv*d, n_kv*d]: per query head, sum of (A_i v_S)(A_i v_S)^T
    k_energy: Tensor  # [n_kv]: sum |k_g|^2 (to keep the merged keys' scale)
    k_sum: Tensor | None = None  # rotary: [d/2, n_kv] complex, sum of the (unrotated) keys
    slow: Tensor | None = None  # rotary: [r/2] bool, pairs that turn less than 1 radian over the window
    rotary_dim: int | None = None  # rotary: the dims that turn (head_dim unless partial); else None
    k_pass: Tensor | None = None  # partial rotary: [n_kv*w, n_kv*w] keys' dims r..d (w = d - r), plain
    q_pass: Tensor | None = None  # partial rotary: [n_heads, w, w] sum q q^T over dims r..d


def rotary_dim_of(qk_transform, head_dim: int, t: int, dtype, device) -> int:
    """How many leading dims of a head the hook turns: a unit key on dim 0 at positions 0..t-1 comes back
    as cos on dim 0 and sin on dim rotary_dim/2 ("rotate half" over the first rotary_dim dims; the highest
    frequency turns by about a radian per position). With nothing seen turning (one position): head_dim."""
    probe = torch.zeros(1, 1, t, head_dim, dtype=dtype, device=device)
    probe[..., 0] = 1.0
    turned = qk_transform(probe, probe)[1].abs().reshape(-1, head_dim).amax(0)
    turned[0] = 0.0
    if float(turned.max()) == 0.0:
        return head_dim
    r = 2 * int(turned.argmax())
    if not 0 < r <= head_dim:
        raise ValueError(f"qk_transform: expected a rotate-half rotary over the first dims of the head, "
                         f"found dim 0 paired with dim {r // 2} of head_dim={head_dim}")
    return r


def _causal_or_padding(kwargs: dict, t: int, s: int, device) -> Tensor | None:
    mask = None
    if kwargs.get("is_causal"):
        mask = torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)
    kpm = kwargs.get("key_padding_mask")
    if kpm is not None:
        kpm = kpm[:, None, None, :]  # (B, 1, 1, S)
        mask = kpm if mask is None else (mask & kpm)
    return mask


def split_qkv(attn, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q [B, nh, T, d], k [B, nkv, T, d], v [B, nkv, T, d] (before any position transform)."""
    b, t, _ = x.shape
    nh, nkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    qkv = attn.qkv_proj(x).view(b, t, nh + 2 * nkv, d).transpose(1, 2)
    return qkv[:, :nh], qkv[:, nh:nh + nkv], qkv[:, nh + nkv:]


def to_complex(t: Tensor) -> Tensor:
    """[..., d] real -> [..., d/2] complex128: pair (f, f + d/2) as k[f] + i k[f + d/2]."""
    half = t.shape[-1] // 2
    return torch.complex(t[..., :half].double(), t[..., half:].double())


def layer_stats(attn, captures: list[dict], *, attention_weight: float = 0.0, dp=None) -> LayerStats:
    """Collect the second moments the merge needs from captured attention inputs (merge_stream.Stream).

    dp (a headcount.distributed.DataParallel over ranks that each captured a share of the calibration
    rows): the float64 sums are all-reduced (one collective), so every rank returns the same statistics,
    the single process's to summation order; `slow` is rank 0's (it holds global row 0, the batch one
    process would probe).

    attention_weight beta: each key token's weight in the key moments is (1 - beta) + beta * T * a(s),
    a(s) = the share of all attention (over heads and queries) that key s receives (mean 1 over tokens):
    keys the heads actually read (the attention sink first) count more."""
    nh, nkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    kv_of = torch.tensor(attn.kv_head_of, dtype=torch.long)
    first = captures[0]
    rotary = first["kwargs"].get("qk_transform") is not None
    r = (rotary_dim_of(first["kwargs"]["qk_transform"], d, first["x"].shape[1], first["x"].dtype, first["x"].device)
         if rotary else None)
    half = r // 2 if rotary else d // 2
    w = d - r if rotary else 0  # partial rotary: the dims that do not turn
    k_pass = torch.zeros(nkv * w, nkv * w, dtype=torch.float64) if w else None
    q_pass = torch.zeros(nh, w, w, dtype=torch.float64) if w else None
    if rotary:
        k_sigma = torch.zeros(half, nkv, nkv, dtype=torch.complex128)
        q_weight = torch.zeros(nh, half, dtype=torch.float64)
    else:
        k_sigma = torch.zeros(nkv * d, nkv * d, dtype=torch.float64)
        q_weight = torch.zeros(nh, d, d, dtype=torch.float64)
    v_sigma = torch.zeros(nh, nkv * d, nkv * d, dtype=torch.float64)
    k_energy = torch.zeros(nkv, dtype=torch.float64)
    k_sum = torch.zeros(half, nkv, dtype=torch.complex128) if rotary else None
    slow = None
    n_tokens = 0
    with torch.no_grad():
        for cap in captures:
            x, kw, sel = cap["x"], cap["kwargs"], cap["mask"]
            q, k, v = split_qkv(attn, x)
            b, _, t, _ = q.shape
            # token rows [B*T, heads, d], real tokens only
            qf = q.transpose(1, 2).reshape(b * t, nh, d)
            kf = k.transpose(1, 2).reshape(b * t, nkv, d)
            if sel is not None:
                qf, kf = qf[sel], kf[sel]
            n_tokens += qf.shape[0]
            k_energy += kf.double().pow(2).sum(dim=(0, 2))
            # contexts of every query head over ALL old value heads: A_i [v_0 | v_1 | ...]
            qt = kw.get("qk_transform")
            qr, kr = qt(q, k) if qt is not None else (q, k)
            if qt is not None and slow is None:  # how far each pair turns over the window: probe the hook
                probe = torch.zeros(1, 1, t, d, dtype=q.dtype, device=q.device)
                probe[..., :half] = 1.0
                turned = qt(probe, probe)[1].reshape(-1, t, d)[0]  # (T, d): (cos, sin) of each pair's angle
                angle = torch.atan2(turned[:, half:r], turned[:, :half]).abs().amax(0)
                slow = (angle < 1.0).cpu()
            scores = torch.einsum("bhtd,bhsd->bhts", qr, kr.index_select(1, kv_of)) * attn.softmax_scale
            mask = _causal_or_padding(kw, t, kr.shape[2], x.device)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(v.dtype)
            # key token weights: (1 - beta) + beta * (attention received, normalised to mean 1)
            received = probs.sum(dim=2).mean(dim=1)  # (B, S): mean over heads of the attention each key gets
            n_q = probs.shape[2]
            tw = ((1 - attention_weight) + attention_weight * received / n_q * received.shape[1]).reshape(-1)
            if sel is not None:
                tw = tw[sel]
            tw = tw.double()[:, None, None]
            if rotary:
                kc, qc = to_complex(kf[..., :r]), to_complex(qf[..., :r])  # (N, nkv, r/2), (N, nh, r/2)
                k_sigma += torch.einsum("ngf,njf->fgj", kc * tw, kc.conj())
                k_sum += (kc * tw).sum(0).T
                q_weight += qc.abs().pow(2).sum(0)
                if w:  # the dims that do not turn: plain second moments, as a layer without rotary
                    kd = kf[..., r:].reshape(-1, nkv * w).double()
                    k_pass += (kd * tw[:, :, 0]).T @ kd
                    qd = qf[..., r:].double()
                    q_pass += torch.einsum("nhd,nhe->hde", qd, qd)
            else:
                kd = kf.reshape(-1, nkv * d).double()
                k_sigma += (kd * tw[:, :, 0]).T @ kd
                qd = qf.double()
                q_weight += torch.einsum("nhd,nhe->hde", qd, qd)
            v_all = v.transpose(1, 2).reshape(b, t, nkv * d)  # (B, S, nkv*d)
            ctx = torch.einsum("bhts,bse->bhte", probs, v_all)  # (B, nh, T, nkv*d)
            ctx = ctx.transpose(1, 2).reshape(b * t, nh, nkv * d)
            if sel is not None:
                ctx = ctx[sel]
            # float64 products, not float32 ones summed in float64: a float32 product's rounding depends on
            # how the BLAS splits the sum over its threads, and data parallelism must give one process's
            # result to 1e-6 (a float32 Gram measured 1.8e-6 apart after the local steps)
            ctx = ctx.double()
            v_sigma += torch.einsum("nhe,nhf->hef", ctx, ctx)
    if dp is not None and dp.world > 1:
        parts = [k_sigma, q_weight, v_sigma, k_energy, torch.tensor([float(n_tokens)], dtype=torch.float64)]
        if rotary:
            mine = slow.double() if (slow is not None and dp.rank == 0) else torch.zeros(half, dtype=torch.float64)
            parts += [k_sum, mine]
        if w:
            parts += [k_pass, q_pass]
        summed = dp.sum_many(parts)
        k_sigma, q_weight, v_sigma, k_energy = summed[:4]
        n_tokens = int(round(float(summed[4][0])))
        if rotary:
            k_sum, slow = summed[5], summed[6] > 0.5
        if w:
            k_pass, q_pass = summed[-2], summed[-1]
    return LayerStats(rotary, n_tokens, k_sigma, q_weight, v_sigma, k_energy, k_sum, slow, r, k_pass, q_pass)


# ------------------------------------------------------------------------------------------ grouping
