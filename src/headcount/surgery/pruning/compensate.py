"""Pruning with compensation, layer by layer in order, on calibration inputs.

The model is walked one layer at a time (never a full forward per layer): the input of layer 0 is
captured once per batch (a pre-hook on the public `model.layers[0]`, which also hands over the
keyword arguments the model passes its layers: rotary hook, padding mask), then each layer is called
on two streams of hidden states:

    pruned stream     the model as it is being pruned (layers below l already pruned and refit)
    original stream   the unpruned model (only for the targets that need it)

For a layer with heads to remove, the unpruned layer runs once on the pruned stream (capturing
o_proj's input, the contexts Z [tokens, n_heads * head_dim], and its output), the heads are removed
structurally (MultiHeadAttention.prune_heads), o_proj is rewritten, and the pruned layer is run again
to move the pruned stream on. Compensation:

    "none"   nothing: the removed heads' columns of o_proj are simply gone (== head_gates 0).
    "mean"   FLAP: bias += W_O[:, removed] @ mean(Z[:, removed]) over calibration tokens.
    "lstsq"  o_proj refit on the kept heads' contexts (plus a bias; bias=False or Gemma 3: the bias stays
             what it was, none, see refit_bias) to reproduce a target T in the
             least-squares sense, ridge-regularised towards the ORIGINAL weights of the kept columns:
                 min_{W, b} ||[Z_keep 1] [W b]^T - T||^2 + lam ||W - W_O[:, keep]||^2,
                 lam = ridge * mean(diag(Z_keep^T Z_keep))
             (prior="zero" regularises towards 0 instead: headcount.analysis.refit.ridge_solve).
             target: "output"   T = the unpruned layer's attention output on the ORIGINAL stream:
                                    the refit also absorbs the drift the layers below left;
                     "local"    T = the unpruned layer's attention output on the pruned stream;
                     "residual" T = original-stream (input + attention output) - pruned-stream input:
                                    the sum entering the rest of the layer is matched.
Gram sums are float64 (headcount.analysis.refit.GramStats); activations are never all kept.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from headcount.analysis.objectives import require_finite
from headcount.analysis.refit import GramStats, ridge_solve

Tensor = torch.Tensor

COMPENSATIONS = ("none", "mean", "lstsq")
TARGETS = ("output", "local", "residual")
PRIORS = ("original", "zero")
DEFAULT_RIDGE = 0.05
DEFAULT_TARGET = "output"


@dataclass
class LayerFit:
    """One pruned layer: relative squared error of its attention output against the target,
    ||out - T||^2 / ||T||^2 on calibration tokens, with no compensation and after compensating."""

    layer: int
    removed: list[int]  # original head indices
    error_none: float
    error_after: float
    tokens: int

    def to_json(self) -> dict:
        return asdict(self)


NO_O_PROJ_BIAS = ("gemma3",)  # families whose llama.cpp graph has no attn_output bias and cannot fold one


def refit_bias(model) -> bool:
    """The default of `bias`: may the lstsq refit give o_proj a bias? Not for Gemma 3: llama.cpp's gemma3 graph
    has no attn_output bias and its post-attention norm follows o_proj (a bias cannot be folded away), so a bias
    would make the pruned model impossible to export to GGUF. Elsewhere deci / transformers write it."""
    return getattr(model.config, "family", None) not in NO_O_PROJ_BIAS


class _Stop(Exception):
    pass


def _layer_inputs(model, ids: Tensor, mask: Tensor | None) -> tuple[Tensor, dict]:
    """(hidden state entering layer 0, the keyword arguments the model gives its layers)."""
    box: dict = {}

    def pre(module, args, kwargs):
        box["x"], box["kwargs"] = args[0], dict(kwargs)
        raise _Stop

    handle = model.layers[0].register_forward_pre_hook(pre, with_kwargs=True)
    try:
        if hasattr(model, "lm_head"):
            model(ids, attention_mask=mask, compute_logits=False)
        else:
            model(ids, mask)
    except _Stop:
        pass
    finally:
        handle.remove()
    return box["x"], box["kwargs"]


def _flat(t: Tensor, sel: Tensor | None) -> Tensor:
    t = t.reshape(-1, t.shape[-1])
    return t[sel] if sel is not None else t


def _objective(stats: GramStats, sol: Tensor) -> float:
    """||X1 sol - Y||^2 from the Gram sums (sol [D+1, d_model], bias row last)."""
    return float(stats.yty.sum() - 2 * (sol * stats.xty).sum() + (sol * (stats.xtx @ sol)).sum())


def solve_toward(stats: GramStats, w0: Tensor, *, ridge: float, b0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """min ||X1 [W b]^T - Y||^2 + lam ||W - w0||^2; w0 [d_model, D]. float64 results.

    b0 None: the bias b is free. b0 [d_model]: the bias is FIXED at b0 (no new bias: what a target with no
    o_proj bias, llama.cpp's gemma3, can hold), and only W is solved: min ||X W^T - (Y - b0)||^2 + lam ||W - w0||^2,
    whose normal equations are the Gram block without the ones column and X^T Y - (X^T 1) b0^T."""
    d = stats.n_inputs
    lam = ridge * float(stats.xtx.diagonal()[:d].mean()) if d else 0.0
    n = d + 1 if b0 is None else d
    a = stats.xtx[:n, :n].clone()
    a.diagonal()[:d] += lam
    rhs = stats.xty[:n].clone()
    rhs[:d] += lam * w0.T.double()
    if b0 is not None:
        rhs -= stats.xtx[:d, d:d + 1] * b0.double()[None]
    chol, info = torch.linalg.cholesky_ex(a)
    sol = torch.cholesky_solve(rhs, chol) if int(info) == 0 else torch.linalg.lstsq(a, rhs).solution
    return sol[:d].T.contiguous(), (sol[d].clone() if b0 is None else b0.double().clone())


def _set_o_proj(attn, weight: Tensor, bias: Tensor) -> None:
    """Write o_proj's weight and bias; an o_proj without a bias gets one (a new public Linear) unless the
    bias is exactly zero (the no-bias refit), which leaves it without one."""
    old = attn.o_proj
    with torch.no_grad():
        if old.bias is None and not bool(bias.abs().max() > 0):
            old.weight.copy_(weight.to(old.weight))
            return
        if old.bias is None:
            new = nn.Linear(old.in_features, old.out_features, bias=True, device=old.weight.device,
                            dtype=old.weight.dtype)
            new.weight.requires_grad_(old.weight.requires_grad)
            attn.o_proj = new
        attn.o_proj.weight.copy_(weight.to(old.weight))
        attn.o_proj.bias.copy_(bias.to(old.weight))


def prune_sequential(model, plan: dict[int, list[int]], batches: list[tuple[Tensor, Tensor | None]], *,
                     compensate: str, ridge: float = DEFAULT_RIDGE, target: str = DEFAULT_TARGET,
                     prior: str = "original", progress: bool = True, group=None,
                     bias: bool | None = None) -> list[LayerFit]:
    """Remove plan[layer] (ORIGINAL head indices) layer by layer, compensating; returns one LayerFit per
    pruned layer. batches: [(input_ids [B, T], attention_mask [B, T] or None)], THIS rank's share when
    `group` is a process group: each layer's sums are all-reduced in float64 before the solve, so every
    rank computes the same o_proj (equal to one process's to float64 summation order).

    bias: may the lstsq refit give o_proj a (new) bias? None = refit_bias(model) (no, for Gemma 3)."""
    from tqdm.auto import tqdm

    from headcount.distributed import DataParallel

    dp = DataParallel(group)
    if compensate not in ("mean", "lstsq"):
        raise ValueError(f"compensate: expected 'mean' or 'lstsq' here, got {compensate!r}")
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    if prior not in PRIORS:
        raise ValueError(f"prior: expected one of {PRIORS}, got {prior!r}")
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or ridge < 0:
        raise ValueError(f"ridge: expected a float >= 0, got {ridge!r}")
    fit_bias = refit_bias(model) if bias is None else bool(bias)
    if not plan:
        return []
    need_orig = compensate == "lstsq" and target in ("output", "residual")
    device = model.embed.weight.device
    fits: list[LayerFit] = []
    with torch.no_grad():
        streams = []  # per batch: [pruned x, original x, layer kwargs, token selector]
        for ids, mask in batches:
            ids = ids.to(device)
            mask = None if mask is None else mask.to(device)
            x, kwargs = _layer_inputs(model, ids, mask)
            sel = None if mask is None else mask.reshape(-1).bool()
            streams.append([x, x if need_orig else None, kwargs, sel])
        last = max(plan)
        bar = tqdm(total=last + 1, desc=f"pruning ({compensate})", unit="layer", disable=None if progress else True,
                   leave=False)
        for l in range(last + 1):
            layer = model.layers[l]
            if l not in plan:
                for s in streams:
                    shared = s[1] is s[0]  # no layer pruned yet: the two streams are one
                    s[0] = require_finite(layer(s[0], **s[2])[0], f"layer {l}'s output")
                    if need_orig:
                        s[1] = s[0] if shared else layer(s[1], **s[2])[0]
                bar.update(1)
                continue
            attn = layer.attn
            kept = list(attn.kept_heads)
            removed_cur = sorted(kept.index(h) for h in plan[l])
            keep_cur = [h for h in range(attn.n_heads) if h not in set(removed_cur)]
            dh = attn.head_dim
            keep_cols = torch.tensor([h * dh + j for h in keep_cur for j in range(dh)], device=device)
            drop_cols = torch.tensor([h * dh + j for h in removed_cur for j in range(dh)], device=device)
            w_full = attn.o_proj.weight.detach().double()
            b_full = (attn.o_proj.bias.detach().double() if attn.o_proj.bias is not None
                      else torch.zeros(w_full.shape[0], dtype=torch.float64, device=device))
            cap: dict = {}

            def pre(module, args):
                cap["z"] = args[0].detach()
                if cap.get("stop") == "z":
                    raise _Stop  # only o_proj's input was wanted: skip o_proj and the rest of the layer

            def post(module, args, output):
                cap["y"] = output.detach()
                if cap.get("stop") == "y":
                    raise _Stop  # only the attention output was wanted: skip the rest of the layer

            h_pre = attn.o_proj.register_forward_pre_hook(pre)
            h_post = attn.o_proj.register_forward_hook(post)
            stats, zsum, n_tok = None, None, 0
            try:
                for s in streams:
                    x_p, x_o, kwargs, sel = s
                    shared = need_orig and x_o is x_p  # the first pruned layer: one pass serves both streams
                    if not shared:  # the unpruned layer on the pruned stream, up to what is wanted
                        cap["stop"] = "z" if need_orig else "y"
                        try:
                            layer(x_p, **kwargs)
                        except _Stop:
                            pass
                        cap["stop"] = None
                        z = cap["z"]
                    if need_orig:
                        x_o_next = layer(x_o, **kwargs)[0]
                        z = cap["z"] if shared else z
                        t = _flat(cap["y"], sel).double()
                        if target == "residual":
                            t = t + _flat(x_o, sel).double() - _flat(x_p, sel).double()
                        s[1] = x_o_next
                    else:
                        t = _flat(cap["y"], sel).double()  # local target
                    z = _flat(z, sel)
                    zk = z.index_select(1, keep_cols).double()  # columns first: only what is summed is widened
                    x1 = torch.cat([zk, torch.ones(zk.shape[0], 1, dtype=zk.dtype, device=device)], dim=1)
                    part = GramStats(x1.T @ x1, x1.T @ t, (t * t).sum(0), int(zk.shape[0]))
                    stats = part if stats is None else stats + part
                    zr = z.index_select(1, drop_cols).double().sum(0)
                    zsum = zr if zsum is None else zsum + zr
                    n_tok += z.shape[0]
            finally:
                h_pre.remove()
                h_post.remove()
            if dp.world > 1:  # float64 sums over every rank's tokens
                stats = GramStats(dp.sum(stats.xtx), dp.sum(stats.xty), dp.sum(stats.yty),
                                  int(dp.sum(torch.tensor(float(stats.n_tokens)))))
                zsum = dp.sum(zsum)
                n_tok = stats.n_tokens
            w_keep = w_full.index_select(1, keep_cols)
            sol_none = torch.cat([w_keep.T, b_full[None]], dim=0)
            if compensate == "mean":
                new_bias = b_full + w_full.index_select(1, drop_cols) @ (zsum / max(n_tok, 1))
                weight = w_keep
            elif prior == "zero" and fit_bias:
                weight, new_bias = ridge_solve(stats, range(stats.n_inputs), ridge=ridge)
            else:  # towards the original weights, or towards zero with the bias held at the original one
                w0 = w_keep if prior == "original" else torch.zeros_like(w_keep)
                weight, new_bias = solve_toward(stats, w0, ridge=ridge, b0=None if fit_bias else b_full)
            sol_after = torch.cat([weight.T, new_bias[None]], dim=0)
            norm = max(float(stats.yty.sum()), 1e-30)
            fits.append(LayerFit(l, list(plan[l]), _objective(stats, sol_none) / norm,
                                 _objective(stats, sol_after) / norm, n_tok))
            attn.prune_heads(removed_cur)
            _set_o_proj(attn, weight, new_bias)
            for s in streams:
                s[0] = require_finite(layer(s[0], **s[2])[0], f"layer {l}'s output")
            bar.update(1)
        bar.close()
    return fits
