"""The activation-aware K/V merge of ONE attention layer, in closed form (used by kv_merge.py; the layer's
calibration statistics come from stats.py, the optional block-wise reconstruction is refine.py).

Notation: the layer has n_heads query heads and n_kv old K/V heads of head_dim d; old KV head g is read by
the query heads {i : kv_head_of[i] = g}. A new KV head m replaces a group S_m of old KV heads.

Keys, with rotary (the "rotate half" layout of headcount.models.rotary): dims (f, f + d/2) form frequency
pair f; read as one complex number k_f = k[f] + i k[f + d/2], the position rotation multiplies k_f (and
q_f) by e^{i p theta_f}, and the logit is sum_f Re(q_f conj(k_f) e^{i (p - s) theta_f}). A complex scale
c per frequency pair (a 2x2 rotation-scaling on rows f, f + d/2) commutes with that rotation, so a new
key  z_f = sum_{g in S} conj(b_g) k_{g,f}  is again a rotary key, and  k_{g,f} ~ gamma_g z_f  is undone in
the query: q'_{i,f} = conj(gamma_g) q_{i,f} keeps q'_f conj(z_f) = q_f conj(gamma_g z_f) ~ q_f conj(k_{g,f}).
The error in head i's logits is  Re(q_{i,f} conj(k_{g,f} - gamma_g z_f) e^{i..}), whose mean square is
E|q_{i,f}|^2 E|k_{g,f} - gamma_g z_f|^2 / 2 for independent queries and keys: the key residual weighted
by the energy of the queries that read it, per frequency. Minimising the sum over heads and frequencies
is, per frequency, the rank-1 reduction below with Sigma = E[k_S k_S^H] (complex |S| x |S|) and
G = diag(sum of E|q_{i,f}|^2 over the query heads reading g). Without rotary the same holds with real
head_dim-wide blocks: Sigma = E[k_S k_S^T], G_g = sum_i E[q_i q_i^T], and q'_i = P_g^T q_i. Partial rotary
(rotary_dim r < head_dim: Phi-4-mini, GPT-NeoX) splits the logit into the r turning dims, pairs (f, f + r/2),
fitted per pair as above, plus the d - r dims that never turn, fitted as a layer without rotary (an
unconstrained real map of width d - r); the two parts of the logit add, so the two fits are independent.
A layer with no rotary hook (SmolLM3's NoPE layers) is fitted plainly over the whole head.

Values: query head i's context is c_i = A_i v_g; the output is sum_i O_i c_i. With v_g ~ P_g z (z = B^T v_S)
and the map P_g folded into o_proj (O_i P_g), the output error of head i is O_i A_i (v_g - P_g z): the same
reduction with Sigma = the second moment of the attention-averaged values A_i v_S (the contexts, what
o_proj actually sees) and G_g = sum_i O_i^T O_i (how much each value direction moves the output).

    reduce(sigma, G, r): minimise sum_g E[(x_g - P_g z)^H G_g (x_g - P_g z)], z = B^H x of width r.
        x -> G^{1/2} x turns it into plain PCA: U = top-r eigenvectors of G^{1/2} Sigma G^{1/2},
        B = G^{1/2} U, P = G^{-1/2} U. Returns (B, P, kept energy fraction).

Finally o_proj is refit by ridge least squares (headcount.analysis.refit) on the merged layer's contexts,
so that the layer output reproduces the target on calibration tokens: this also absorbs part of the
attention-pattern change the merged keys cause.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headcount.surgery.merging.stats import LayerStats, _causal_or_padding, split_qkv, to_complex

Tensor = torch.Tensor

EPS = 1e-6
CENTER_SLOW = False  # centering slow pairs measured worse on smollm2 (layer 3: 0.59 vs 0.55 output error)


def _sqrtm_psd(a: Tensor, inverse: bool = False) -> Tensor:
    w, v = torch.linalg.eigh(a)
    w = w.clamp(min=float(w.max().real) * EPS if w.numel() else 0.0)
    d = w.rsqrt() if inverse else w.sqrt()
    return (v * d.to(v.dtype)) @ v.mH


def _canonical_sign(u: Tensor) -> Tensor:
    """Each column times +-1 so that its largest-magnitude entry has a positive real part (its imaginary part
    when the real part is 0). An eigenvector's sign is arbitrary, and LAPACK's choice can flip under a
    perturbation at rounding level (the same sums added in another order: data parallelism). A sign leaves
    the merged layer's function exactly as it was (a key or value direction and its back-map flip together;
    a per-head key norm commutes with it), so fixing it makes the weights themselves reproducible. Only a
    sign: a complex phase would not commute with a key norm's per-dimension weights."""
    if u.numel() == 0:
        return u
    pivot = u[u.abs().argmax(dim=0), torch.arange(u.shape[1])]
    if u.is_complex():
        pivot = torch.where(pivot.real != 0, pivot.real, pivot.imag)
    return u * torch.where(pivot < 0, -1.0, 1.0).to(u.dtype)


def reduce(sigma: Tensor, g_metric: Tensor, r: int) -> tuple[Tensor, Tensor, float]:
    """(B [n, r], P [n, r], kept fraction): z = B^H x, x ~ P z in the G-metric (see module docstring)."""
    g_half = _sqrtm_psd(g_metric)
    g_ihalf = _sqrtm_psd(g_metric, inverse=True)
    m = g_half @ sigma @ g_half
    m = (m + m.mH) / 2
    w, u = torch.linalg.eigh(m)  # ascending
    u = _canonical_sign(u[:, -r:].flip(-1))
    total = float(w.real.clamp(min=0).sum())
    kept = float(w[-r:].real.clamp(min=0).sum()) / total if total > 0 else 1.0
    return g_half @ u, g_ihalf @ u, kept


def _readers(kv_head_of, g: int) -> list[int]:
    return [i for i, kv in enumerate(kv_head_of) if kv == g]


def _v_metric(o_weight: Tensor, kv_head_of, group: list[int], d: int) -> Tensor:
    """blockdiag over g in group of sum_i O_i^T O_i (O_i = o_proj columns of query head i)."""
    blocks = []
    for g in group:
        m = torch.zeros(d, d, dtype=torch.float64)
        for i in _readers(kv_head_of, g):
            o = o_weight[:, i * d:(i + 1) * d].double()
            m += o.T @ o
        blocks.append(m)
    return torch.block_diag(*blocks)


def _v_sigma(stats: LayerStats, kv_head_of, group: list[int], d: int) -> Tensor:
    idx = torch.tensor([g * d + j for g in group for j in range(d)], dtype=torch.long)
    readers = [i for g in group for i in _readers(kv_head_of, g)]
    return stats.v_sigma[readers].sum(0)[idx][:, idx]


def _k_pass_problem(stats: LayerStats, kv_head_of, group: list[int]):
    """(sigma, G) of the plain key reduction of `group` over the dims partial rotary leaves unturned."""
    w = stats.q_pass.shape[-1]
    idx = torch.tensor([g * w + j for g in group for j in range(w)], dtype=torch.long)
    g_metric = torch.block_diag(*[stats.q_pass[_readers(kv_head_of, g)].sum(0) for g in group])
    return stats.k_pass[idx][:, idx], g_metric


def _k_problem(stats: LayerStats, kv_head_of, group: list[int], d: int, f: int | None = None):
    """(sigma, G) of the key reduction of `group` (frequency pair f with rotary)."""
    if stats.rotary:
        idx = torch.tensor(group, dtype=torch.long)
        sigma = stats.k_sigma[f][idx][:, idx]
        if CENTER_SLOW and stats.slow is not None and bool(stats.slow[f]):
            # a pair that barely turns over the window adds the SAME logit to every key of a query for
            # its mean part: softmax ignores it, so only the keys' variation about the mean is fitted
            mean = stats.k_sum[f][idx] / stats.n_tokens
            sigma = sigma - stats.n_tokens * torch.outer(mean, mean.conj())
        w = torch.stack([stats.q_weight[_readers(kv_head_of, g), f].sum() for g in group])
        return sigma, torch.diag(w).to(sigma.dtype)
    idx = torch.tensor([g * d + j for g in group for j in range(d)], dtype=torch.long)
    sigma = stats.k_sigma[idx][:, idx]
    g_metric = torch.block_diag(*[stats.q_weight[_readers(kv_head_of, g)].sum(0) for g in group])
    return sigma, g_metric


def group_cost(stats: LayerStats, o_weight: Tensor, kv_head_of, group: list[int], d: int) -> float:
    """Energy lost (K and V, each as a fraction of the layer's total) when `group` becomes one KV head."""
    if len(group) == 1:
        return 0.0
    k_lost, k_total = 0.0, 0.0
    freqs = range(stats.k_sigma.shape[0]) if stats.rotary else [None]
    for f in freqs:
        sigma, g_metric = _k_problem(stats, kv_head_of, group, d, f)
        m = _sqrtm_psd(g_metric) @ sigma @ _sqrtm_psd(g_metric)
        w = torch.linalg.eigvalsh((m + m.mH) / 2).clamp(min=0)
        r = 1 if stats.rotary else d
        k_lost += float(w[:-r].sum())
        k_total += float(w.sum())
    if stats.k_pass is not None:  # partial rotary: the unturned dims, kept at their width
        sigma, g_metric = _k_pass_problem(stats, kv_head_of, group)
        m = _sqrtm_psd(g_metric) @ sigma @ _sqrtm_psd(g_metric)
        w = torch.linalg.eigvalsh((m + m.T) / 2).clamp(min=0)
        k_lost += float(w[:-stats.q_pass.shape[-1]].sum())
        k_total += float(w.sum())
    sigma = _v_sigma(stats, kv_head_of, group, d)
    g_metric = _v_metric(o_weight, kv_head_of, group, d)
    m = _sqrtm_psd(g_metric) @ sigma @ _sqrtm_psd(g_metric)
    w = torch.linalg.eigvalsh((m + m.T) / 2).clamp(min=0)
    v_lost, v_total = float(w[:-d].sum()), float(w.sum())
    return k_lost / max(k_total, 1e-30) + v_lost / max(v_total, 1e-30)


def choose_groups(stats: LayerStats, o_weight: Tensor, kv_head_of, n_kv: int, n_new: int, d: int) -> list[list[int]]:
    """Old KV heads -> n_new groups: agglomerative, merging the pair that loses the least energy."""
    groups = [[g] for g in range(n_kv)]
    cost = {(g,): 0.0 for g in range(n_kv)}
    while len(groups) > n_new:
        best = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                union = sorted(groups[a] + groups[b])
                key = tuple(union)
                if key not in cost:
                    cost[key] = group_cost(stats, o_weight, kv_head_of, union, d)
                delta = cost[key] - cost[tuple(groups[a])] - cost[tuple(groups[b])]
                if best is None or delta < best[0]:
                    best = (delta, a, b, union)
        _, a, b, union = best
        groups = [grp for j, grp in enumerate(groups) if j not in (a, b)] + [union]
    return sorted(groups, key=lambda grp: grp[0])


# ------------------------------------------------------------------------------------------ new weights
def pair_scale(rows: Tensor, c: Tensor) -> Tensor:
    """Multiply each rotary frequency pair of `rows` [d, ...] (rows f and f + d/2, read as the complex
    number rows[f] + i rows[f + d/2]) by the complex scale c[f] ([d/2] complex): a 2x2 rotation-scaling
    per pair, which commutes with the rotary position rotation of that pair."""
    half = rows.shape[0] // 2
    shape = (half,) + (1,) * (rows.dim() - 1)
    cr, ci = c.real.to(rows.dtype).view(shape), c.imag.to(rows.dtype).view(shape)
    re, im = rows[:half], rows[half:]
    return torch.cat([cr * re - ci * im, ci * re + cr * im])


def _plain_keys(sigma: Tensor, g_metric: Tensor, width: int) -> tuple[Tensor, Tensor, float, float]:
    """(B, P, kept, weight) of the unconstrained key reduction of one group to one head of `width` dims,
    B's columns scaled so each merged key dim keeps the old heads' mean energy (P z unchanged)."""
    b_mat, p_mat, kept = reduce(sigma, g_metric, width)  # [|S| width, width]
    z_energy = (b_mat.T @ sigma @ b_mat).diagonal()
    target = float(sigma.diagonal().mean())
    s = (target / z_energy.clamp(min=1e-30)).sqrt()
    return b_mat * s, p_mat / s, kept, float(g_metric.diagonal().sum())


@dataclass
class MergedWeights:
    q_w: Tensor
    q_b: Tensor | None
    k_w: Tensor
    k_b: Tensor | None
    v_w: Tensor
    v_b: Tensor | None
    o_w: Tensor
    kv_head_of: tuple[int, ...]
    k_kept: float
    v_kept: float


def merged_weights(attn, stats: LayerStats, groups: list[list[int]], *, captures=None,
                   refine_steps: int = 0, dp=None) -> MergedWeights:
    """New Q / K / V rows and o_proj columns for the given grouping of old KV heads (float64).

    refine_steps > 0 (rotary only): the closed-form key mix is then refined on `captures` by
    refine_rotary_keys (a few hundred parameters per layer; the model's weights are not trained).
    dp: data parallelism (headcount.distributed.DataParallel); `stats` are already summed over the ranks,
    and refine_rotary_keys all-reduces its loss and gradients."""
    nh, nkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w = attn.qkv_proj.weight.detach().double()
    bias = attn.qkv_proj.bias
    bias = None if bias is None else bias.detach().double()
    q_w, k_w, v_w = w.split([nh * d, nkv * d, nkv * d])
    q_w = q_w.clone().view(nh, d, -1)
    k_w, v_w = k_w.view(nkv, d, -1), v_w.view(nkv, d, -1)
    q_b = k_b = v_b = None
    if bias is not None:
        q_b, k_b, v_b = bias.split([nh * d, nkv * d, nkv * d])
        q_b, k_b, v_b = q_b.clone().view(nh, d), k_b.view(nkv, d), v_b.view(nkv, d)
    o_w = attn.o_proj.weight.detach().double().clone()
    kv_of = attn.kv_head_of
    new_of = [0] * nh
    new_k, new_kb, new_v, new_vb = [], [], [], []
    k_kept, v_kept, k_weight_total = 0.0, 0.0, 0.0
    for m, group in enumerate(groups):
        readers = [i for g in group for i in _readers(kv_of, g)]
        for i in readers:
            new_of[i] = m
        # ---- keys
        if stats.rotary:
            r = stats.rotary_dim
            rot = slice(0, r)  # the turning dims, pairs (f, f + r/2)
            cs = torch.zeros(r // 2, len(group), dtype=torch.complex128)  # z_f = sum_g cs[f, g] k_{g,f}
            gammas = torch.zeros(r // 2, len(group), dtype=torch.complex128)  # k_{g,f} ~ gammas[f, g] z_f
            for f in range(r // 2):
                sigma, g_metric = _k_problem(stats, kv_of, group, d, f)
                b_vec, p_vec, kept = reduce(sigma, g_metric, 1)  # [|S|, 1] complex
                c, gamma = b_vec[:, 0].conj(), p_vec[:, 0]
                weight = float(g_metric.real.diagonal().sum())
                k_kept += kept * weight
                k_weight_total += weight
                # rescale z_f so the merged key's energy matches the old heads' mean at this frequency
                z_energy = float((c @ sigma @ c.conj()).real)  # E|z_f|^2
                target = float(sigma.real.diagonal().mean())
                s = (target / z_energy) ** 0.5 if z_energy > 0 and target > 0 else 1.0
                cs[f], gammas[f] = c * s, gamma / s
            head_gamma = {i: gammas[:, j].clone() for j, g in enumerate(group) for i in _readers(kv_of, g)}
            if refine_steps and len(group) > 1 and captures:
                cs, head_gamma = refine_rotary_keys(attn, captures, group, cs, head_gamma, steps=refine_steps,
                                                    dp=dp)
            rows = sum(pair_scale(k_w[g, rot], cs[:, j]) for j, g in enumerate(group))
            rows_b = sum(pair_scale(k_b[g, rot], cs[:, j]) for j, g in enumerate(group)) if bias is not None else None
            for i, gamma in head_gamma.items():  # q' = conj(gamma) q keeps q' conj(z) = q conj(gamma z)
                q_w[i, rot] = pair_scale(q_w[i, rot], gamma.conj())
                if bias is not None:
                    q_b[i, rot] = pair_scale(q_b[i, rot], gamma.conj())
            if stats.k_pass is not None:  # partial rotary: dims r..d never turn, fitted without constraint
                rest = slice(r, d)
                sigma, g_metric = _k_pass_problem(stats, kv_of, group)
                b_mat, p_mat, kept, weight = _plain_keys(sigma, g_metric, d - r)
                k_kept += kept * weight
                k_weight_total += weight
                rows = torch.cat([rows, b_mat.T @ k_w[group][:, rest].reshape(len(group) * (d - r), -1)])
                if bias is not None:
                    rows_b = torch.cat([rows_b, b_mat.T @ k_b[group][:, rest].reshape(-1)])
                _fold_plain_queries(q_w, q_b, p_mat, kv_of, group, rest)
            new_k.append(rows)
            new_kb.append(rows_b)
        else:
            sigma, g_metric = _k_problem(stats, kv_of, group, d)
            b_mat, p_mat, kept, weight = _plain_keys(sigma, g_metric, d)
            k_kept += kept * weight
            k_weight_total += weight
            new_k.append(b_mat.T @ k_w[group].reshape(len(group) * d, -1))
            new_kb.append(b_mat.T @ k_b[group].reshape(-1) if bias is not None else None)
            _fold_plain_queries(q_w, q_b, p_mat, kv_of, group, slice(0, d))
        # ---- values
        sigma = _v_sigma(stats, kv_of, group, d)
        g_metric = _v_metric(o_w, kv_of, group, d)
        b_mat, p_mat, kept = reduce(sigma, g_metric, d)
        v_kept += kept / len(groups)
        z_energy = (b_mat.T @ sigma @ b_mat).diagonal()
        target = float(sigma.diagonal().mean())
        s = (target / z_energy.clamp(min=1e-30)).sqrt()
        b_mat, p_mat = b_mat * s, p_mat / s
        new_v.append(b_mat.T @ v_w[group].reshape(len(group) * d, -1))
        new_vb.append(b_mat.T @ v_b[group].reshape(-1) if bias is not None else None)
        for j, g in enumerate(group):
            p_g = p_mat[j * d:(j + 1) * d]  # v_g ~ P_g z
            for i in _readers(kv_of, g):
                o_w[:, i * d:(i + 1) * d] = o_w[:, i * d:(i + 1) * d] @ p_g
    cat_b = (lambda parts: torch.cat(parts)) if bias is not None else (lambda parts: None)
    return MergedWeights(q_w.reshape(nh * d, -1), cat_b([q_b.reshape(-1)]) if bias is not None else None,
                         torch.cat(new_k), cat_b(new_kb), torch.cat(new_v), cat_b(new_vb), o_w,
                         tuple(new_of), k_kept / max(k_weight_total, 1e-30), v_kept)


def _fold_plain_queries(q_w: Tensor, q_b: Tensor | None, p_mat: Tensor, kv_of, group: list[int], dims: slice) -> None:
    """q'_i = P_g^T q_i on `dims` of every query head reading old KV head g (k_g ~ P_g z there), in place."""
    width = dims.stop - dims.start
    for j, g in enumerate(group):
        p_g = p_mat[j * width:(j + 1) * width]
        for i in _readers(kv_of, g):
            q_w[i, dims] = p_g.T @ q_w[i, dims]
            if q_b is not None:
                q_b[i, dims] = p_g.T @ q_b[i, dims]


def install(attn, mw: MergedWeights) -> None:
    """Write merged weights into `attn` in place (new Parameters, new head counts and query -> KV map)."""
    from torch import nn
    nh, d = attn.n_heads, attn.head_dim
    n_new = max(mw.kv_head_of) + 1
    weight = attn.qkv_proj.weight
    with torch.no_grad():
        new_w = torch.cat([mw.q_w, mw.k_w, mw.v_w]).to(weight)
        attn.qkv_proj.weight = nn.Parameter(new_w, requires_grad=weight.requires_grad)
        if attn.qkv_proj.bias is not None:
            b = attn.qkv_proj.bias
            attn.qkv_proj.bias = nn.Parameter(torch.cat([mw.q_b, mw.k_b, mw.v_b]).to(b),
                                              requires_grad=b.requires_grad)
        o = attn.o_proj.weight
        attn.o_proj.weight = nn.Parameter(mw.o_w.to(o), requires_grad=o.requires_grad)
    attn.qkv_proj.out_features = attn.qkv_proj.weight.shape[0]
    set_kv_map(attn, mw.kv_head_of, n_new)
    assert attn.qkv_proj.out_features == (nh + 2 * n_new) * d


def set_kv_map(attn, kv_head_of, n_kv: int) -> None:
    """Set n_kv_heads and the query -> KV head map (kv_index only when the groups are not uniform)."""
    nh = attn.n_heads
    kv_head_of = tuple(int(g) for g in kv_head_of)
    attn.n_kv_heads = n_kv
    attn.kv_head_of = kv_head_of
    uniform = nh % n_kv == 0 and all(g == i // (nh // n_kv) for i, g in enumerate(kv_head_of))
    attn.kv_index = None if uniform else torch.tensor(kv_head_of, dtype=torch.long,
                                                      device=attn.qkv_proj.weight.device)


def refit_o_proj(attn, captures: list[dict], targets: list[Tensor], *, ridge: float = 1e-2, dp=None) -> float:
    """Ridge refit of o_proj so that attn(x) ~ target on the captured tokens; returns the relative error
    after it (refit_o_proj_errors: the errors before and after, from the same pass)."""
    return refit_o_proj_errors(attn, captures, targets, ridge=ridge, dp=dp)[1]


def refit_o_proj_errors(attn, captures: list[dict], targets: list[Tensor], *, ridge: float = 1e-2,
                        dp=None) -> tuple[float, float]:
    """Ridge refit of o_proj so that attn(x) ~ target on the captured tokens; returns the relative errors
    (before, after) the refit, both read off the pass's Gram statistics (no second attention pass: the
    error of the current o_proj W0 is ||C W0^T + b0 - Y||^2 = Y'Y - 2 <W0, C'Y> + <W0, C'C W0>).

    dp (headcount.distributed.DataParallel): the Gram statistics are summed over the ranks in float64 (one
    all-reduce) before the solve, so every rank computes the same weights, the single process's.

    The ridge pulls towards the CURRENT o_proj (the merged one, with the value back-maps folded in), not
    towards zero: min ||C W^T + b - Y||^2 + lam ||W - W0||^2, lam = ridge * mean diag(C^T C). With fewer
    calibration tokens than o_proj inputs the directions the data does not see keep their old weights.
    """
    from torch import nn

    from headcount.analysis.refit import GramStats

    ctx: dict = {}

    def pre(module, args):
        ctx["x"] = args[0].detach()

    handle = attn.o_proj.register_forward_pre_hook(pre)
    stats = None
    try:
        with torch.no_grad():
            for cap, y in zip(captures, targets):
                attn(cap["x"], **cap["kwargs"])
                # float64 products (not float32 ones summed in float64: their rounding depends on the BLAS's
                # threading, and data parallelism must give one process's weights to 1e-6; layer_stats)
                x = ctx["x"].reshape(-1, ctx["x"].shape[-1]).double()
                yy = y.reshape(-1, y.shape[-1]).double()
                if cap["mask"] is not None:
                    x, yy = x[cap["mask"]], yy[cap["mask"]]
                x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)
                s = GramStats(x1.T @ x1, x1.T @ yy, (yy * yy).sum(0), int(x.shape[0]))
                stats = s if stats is None else stats + s
    finally:
        handle.remove()
    if dp is not None and dp.world > 1:
        xtx, xty, yty, n = dp.sum_many([stats.xtx, stats.xty, stats.yty,
                                        torch.tensor([float(stats.n_tokens)], dtype=torch.float64)])
        stats = GramStats(xtx, xty, yty, int(round(float(n[0]))))
    fit_bias = attn.o_proj.bias is not None
    n_in = stats.n_inputs
    idx = list(range(n_in)) + ([n_in] if fit_bias else [])
    a, c = stats.xtx[idx][:, idx].clone(), stats.xty[idx]
    w0 = attn.o_proj.weight.detach().double().T  # [D, d_model]
    if fit_bias:
        w0 = torch.cat([w0, attn.o_proj.bias.detach().double()[None]])
    lam = float(ridge) * float(stats.xtx.diagonal()[:n_in].mean())
    pen = torch.full((len(idx),), lam, dtype=torch.float64)
    if fit_bias:
        pen[-1] = 0.0  # the bias is not pulled anywhere
    a.diagonal().add_(pen)
    sol = w0 + torch.linalg.solve(a, c - stats.xtx[idx][:, idx] @ w0)  # [D(+1), d_model]
    a.diagonal().sub_(pen)

    def rel_error(w: Tensor) -> float:
        resid = float((stats.yty - 2 * (w * c).sum(0) + (w * (a @ w)).sum(0)).sum())
        return (max(resid, 0.0) / max(float(stats.yty.sum()), 1e-30)) ** 0.5

    before, rel = rel_error(w0), rel_error(sol)
    with torch.no_grad():
        o = attn.o_proj.weight
        attn.o_proj.weight = nn.Parameter(sol[:n_in].T.contiguous().to(o), requires_grad=o.requires_grad)
        if fit_bias:
            b = attn.o_proj.bias
            attn.o_proj.bias = nn.Parameter(sol[n_in].to(b), requires_grad=b.requires_grad)
    return before, rel


def output_error(attn, captures: list[dict], targets: list[Tensor], dp=None) -> float:
    """Relative error ||attn(x) - target|| / ||target|| over the captured real tokens (of every rank, with dp)."""
    num, den = 0.0, 0.0
    with torch.no_grad():
        for cap, y in zip(captures, targets):
            out = attn(cap["x"], **cap["kwargs"]).output
            diff, yy = (out - y).reshape(-1, y.shape[-1]), y.reshape(-1, y.shape[-1])
            if cap["mask"] is not None:
                diff, yy = diff[cap["mask"]], yy[cap["mask"]]
            num += float(diff.double().pow(2).sum())
            den += float(yy.double().pow(2).sum())
    if dp is not None and dp.world > 1:
        num, den = (float(x) for x in dp.sum_many([torch.tensor([num, den], dtype=torch.float64)])[0])
    return (num / den) ** 0.5 if den > 0 else 0.0


def _global_rows(captures: list[dict], parallel: bool) -> list[list[int]]:
    """Each capture's row numbers: counted in order in one process; over ranks, the merge stream's global
    "rows" (merging.stream.shard_batches)."""
    out, start = [], 0
    for cap in captures:
        n = cap["x"].shape[0]
        out.append(list(cap["rows"]) if parallel else list(range(start, start + n)))
        start += n
    return out


def refine_rotary_keys(attn, captures: list[dict], group: list[int], cs: Tensor, head_gamma: dict, *,
                       steps: int = 40, lr: float = 0.02, max_windows: int = 2, dp=None) -> tuple[Tensor, dict]:
    """Refine the per-frequency complex key mix cs [d/2, |S|] and each reading query head's complex
    scales gamma_i [d/2] so that the merged attention reproduces each head's context in the metric of
    o_proj: minimise sum_i ||(A'_i - A_i) v_g L_i||^2 / sum_i ||A_i v_g L_i||^2 (L_i L_i^T = O_i^T O_i)
    on calibration tokens. Only these complex scales move (2 * d/2 * (|S| + readers) numbers), so the
    merged key stays a rotary key and the scales still fold into W_Q; Adam on multiplicative corrections.

    The data are the first `max_windows` calibration rows (global rows, so under data parallelism each rank
    takes the ones it holds); with dp the loss and its gradients are summed over the ranks (float64) before
    each Adam step, so every rank takes the same steps as one process.
    """
    d = attn.head_dim
    kv_of = attn.kv_head_of
    heads = sorted(head_gamma)
    parallel = dp is not None and dp.world > 1
    data = []
    with torch.no_grad():
        for cap, rows in zip(captures, _global_rows(captures, parallel)):
            take = [p for p, row in enumerate(rows) if row < max_windows]
            if not take:
                continue
            x = cap["x"][take] if take != list(range(len(take))) else cap["x"][:len(take)]
            q, k, v = split_qkv(attn, x)
            kw = cap["kwargs"]
            qt = kw.get("qk_transform")
            qr, kr = qt(q, k)
            qc = to_complex(qr[:, heads]).to(torch.complex64)  # (B, H, T, d/2), rotated
            kc = to_complex(kr[:, group]).to(torch.complex64)  # (B, |S|, T, d/2)
            t = q.shape[2]
            mask = _causal_or_padding(kw, t, t, x.device)
            if mask is not None and mask.dim() == 4:
                mask = mask[take]
            w_list = []
            for i in heads:
                o = attn.o_proj.weight[:, i * d:(i + 1) * d].detach().double()
                chol = torch.linalg.cholesky(o.T @ o + 1e-9 * torch.eye(d, dtype=torch.float64))
                w_list.append((v[:, kv_of[i]].double() @ chol).float())  # (B, T, d)
            wv = torch.stack(w_list, dim=1)  # (B, H, T, d)
            scores = torch.einsum("bhtd,bhsd->bhts", qr[:, heads], kr.index_select(
                1, torch.tensor([kv_of[i] for i in heads]))) * attn.softmax_scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            target = torch.softmax(scores.float(), -1) @ wv
            data.append((qc, kc, wv, mask, target, float(target.pow(2).sum())))
    c0 = cs.to(torch.complex64)
    g0 = torch.stack([head_gamma[i] for i in heads]).to(torch.complex64)  # (H, d/2)
    dc = torch.zeros(c0.shape + (2,), requires_grad=True)
    dg = torch.zeros(g0.shape + (2,), requires_grad=True)
    opt = torch.optim.Adam([dc, dg], lr=lr)
    scale = attn.softmax_scale
    norm = 0.0
    for *_, tnorm in data:
        norm += tnorm
    if parallel:
        norm = dp.sum_float(norm)

    def loss_fn():
        c = c0 * (1 + torch.view_as_complex(dc))
        g = g0 * (1 + torch.view_as_complex(dg))
        total = (dc.sum() + dg.sum()) * 0.0  # a rank holding none of the rows adds zero (with a gradient)
        for qc, kc, wv, mask, target, tnorm in data:
            z = torch.einsum("bgtf,fg->btf", kc, c)  # (B, T, d/2)
            a = qc * g.conj()[None, :, None, :]  # (B, H, T, d/2)
            logits = (a.real @ z.real.transpose(-1, -2)[:, None] + a.imag @ z.imag.transpose(-1, -2)[:, None]) * scale
            if mask is not None:
                logits = logits.masked_fill(~mask, float("-inf"))
            out = torch.softmax(logits, -1) @ wv
            total = total + (out - target).pow(2).sum()
        return total / norm

    with torch.enable_grad():
        best = (float("inf"), None)
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn()
            value = float(loss.detach())
            loss.backward()
            if parallel:  # the loss and the gradient of every rank's rows, summed
                value_t, g_dc, g_dg = dp.sum_many([torch.tensor([value], dtype=torch.float64), dc.grad, dg.grad])
                value = float(value_t[0])
                dc.grad, dg.grad = g_dc.to(dc.dtype), g_dg.to(dg.dtype)
            if value < best[0]:
                best = (value, (dc.detach().clone(), dg.detach().clone()))
            opt.step()
        with torch.no_grad():
            value = float(loss_fn())
            if parallel:
                value = dp.sum_float(value)
        if value < best[0]:
            best = (value, (dc.detach().clone(), dg.detach().clone()))
    dc_best, dg_best = best[1]
    c = (c0 * (1 + torch.view_as_complex(dc_best))).to(torch.complex128)
    g = (g0 * (1 + torch.view_as_complex(dg_best))).to(torch.complex128)
    return c, {i: g[n] for n, i in enumerate(heads)}
