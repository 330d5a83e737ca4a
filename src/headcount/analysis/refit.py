"""Least-squares refit of o_proj: Gram statistics of its input contexts, ridge solves, removal errors.

READ-ONLY math shared by `importance(method="reconstruction")` and the pruning in headcount.surgery
(which writes the solved weights; nothing here changes a model).

Notation, per layer: X [N, D] = the input of `attn.o_proj` on N calibration tokens (D = n_heads *
head_dim, head h owns columns h*head_dim .. (h+1)*head_dim - 1 of the CURRENT module), X1 = [X | 1]
(a ones column LAST, for the bias), Y [N, d_model] = the target layer output (by default the same
o_proj's output, Y = o_proj(X), so the unpruned layer reproduces it exactly).

    GramStats(xtx [D+1, D+1], xty [D+1, d_model], yty [d_model], n_tokens)    float64 sums over tokens
        xtx = X1^T X1, xty = X1^T Y, yty[j] = sum_t Y[t, j]^2 (per output dim, for weighted errors)

    collect_o_proj_stats(model, windows, layers=None, *, batch_size=4, reference=None,
                         stop_early=True, progress=True) -> {layer: GramStats}
        windows: a LongTensor [N, T] of token windows (decoders: batches.token_windows), or a list of
        (input_ids [B, T], attention_mask [B, T]) batches (encoders: batches.sentence_batches; padded
        positions are left out). A forward pre-hook on the public `model.layers[i].attn.o_proj`
        captures X and a forward hook its output; only the Gram sums are kept (never all
        activations). reference: another model with the same layers run on the same inputs whose
        layer-i o_proj OUTPUT is the target Y (sequential refit: `model` has its layers < l already
        pruned, `reference` is the unpruned model, so the refit also corrects the drift from below).
        stop_early: stop each forward after the highest requested layer (no logits computed).

    ridge_solve(stats, keep_cols, *, ridge=1e-3, fit_bias=True) -> (weight [d_model, K], bias [d_model])
        argmin_W,b ||Y - X[:, keep] W^T - b||^2 + lam ||W||^2 with lam = ridge * mean(diag(X^T X)) over
        ALL D columns (so lam does not depend on which columns are kept); the bias is not penalised.
        fit_bias=False: b = 0 (bias returned as zeros). float64; cast with .to(o_proj.weight).

    removal_errors(stats, kept_cols_by_head, *, ridge=1e-3, weights=None, fit_bias=True) -> [H] float64
        kept_cols_by_head: the column lists of the heads still present (a list, one per head; the
        refit uses the union of all of them, plus the bias). Entry h = the minimised ridge objective
        (residual sum of squares + lam ||W||^2, summed over output dims with `weights` [d_model],
        default 1) when head h's columns are removed too and o_proj is refit on the rest. Closed form
        from one inverse of the kept Gram block: the increase over keeping head h is
        beta_S^T (P_SS)^{-1} beta_S (P = the inverse, beta = the full solution, S = head h's columns).

    RemovalSequence(stats, kept_cols_by_head, ...): .errors() is removal_errors, .remove(j) takes head j out
        (a downdate of the inverse, no new one): the greedy reconstruction order's loop, one inverse per layer.

    objective(stats, keep_cols, *, ridge, weights=None, fit_bias=True) -> float    the same quantity
        for one explicit column set (the brute-force definition removal_errors is tested against).

    head_columns(attn) -> [[cols of head 0], [cols of head 1], ...] for a MultiHeadAttention.

Example (what sequential pruning does for layer l):
    stats = collect_o_proj_stats(pruned_so_far, windows, layers=[l], reference=original)[l]
    cols = head_columns(pruned_so_far.layers[l].attn)
    keep = [c for h, hc in enumerate(cols) if h not in drop for c in hc]
    weight, bias = ridge_solve(stats, keep)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

Tensor = torch.Tensor

DEFAULT_RIDGE = 1e-3


@dataclass
class GramStats:
    """float64 sums over calibration tokens for one layer's o_proj (see the module docstring)."""

    xtx: Tensor  # [D+1, D+1], ones column last
    xty: Tensor  # [D+1, d_model]
    yty: Tensor  # [d_model]
    n_tokens: int

    @property
    def n_inputs(self) -> int:
        """D: o_proj's input width (without the ones column)."""
        return self.xtx.shape[0] - 1

    def __add__(self, other: "GramStats") -> "GramStats":
        return GramStats(self.xtx + other.xtx, self.xty + other.xty, self.yty + other.yty,
                         self.n_tokens + other.n_tokens)


def head_columns(attn) -> list[list[int]]:
    """Column indices of o_proj owned by each current head of a MultiHeadAttention."""
    dh = attn.head_dim
    return [list(range(h * dh, (h + 1) * dh)) for h in range(attn.n_heads)]


# ------------------------------------------------------------------------------------------ capture
class _Stop(Exception):
    """Raised by a hook to end a forward once every needed layer has been captured."""


def _layer_list(model, layers) -> list[int]:
    n = len(model.layers)
    if layers is None:
        return list(range(n))
    if isinstance(layers, int):
        layers = [layers]
    out = sorted({int(i) for i in layers})
    bad = [i for i in out if not 0 <= i < n]
    if bad or not out:
        raise ValueError(f"layers: expected layer indices in [0, {n}), got {list(layers)!r}")
    return out


def _batches(windows, batch_size: int) -> list[tuple[Tensor, Tensor | None]]:
    if isinstance(windows, Tensor):
        if windows.dim() != 2 or windows.dtype != torch.long:
            raise ValueError(f"windows: expected a LongTensor [N, T], got {windows.dtype} {list(windows.shape)}")
        if windows.shape[0] == 0:
            raise ValueError("windows: expected at least one window, got none")
        return [(windows[i:i + batch_size], None) for i in range(0, windows.shape[0], batch_size)]
    batches = list(windows)
    if not batches or not all(isinstance(b, (tuple, list)) and len(b) == 2 for b in batches):
        raise ValueError("windows: expected a LongTensor [N, T] or a non-empty list of (input_ids, attention_mask)")
    return [(ids, mask) for ids, mask in batches]


def _run(model, ids: Tensor, mask: Tensor | None) -> None:
    device = model.embed.weight.device
    ids = ids.to(device)
    try:
        if hasattr(model, "lm_head"):
            model(ids, attention_mask=None if mask is None else mask.to(device), compute_logits=False)
        else:
            model(ids, None if mask is None else mask.to(device))
    except _Stop:
        pass


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=None if enabled else True, leave=False)  # silent when piped


def collect_o_proj_stats(model, windows, layers: Iterable[int] | int | None = None, *, batch_size: int = 4,
                         reference=None, stop_early: bool = True, progress: bool = True) -> dict[int, GramStats]:
    """Gram statistics of each requested layer's o_proj input (and target output) on `windows`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    layers = _layer_list(model, layers)
    if reference is not None and len(reference.layers) != len(model.layers):
        raise ValueError(f"reference: expected a model with {len(model.layers)} layers, got {len(reference.layers)}")
    last = layers[-1]
    stats: dict[int, GramStats] = {}
    current: dict = {}  # per batch: the token mask [B*T] bool or None
    captured_x: dict[int, Tensor] = {}
    captured_y: dict[int, Tensor] = {}
    handles = []

    def flat(t: Tensor) -> Tensor:
        t = t.reshape(-1, t.shape[-1])
        sel = current.get("mask")
        return t[sel] if sel is not None else t

    def make_pre(i):
        def pre(module, args):
            captured_x[i] = flat(args[0].detach()).double()
        return pre

    def make_post(i, stop_here: bool, is_target: bool):
        def post(module, args, output):
            if is_target:
                captured_y[i] = flat(output.detach()).double()
            if stop_here:
                raise _Stop
        return post

    for i in layers:
        o_proj = model.layers[i].attn.o_proj
        handles.append(o_proj.register_forward_pre_hook(make_pre(i)))
        handles.append(o_proj.register_forward_hook(
            make_post(i, stop_early and i == last, reference is None)))
        if reference is not None:
            handles.append(reference.layers[i].attn.o_proj.register_forward_hook(
                make_post(i, stop_early and i == last, True)))
    batches = _batches(windows, batch_size)
    try:
        with torch.no_grad(), _progress(len(batches), "o_proj statistics", progress) as bar:
            for ids, mask in batches:
                current["mask"] = None if mask is None else mask.reshape(-1).bool().to(model.embed.weight.device)
                captured_x.clear()
                captured_y.clear()
                _run(model, ids, mask)
                if reference is not None:
                    _run(reference, ids, mask)
                for i in layers:
                    x, y = captured_x[i], captured_y[i]
                    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)
                    s = GramStats(x1.T @ x1, x1.T @ y, (y * y).sum(0), int(x.shape[0]))
                    stats[i] = s if i not in stats else stats[i] + s
                bar.update(1)
    finally:
        for h in handles:
            h.remove()
    return stats


# -------------------------------------------------------------------------------------------- solve
def _lam(stats: GramStats, ridge: float) -> float:
    if not isinstance(ridge, (int, float)) or isinstance(ridge, bool) or ridge < 0:
        raise ValueError(f"ridge: expected a float >= 0 (relative to the mean diagonal), got {ridge!r}")
    d = stats.n_inputs
    return float(ridge) * float(stats.xtx.diagonal()[:d].mean()) if d else 0.0


def _cols(stats: GramStats, keep_cols, fit_bias: bool) -> Tensor:
    try:
        cols = sorted({int(c) for c in keep_cols})
    except TypeError as err:
        raise TypeError(f"keep_cols: expected an iterable of column indices, got {keep_cols!r}") from err
    d = stats.n_inputs
    bad = [c for c in cols if not 0 <= c < d]
    if bad:
        raise ValueError(f"keep_cols: expected indices in [0, {d}), got {bad[:5]}")
    return torch.tensor(cols + ([d] if fit_bias else []), dtype=torch.long)


def _system(stats: GramStats, idx: Tensor, lam: float) -> tuple[Tensor, Tensor]:
    a = stats.xtx[idx][:, idx].clone()
    d = stats.n_inputs
    pen = (idx != d).to(a.dtype) * lam  # no penalty on the bias
    a.diagonal().add_(pen)
    return a, stats.xty[idx]


def _solve(a: Tensor, c: Tensor) -> Tensor:
    if a.shape[0] == 0:
        return c.new_zeros(0, c.shape[1])
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0:
        return torch.cholesky_solve(c, chol)
    return torch.linalg.lstsq(a, c).solution  # singular (ridge 0, collinear columns): least-norm


def ridge_solve(stats: GramStats, keep_cols: Sequence[int], *, ridge: float = DEFAULT_RIDGE,
                fit_bias: bool = True) -> tuple[Tensor, Tensor]:
    """o_proj (weight [d_model, len(keep_cols)], bias [d_model]) refit on the kept input columns.

    keep_cols are taken in increasing order (the order the columns keep in a pruned o_proj)."""
    idx = _cols(stats, keep_cols, fit_bias)
    a, c = _system(stats, idx, _lam(stats, ridge))
    sol = _solve(a, c)  # [K(+1), d_model]
    if fit_bias:
        return sol[:-1].T.contiguous(), sol[-1].clone()
    return sol.T.contiguous(), torch.zeros(stats.xty.shape[1], dtype=sol.dtype)


def objective(stats: GramStats, keep_cols: Sequence[int], *, ridge: float = DEFAULT_RIDGE,
              weights: Tensor | None = None, fit_bias: bool = True) -> float:
    """The minimised ridge objective ||Y - X_K W^T - b||^2 + lam ||W||^2 (weighted over output dims)."""
    idx = _cols(stats, keep_cols, fit_bias)
    lam = _lam(stats, ridge)
    a, c = _system(stats, idx, lam)
    sol = _solve(a, c)
    # value at the optimum: yty - 2 sol.c + sol^T A sol, per output dim
    per_dim = stats.yty - 2 * (sol * c).sum(0) + (sol * (a @ sol)).sum(0)
    w = _weights(stats, weights)
    return float((per_dim * w).sum())


def _weights(stats: GramStats, weights) -> Tensor:
    d_model = stats.xty.shape[1]
    if weights is None:
        return torch.ones(d_model, dtype=torch.float64, device=stats.xty.device)
    w = torch.as_tensor(weights, dtype=torch.float64, device=stats.xty.device)
    if w.shape != (d_model,):
        raise ValueError(f"weights: expected shape [{d_model}] (one per output dim), got {list(w.shape)}")
    return w


def removal_errors(stats: GramStats, kept_cols_by_head: Sequence[Sequence[int]], *,
                   ridge: float = DEFAULT_RIDGE, weights: Tensor | None = None,
                   fit_bias: bool = True) -> Tensor:
    """[H] float64: the refit objective after removing each listed head (see the module docstring)."""
    return RemovalSequence(stats, kept_cols_by_head, ridge=ridge, weights=weights, fit_bias=fit_bias).errors()


class RemovalSequence:
    """removal_errors for a sequence of removals (a greedy order removes the cheapest head, then asks again):
    one inverse of the kept Gram block, then per removal the inverse of what is left by a rank-|S| downdate,
    P_RR - P_RS P_SS^-1 P_SR (the Schur complement), and the refit beta_R - P_RS P_SS^-1 beta_S, instead of a
    new inverse per step (a layer of 9 heads: 1 inverse instead of 9).

        seq = RemovalSequence(stats, kept_cols_by_head, ridge=..., weights=...)
        seq.objective()  the objective with every listed head kept
        seq.errors()     [H'] the objective after removing each head still listed (in listed order)
        seq.remove(j)    remove the j-th head still listed
    """

    def __init__(self, stats: GramStats, kept_cols_by_head: Sequence[Sequence[int]], *,
                 ridge: float = DEFAULT_RIDGE, weights: Tensor | None = None, fit_bias: bool = True):
        heads = [sorted({int(c) for c in cols}) for cols in kept_cols_by_head]
        if not heads:
            raise ValueError("kept_cols_by_head: expected at least one head's columns, got none")
        seen: set[int] = set()
        for cols in heads:
            if seen & set(cols):
                raise ValueError("kept_cols_by_head: two heads share a column")
            seen |= set(cols)
        idx = _cols(stats, seen, fit_bias)
        a, self._c = _system(stats, idx, _lam(stats, ridge))
        self._yty, self._w = stats.yty, _weights(stats, weights)
        self._p = _inverse(a)  # [K, K]: rows and columns follow self._idx
        self._beta = self._p @ self._c  # [K, d_model], the refit with every listed head
        self._idx = idx.tolist()
        self._heads = heads

    def _base(self) -> Tensor:
        """Per output dim: yty - c^T A^-1 c, the refit's residual with the columns now kept."""
        return self._yty - (self._beta * self._c).sum(0)

    def objective(self) -> float:
        return float((self._base() * self._w).sum())

    def _positions(self) -> list[Tensor]:
        position = {col: k for k, col in enumerate(self._idx)}
        return [torch.tensor([position[col] for col in cols], dtype=torch.long) for cols in self._heads]

    def errors(self) -> Tensor:
        """[H'] float64: the objective after removing each listed head and refitting on the rest.

        Head h's increase, summed over output dims with weights w, is trace(P_SS^-1 M), M = beta_S diag(w) beta_S^T:
        an inverse of |S| x |S| per head instead of a solve with d_model right-hand sides."""
        base = float((self._base() * self._w).sum())
        positions = self._positions()
        widths = {len(s) for s in positions}
        if len(widths) == 1 and 0 not in widths:  # every head as wide: batched, no loop over heads
            s = torch.stack(positions)  # [H', dh]
            b_s = self._beta[s]  # [H', dh, d_model]
            m = (b_s * self._w) @ b_s.mT  # [H', dh, dh]
            return base + (torch.linalg.inv(self._p[s[:, :, None], s[:, None, :]]) * m).sum((1, 2))
        out = torch.empty(len(positions), dtype=torch.float64)
        for h, s in enumerate(positions):
            b_s = self._beta[s]
            out[h] = base + (float((torch.linalg.inv(self._p[s][:, s]) * ((b_s * self._w) @ b_s.T)).sum())
                             if len(s) else 0.0)
        return out

    def remove(self, j: int) -> None:
        """Remove the j-th head still listed: its columns leave the refit (the downdate in the class doc)."""
        s = self._positions()[j]
        gone = set(s.tolist())
        if not gone:  # a head with no columns: nothing leaves the refit
            del self._heads[j]
            return
        r = torch.tensor([k for k in range(len(self._idx)) if k not in gone], dtype=torch.long)
        p_rs = self._p[r][:, s]
        left = p_rs @ torch.linalg.inv(self._p[s][:, s])  # P_RS P_SS^-1, [K', |S|]
        p = self._p[r][:, r] - left @ p_rs.T
        self._p = (p + p.T) / 2  # symmetric, as the inverse of a symmetric block is
        self._beta = self._beta[r] - left @ self._beta[s]
        self._c = self._c[r]
        self._idx = [self._idx[k] for k in r.tolist()]
        del self._heads[j]


def _inverse(a: Tensor) -> Tensor:
    """The inverse of a symmetric positive definite block (Cholesky), or of any invertible one (LU)."""
    if a.shape[0] == 0:
        return a
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info) != 0:
        return torch.linalg.inv(a)
    # cholesky_solve against I, not cholesky_inverse: the latter took 1.3 s for a 577 x 577 block here (torch 2.13
    # CPU), this 27 ms and LU's inv 79 ms
    return torch.cholesky_solve(torch.eye(a.shape[0], dtype=a.dtype, device=a.device), chol)
