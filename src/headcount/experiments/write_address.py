"""write-address (chapter 2.3.2): o_proj's i-th block of columns is head i's write address.

(a) Real models. Head h writes o_proj.weight[:, h*head_dim:(h+1)*head_dim] @ context_h into the
residual stream, so its write subspace is the column space of that block (rank <= head_dim in
d_model dimensions). Per layer we measure
  - the principal angles between every pair of heads' write subspaces, and their overlap
    ||U_h^T U_g||_F^2 / head_dim (0 = orthogonal subspaces, as disjoint slices would be; 1 = the same
    subspace; a random pair of subspaces gives ~head_dim / d_model);
  - own-slice energy: the share of the block's squared norm in rows h*head_dim..(h+1)*head_dim (1 if
    the head wrote only to "its" slice; head_dim / d_model if its energy were spread evenly);
  - reach: the participation ratio of the block's energy over the d_model coordinates, as a share of
    d_model (head_dim / d_model for a head confined to its slice, up to 1 for an even spread).
(b) A trained ablation: the same byte-level decoder (small.py) with o_proj trained, and with o_proj
replaced by the identity and frozen (d_model = n_heads x head_dim: head h writes exactly slice h),
the same steps and data order; held-out loss (NLL per byte) of each.
"""

from __future__ import annotations

import math

import torch

from headcount.experiments.results import AblationRow, ExperimentResult, mean_std
from headcount.experiments.small import ByteCorpus, byte_decoder, check_heads, held_out_nll, lm_loss, ppl
from headcount.experiments.train import resolve_config, seeded, train

Tensor = torch.Tensor

CLAIM = ("2.3.2: W_O's i-th block is head i's write address: heads write to overlapping, rotated directions of "
         "the residual stream, not to their own slice; without W_O head i could only write to slice i.")
FULL = dict(models=("minilm", "smollm2"), d_model=64, n_heads=4, n_layers=2, seq_len=64, batch_size=16,
            steps=400, seeds=3, lr=3e-3, eval_windows=None)
QUICK = dict(models=("minilm",), d_model=64, n_heads=4, n_layers=1, seq_len=32, batch_size=16, steps=150,
             seeds=1, lr=3e-3, eval_windows=128)
VARIANTS = ("o_proj (trained)", "no o_proj (identity, frozen)")


# ------------------------------------------------------------------------------------- geometry
def orthonormal_basis(block: Tensor, rtol: float = 1e-6) -> Tensor:
    """An orthonormal basis [d, r] of the column space of block [d, k] (r = its numerical rank)."""
    u, s, _ = torch.linalg.svd(block.double(), full_matrices=False)
    rank = int((s > rtol * s.max()).sum()) if s.numel() and s.max() > 0 else 0
    return u[:, :rank]


def principal_angles(a: Tensor, b: Tensor) -> Tensor:
    """Principal angles (radians, ascending) between the column spaces of a [d, k] and b [d, m]:
    arccos of the singular values of U_a^T U_b (Björck & Golub)."""
    ua, ub = orthonormal_basis(a), orthonormal_basis(b)
    cos = torch.linalg.svdvals(ua.T @ ub).clamp(-1.0, 1.0)
    return torch.arccos(cos).sort().values


def head_blocks(o_weight: Tensor, n_heads: int) -> list[Tensor]:
    """o_proj.weight [d_model, n_heads * head_dim] -> each head's block [d_model, head_dim]."""
    head_dim = o_weight.shape[1] // n_heads
    return [o_weight[:, h * head_dim:(h + 1) * head_dim] for h in range(n_heads)]


def layer_geometry(o_weight: Tensor, n_heads: int) -> dict:
    """Pairwise angles / overlaps, own-slice energy and reach of one layer's heads (see the module doc)."""
    w = o_weight.detach().double()
    d_model = w.shape[0]
    blocks = head_blocks(w, n_heads)
    head_dim = blocks[0].shape[1]
    bases = [orthonormal_basis(b) for b in blocks]
    overlaps, mean_angles, min_angles = [], [], []
    for i in range(n_heads):
        for j in range(i + 1, n_heads):
            cos = torch.linalg.svdvals(bases[i].T @ bases[j]).clamp(-1.0, 1.0)
            angles = torch.rad2deg(torch.arccos(cos))
            overlaps.append(float((cos ** 2).sum()) / min(bases[i].shape[1], bases[j].shape[1]))
            mean_angles.append(float(angles.mean()))
            min_angles.append(float(angles.min()))
    own, reach, ranks = [], [], []
    for h, block in enumerate(blocks):
        energy = (block ** 2).sum(dim=1)  # per residual coordinate
        total = float(energy.sum())
        own.append(float(energy[h * head_dim:(h + 1) * head_dim].sum()) / total if total > 0 else math.nan)
        p = energy / energy.sum()
        reach.append(float(1.0 / (p ** 2).sum()) / d_model)
        ranks.append(bases[h].shape[1])
    union = int(torch.linalg.matrix_rank(w))
    return {"n_heads": n_heads, "head_dim": head_dim, "d_model": d_model,
            "mean_pairwise_angle_deg": _mean(mean_angles), "min_pairwise_angle_deg": min(min_angles, default=math.nan),
            "mean_overlap": _mean(overlaps), "own_slice_energy": _mean(own), "reach": _mean(reach),
            "head_rank": min(ranks), "union_rank": union}


def random_overlap(d_model: int, head_dim: int, pairs: int = 64, seed: int = 0) -> float:
    """Mean overlap ||U_a^T U_b||_F^2 / head_dim of random head_dim-dim subspaces of R^d_model."""
    gen = torch.Generator().manual_seed(seed)
    vals = []
    for _ in range(pairs):
        a = orthonormal_basis(torch.randn(d_model, head_dim, generator=gen, dtype=torch.float64))
        b = orthonormal_basis(torch.randn(d_model, head_dim, generator=gen, dtype=torch.float64))
        vals.append(float((torch.linalg.svdvals(a.T @ b) ** 2).sum()) / head_dim)
    return _mean(vals)


def model_geometry(model) -> dict:
    """layer_geometry for every layer of a headcount model (through the public model.layers[i].attn)."""
    layers = [layer_geometry(layer.attn.o_proj.weight, layer.attn.n_heads) for layer in model.layers]
    first = layers[0]
    keys = ("mean_pairwise_angle_deg", "min_pairwise_angle_deg", "mean_overlap", "own_slice_energy", "reach")
    return {"layers": layers, "n_layers": len(layers), "d_model": first["d_model"], "n_heads": first["n_heads"],
            "head_dim": first["head_dim"], **{k: _mean([g[k] for g in layers]) for k in keys},
            "slice_share": first["head_dim"] / first["d_model"],
            "random_overlap": random_overlap(first["d_model"], first["head_dim"])}


def _mean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


# ------------------------------------------------------------------------------------- ablation
def without_o_proj(model) -> None:
    """Replace every layer's o_proj by the identity and freeze it: head h writes exactly to slice h."""
    for layer in model.layers:
        attn = layer.attn
        if attn.n_heads * attn.head_dim != attn.d_model:
            raise ValueError(f"no o_proj needs d_model = n_heads x head_dim, got {attn.d_model} != "
                             f"{attn.n_heads} x {attn.head_dim}")
        with torch.no_grad():
            attn.o_proj.weight.copy_(torch.eye(attn.d_model))
        attn.o_proj.weight.requires_grad_(False)
        if attn.o_proj.bias is not None:
            with torch.no_grad():
                attn.o_proj.bias.zero_()
            attn.o_proj.bias.requires_grad_(False)


def run(*, quick: bool = False, seed: int = 0, steps: int | None = None, seeds: int | None = None,
        progress: bool = True, **options) -> ExperimentResult:
    cfg = resolve_config("write-address", quick, QUICK, FULL, options, steps=steps, seeds=seeds)
    cfg["n_heads"] = check_heads((cfg["n_heads"],), cfg["d_model"], name="n_heads")[0]
    from headcount.models import load

    real = {}
    for name in cfg["models"]:
        real[name] = model_geometry(load(name))

    corpus = ByteCorpus.load()
    windows = corpus.held_out_windows(cfg["seq_len"], cfg["eval_windows"])
    rows, trained_geometry = [], {}
    for variant in VARIANTS:
        losses = []
        for s in range(cfg["seeds"]):
            gen = seeded(seed + s)
            model = byte_decoder(cfg["d_model"], cfg["n_heads"], cfg["n_layers"], cfg["seq_len"])
            if variant != VARIANTS[0]:
                without_o_proj(model)
            train(model, lambda step: corpus.batch(gen, cfg["batch_size"], cfg["seq_len"]), lm_loss,
                  steps=cfg["steps"], lr=cfg["lr"], weight_decay=0.01, desc=f"write-address {variant} seed={seed + s}",
                  progress=progress)
            losses.append(held_out_nll(model, windows))
            if s == 0:
                geo = model_geometry(model)
                trained_geometry[variant] = {k: geo[k] for k in ("mean_overlap", "own_slice_energy", "reach")}
        mean, std = mean_std(losses)
        rows.append(AblationRow(variant=variant, loss=mean, loss_std=std, loss_seeds=losses, ppl=ppl(mean),
                                trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad)))
    details = {"real_models": real, "trained_small_model_geometry": trained_geometry}
    return ExperimentResult("write-address", CLAIM, quick, cfg, rows, details, _notes(rows, real))


def _notes(rows: list[AblationRow], real: dict) -> list[str]:
    notes = []
    for name, g in real.items():
        notes.append(f"{name}: own-slice energy {g['own_slice_energy']:.3f} (confined: 1; even spread: "
                     f"{g['slice_share']:.3f}); reach {g['reach']:.2f} of d_model (confined: {g['slice_share']:.3f}); "
                     f"mean pairwise overlap {g['mean_overlap']:.3f} (disjoint slices: 0; random subspaces: "
                     f"{g['random_overlap']:.3f})")
    if len(rows) == 2:
        a, b = rows
        diff = b.loss - a.loss
        notes.append(f"trained ablation: {a.variant} {a.loss:.4f} ± {a.loss_std:.4f}, {b.variant} {b.loss:.4f} ± "
                     f"{b.loss_std:.4f} nats/byte (difference {diff:+.4f})")
    return notes


def format_text(result: ExperimentResult) -> str:
    cfg, d = result.config, result.details
    lines = ["write-address (a): each head's write subspace = the column space of its o_proj block",
             f"{'model':<8} {'layer':>5} {'heads x dim':>11} {'d_model':>7} {'mean angle':>10} {'min angle':>9} "
             f"{'overlap':>7} {'random':>6} {'own-slice':>9} {'even':>5} {'reach':>5} {'union rank':>10}"]
    for name, g in d["real_models"].items():
        for i, layer in enumerate(g["layers"]):
            lines.append(f"{name:<8} {i:>5} {layer['n_heads']:>5} x {layer['head_dim']:<3} {layer['d_model']:>7} "
                         f"{layer['mean_pairwise_angle_deg']:>9.1f}° {layer['min_pairwise_angle_deg']:>8.1f}° "
                         f"{layer['mean_overlap']:>7.3f} {g['random_overlap']:>6.3f} {layer['own_slice_energy']:>9.3f} "
                         f"{g['slice_share']:>5.3f} {layer['reach']:>5.2f} {layer['union_rank']:>10}")
    lines.append("  (angle, overlap: between pairs of heads in a layer; disjoint slices would give 90° and overlap 0; "
                 "own-slice: 1 if confined to its slice; reach: share of d_model coordinates written to)")
    lines.append(f"write-address (b): byte-level decoder, d_model {cfg['d_model']} = {cfg['n_heads']} heads x "
                 f"{cfg['d_model'] // cfg['n_heads']}, {cfg['n_layers']} layer(s), {cfg['steps']} steps, "
                 f"{cfg['seeds']} seed(s); held-out NLL per byte")
    lines.append(f"{'variant':<30} {'loss':>8} {'± std':>7} {'ppl':>7} {'trainable params':>16}")
    for r in result.rows():
        lines.append(f"{r['variant']:<30} {r['loss']:>8.4f} {r['loss_std']:>7.4f} {r['ppl']:>7.3f} "
                     f"{r['trainable_params']:>16,}")
    for variant, g in d.get("trained_small_model_geometry", {}).items():
        lines.append(f"  {variant}: own-slice energy {g['own_slice_energy']:.3f}, reach {g['reach']:.2f}, "
                     f"overlap {g['mean_overlap']:.3f}")
    lines += result.notes
    return "\n".join(lines)


def plot(result: ExperimentResult, ax) -> None:
    d = result.details
    for name, g in d["real_models"].items():
        layers = range(len(g["layers"]))
        line, = ax.plot(layers, [x["own_slice_energy"] for x in g["layers"]], marker="o",
                        label=f"{name}: own-slice energy")
        ax.axhline(g["slice_share"], color=line.get_color(), linestyle=":", label=f"{name}: even spread")
        ax.plot(layers, [x["reach"] for x in g["layers"]], marker="s", linestyle="--", color=line.get_color(),
                label=f"{name}: reach (share of d_model)")
    ax.axhline(1.0, color="grey", linestyle="-", linewidth=0.5, label="a head confined to its own slice: own-slice 1")
    rows = result.rows()
    text = "; ".join(f"{r['variant']}: {r['loss']:.3f}±{r['loss_std']:.3f}" for r in rows)
    ax.set_title(f"write-address. held-out NLL/byte: {text}", fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
