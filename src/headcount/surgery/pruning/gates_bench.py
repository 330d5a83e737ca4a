"""The gates part of `headcount bench surgery` (--part gates): Voita's curve, L0-trained gates against the
retraining-free order at the same head counts, on both models.

    run_gates(quick=False, log, checkpoint=None, png=None, overrides=None) -> dict (JSON-ready)
    render(section, console=None)      one table of quality, one of the kept heads' agreement
    plot(section, path)                one matplotlib PNG (smollm2 perplexity, minilm fidelity vs heads kept)

For every fraction of query heads removed, from fresh copies of the unmodified model:
  retraining-free   headcount.surgery.prune_to(model, fraction) with its defaults (order, compensation,
                    calibration): what `headcount prune --fraction F` does
  l0 + lstsq        train_gates (hard-concrete gates, distillation, Lagrangian on the expected L0), then
                    apply_gates with the default least-squares refit of o_proj (`--method l0`)
  l0 (no refit)     the same gates, compensate="none": the pruned model IS the gated model
  l0 joint          train_gates(joint=True): the gates AND the model's weights (`joint_params`) trained together
                    against the unedited model (Voita's setup), the closed heads removed from the trained model
                    (`--method l0 --joint`)
Both methods calibrate on removal.DEFAULT_CALIBRATION. Quality on held-out text only (surgery/held_out.py):
smollm2 perplexity on held-out prose (default corpus) and code-like text (data.code_corpus); minilm mean
cosine to the unmodified embeddings and Spearman of all pairwise similarities on held-out sentences.
Which heads each method keeps is recorded; `agreement` counts the shared kept heads (and their Jaccard
index) and lists the heads only one method keeps. Each model's section records `weights_sha256`
(models.fingerprint), so the report shows a saved point only for the weights it was measured on.

settings' `methods` picks what runs ("retraining-free", "l0" = both frozen rows, "l0 joint"); with a
checkpoint file, the points of the methods NOT run are kept from it (a joint run does not redo the frozen
ones), each point carrying its own steps.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

# "retraining-free + heal": `headcount prune --heal-steps 200`'s saved --json at that fraction (the same held-out
# windows), copied in by benchmarks/gates_heal_row.py, so the four answers share one table
METHODS = ("retraining-free", "l0 + lstsq", "l0 (no refit)", "l0 joint", "retraining-free + heal")
RUNS = ("retraining-free", "l0", "l0 joint")  # what settings' `methods` may name ("l0": both frozen rows)


def _log(msg: str) -> None:
    print(f"headcount bench surgery: {msg}", file=sys.stderr, flush=True)


def settings(quick: bool) -> dict:
    """quick: 2 fractions per model, few steps (a check that it runs, minutes); full: the curve (training
    <= ~15 minutes per point on 2 cores: 150 steps of 2 windows of 256 tokens for smollm2)."""
    # joint: gates and weights trained together, `headcount prune --method l0 --joint`'s defaults (params None:
    # the joint default, attention; weight_lr None: healing's for them; steps: the CLI's joint default)
    from headcount.surgery.pruning.gates_joint import JOINT_STEPS

    joint = {"methods": RUNS, "joint_params": None, "weight_lr": None,
             "smollm2_joint_steps": None if quick else JOINT_STEPS, "minilm_joint_steps": None if quick else JOINT_STEPS}
    if quick:
        return {"smollm2_fractions": (0.3, 0.5), "minilm_fractions": (0.5, 0.75), "smollm2_steps": 20,
                "minilm_steps": 40, "lr": 0.5, "n_windows": 4, "window": 256, "eval_windows": 2,
                "held_out_sentences": 64, **joint}
    return {"smollm2_fractions": (0.3, 0.5), "minilm_fractions": (0.5, 0.75),
            "smollm2_steps": 150, "minilm_steps": 300, "lr": 0.1, "n_windows": 8, "window": 256, "eval_windows": 4,
            "held_out_sentences": 256, **joint}


def _layout(model) -> dict[int, list[int]]:
    return {l: list(layer.attn.kept_heads) for l, layer in enumerate(model.layers)}


def agreement(kept_a: dict, kept_b: dict) -> dict:
    """Shared kept heads of two {layer: [original heads]} plans, their Jaccard index, and the differences."""
    a = {(int(l), h) for l, hs in kept_a.items() for h in hs}
    b = {(int(l), h) for l, hs in kept_b.items() for h in hs}
    layers = sorted({l for l, _ in a | b})
    return {"shared_kept": len(a & b), "kept": [len(a), len(b)], "jaccard": round(len(a & b) / max(len(a | b), 1), 4),
            "only_l0": sorted(a - b), "only_retraining_free": sorted(b - a),
            "per_layer_kept": {"l0": [sum(1 for x in a if x[0] == l) for l in layers],
                               "retraining-free": [sum(1 for x in b if x[0] == l) for l in layers]}}


def _quality(model, sets, refs) -> dict:
    from headcount.surgery.held_out import evaluate

    values = evaluate(model, sets, refs)
    if refs is None:
        return {"ppl_by_text": {k: float(v) for k, v in values.items()}}
    cos, rho = next(iter(values.values()))
    return {"cosine": float(cos), "spearman": float(rho)}


def _model_section(name: str, fractions, steps: int, cfg: dict, log, save, kept: dict | None = None) -> dict:
    import torch

    from headcount.analysis.batches import is_decoder
    from headcount.data import code_corpus
    from headcount.models import load
    from headcount.models.fingerprint import weights_hash
    from headcount.surgery.held_out import embed, held_out_sets
    from headcount.surgery.pruning.gates import apply_gates, train_gates
    from headcount.surgery.pruning.removal import DEFAULT_CALIBRATION, count_heads, prune_to

    base = load(name).eval()
    decoder = is_decoder(base)
    held = {"prose": None, "code": code_corpus().texts("held_out")} if decoder else None
    sets = held_out_sets(base, held, cfg["eval_windows"], 512, sentences=cfg["held_out_sentences"])
    refs = None if decoder else {k: embed(base, v) for k, v in sets.items()}
    heads = count_heads(base)[0]
    methods = cfg.get("methods", RUNS)
    out = {"model": name, "heads": heads, "steps": steps, "lr": cfg["lr"], "base": _quality(base, sets, refs),
           "weights_sha256": weights_hash(base), "points": [], "agreement": []}
    if kept and kept.get("weights_sha256") in (None, out["weights_sha256"]):  # the points of methods not run now
        runs = {m for m in METHODS if m in methods or (m.startswith("l0 ") and m != "l0 joint" and "l0" in methods)}
        out["points"] = [p for p in kept.get("points", []) if p.get("method") not in runs
                         or p.get("fraction") not in fractions]
        out["agreement"] = [a for a in kept.get("agreement", []) if "l0" not in methods
                            or a.get("fraction") not in fractions]
        for p in out["points"]:
            p.setdefault("steps", kept.get("steps"))
    save()
    for fraction in fractions:
        if "l0 joint" in methods:
            _joint_point(name, base, fraction, cfg.get(f"{name}_joint_steps") or steps, cfg, sets, refs, out, log)
            save()
        if "retraining-free" not in methods and "l0" not in methods:
            continue
        t0 = time.perf_counter()
        rf = copy.deepcopy(base)
        r = prune_to(rf, fraction, progress=False)  # also the agreement's reference when only "l0" runs
        point = {"fraction": fraction, "method": "retraining-free", "heads_kept": r.heads_after, "order": r.order,
                 "seconds": round(time.perf_counter() - t0, 1), **_quality(rf, sets, refs)}
        kept_rf = _layout(rf)
        del rf
        if "retraining-free" in methods:
            out["points"].append(point)
            log(f"  {name} {fraction:.0%} retraining-free: {_fmt(point)}")
            save()
        if "l0" not in methods:
            continue
        torch.manual_seed(0)
        gates = train_gates(base, fraction=fraction, steps=steps, lr=cfg["lr"], calibration=DEFAULT_CALIBRATION,
                            n_windows=cfg["n_windows"], window=cfg["window"], progress=False)
        log(f"  {name} {fraction:.0%} gates: expected L0 {gates.final_expected_l0:.1f} (target {gates.heads_to_keep}), "
            f"{gates.n_removed_closed} closed + {gates.n_removed_ranked} ranked out, loss {gates.final_loss:.4f}, "
            f"{gates.seconds:.0f} s")
        for method, compensate in (("l0 + lstsq", "lstsq"), ("l0 (no refit)", "none")):
            t1 = time.perf_counter()
            m = copy.deepcopy(base)
            res = apply_gates(m, gates, compensate=compensate, calibration=DEFAULT_CALIBRATION, force=True,
                              progress=False)
            point = {"fraction": fraction, "method": method, "heads_kept": res.heads_after, "steps": steps,
                     "seconds": round(gates.seconds + time.perf_counter() - t1, 1),
                     "forward_equivalents": round(gates.forward_equivalents, 1), **_quality(m, sets, refs)}
            del m
            out["points"].append(point)
            log(f"  {name} {fraction:.0%} {method}: {_fmt(point)}")
            save()
        out["agreement"].append({"fraction": fraction, **agreement(gates.kept, kept_rf),
                                 "gates": {k: v for k, v in gates.to_json().items()
                                           if k not in ("history", "loss", "log_alpha", "expected_l0", "target_l0")},
                                 "expected_l0": gates.expected_l0[::max(1, steps // 50)]})
        save()
    return out


def _joint_point(name, base, fraction, steps, cfg, sets, refs, out, log) -> None:
    """Gates and weights trained together on a copy of `base`, the closed heads removed (`--method l0 --joint`)."""
    import torch

    from headcount.surgery.pruning.gates import apply_gates, train_gates
    from headcount.surgery.pruning.removal import DEFAULT_CALIBRATION

    torch.manual_seed(0)
    m = copy.deepcopy(base)
    extra = {"weight_lr": cfg["weight_lr"]} if cfg.get("weight_lr") else {}
    gates = train_gates(m, fraction=fraction, steps=steps, lr=cfg["lr"], calibration=DEFAULT_CALIBRATION,
                        n_windows=cfg["n_windows"], window=cfg["window"], progress=False, joint=True,
                        params=cfg.get("joint_params") or "attention", **extra)
    t1 = time.perf_counter()
    res = apply_gates(m, gates, force=True, progress=False)
    point = {"fraction": fraction, "method": "l0 joint", "heads_kept": res.heads_after, "steps": steps,
             "params": gates.params, "weight_lr": gates.weight_lr, "hard_steps": gates.hard_steps,
             "calibration_tokens": gates.calibration_tokens, "reached": gates.reached,
             "final_expected_l0": round(gates.final_expected_l0, 2), "final_loss": gates.final_loss,
             "seconds": round(gates.seconds + time.perf_counter() - t1, 1),
             "forward_equivalents": round(gates.forward_equivalents, 1), **_quality(m, sets, refs)}
    del m
    out["points"].append(point)
    log(f"  {name} {fraction:.0%} l0 joint ({gates.params}, {steps} steps, weight lr {gates.weight_lr}): "
        f"{_fmt(point)}, E[L0] {gates.final_expected_l0:.1f} / {gates.heads_to_keep}, {gates.seconds:.0f} s")


def _fmt(p: dict) -> str:
    if "ppl_by_text" in p:
        return ", ".join(f"{k} ppl {v:.3f}" for k, v in p["ppl_by_text"].items()) + f" ({p['heads_kept']} heads)"
    return f"cosine {p['cosine']:.4f}, spearman {p['spearman']:.4f} ({p['heads_kept']} heads)"


def run_gates(quick: bool = False, log=_log, checkpoint=None, png=None, overrides: dict | None = None) -> dict:
    """Both models' curves; checkpoint: a JSON file rewritten after every point (its other sections kept)."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)))  # 2 cores unless told otherwise
    cfg = {**settings(quick), **(overrides or {})}
    out: dict = {"quick": quick, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}}
    t0 = time.perf_counter()

    def save() -> None:
        if checkpoint is None:
            return
        try:
            with open(checkpoint) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
        data = data if isinstance(data, dict) else {}
        data["gates"] = out
        with open(checkpoint, "w") as f:
            json.dump(data, f, indent=1, default=str)

    before = {}
    if checkpoint is not None:
        try:
            with open(checkpoint) as f:
                before = (json.load(f).get("gates") or {})
        except (OSError, ValueError, AttributeError):
            before = {}
    for name in ("smollm2", "minilm"):
        fractions, steps = cfg[f"{name}_fractions"], cfg[f"{name}_steps"]
        if not fractions:
            if isinstance(before.get(name), dict):
                out[name] = before[name]  # a model not run now keeps its saved section
            continue
        log(f"{name}: {', '.join(cfg.get('methods', RUNS))} ({steps} steps, lr {cfg['lr']}) at {list(fractions)} removed")
        try:
            out[name] = _model_section(name, fractions, steps, cfg, log, save, kept=before.get(name))
        except Exception as e:  # noqa: BLE001  a benchmark keeps what it measured
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"{name} failed: {type(e).__name__}: {e}")
        save()
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if png is not None:
        plot(out, png)
        out["png"] = str(png)
    save()
    return out


# ------------------------------------------------------------------------------------------- render
def render(section: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = section.get("settings", {})
    kind = "quick" if section.get("quick") else "full"
    table = Table(title=f"L0 gates with the model frozen (l0 + lstsq, l0 no refit) or trained with it (l0 joint) vs "
                        f"retraining-free pruning, held-out text; {kind} settings: smollm2 {s.get('smollm2_steps')} / "
                        f"minilm {s.get('minilm_steps')} frozen steps, gate lr {s.get('lr')}, {s.get('n_windows')} "
                        f"windows of {s.get('window')}")
    for col in ("model", "removed", "heads kept", "method", "prose ppl / cosine", "code ppl / Spearman", "seconds"):
        table.add_column(col, justify="left" if col in ("model", "method") else "right")
    for name in ("smollm2", "minilm"):
        data = section.get(name)
        if not data:
            continue
        if "error" in data:
            console.print(f"{name}: not measured ({data['error']})")
            continue
        base = data["base"]
        if "ppl_by_text" in base:
            table.add_row(name, "0%", str(data["heads"]), "unmodified", f"{base['ppl_by_text']['prose']:.3f}",
                          f"{base['ppl_by_text']['code']:.3f}", "")
        else:
            table.add_row(name, "0%", str(data["heads"]), "unmodified", "1.000", "1.000", "")
        for p in sorted(data["points"], key=lambda p: (p["fraction"], METHODS.index(p["method"])
                                                         if p["method"] in METHODS else len(METHODS))):
            if "ppl_by_text" in p:
                cells = [f"{p['ppl_by_text'][k]:.3f} ({(p['ppl_by_text'][k] / base['ppl_by_text'][k] - 1) * 100:+.0f}%)"
                         for k in ("prose", "code")]
            else:
                cells = [f"{p['cosine']:.4f}", f"{p['spearman']:.4f}"]
            how = p["method"] + (f" ({p['params']}, {p['steps']} steps)" if p.get("params") else "")
            table.add_row(name, f"{p['fraction']:.0%}", str(p["heads_kept"]), how, *cells, f"{p['seconds']:.0f}")
    console.print(table)
    agree = Table(title="Which heads each keeps: L0 gates vs the retraining-free order")
    for col in ("model", "removed", "shared kept", "Jaccard", "only L0", "only retraining-free", "gates: E[L0] / target",
                "removed closed + ranked"):
        agree.add_column(col, justify="left" if col == "model" else "right")
    for name in ("smollm2", "minilm"):
        data = section.get(name)
        if not data or "error" in data:
            continue
        for a in data["agreement"]:
            g = a["gates"]
            agree.add_row(name, f"{a['fraction']:.0%}", f"{a['shared_kept']} / {a['kept'][0]}", f"{a['jaccard']:.2f}",
                          str(len(a["only_l0"])), str(len(a["only_retraining_free"])),
                          f"{g['final_expected_l0']:.1f} / {g['heads_to_keep']}",
                          f"{g['n_removed_closed']} + {g['n_removed_ranked']}")
    console.print(agree)


def plot(section: dict, path) -> None:
    """smollm2 held-out perplexity (prose, code) and minilm fidelity (cosine, Spearman) against heads kept."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"retraining-free": ("C0", "o"), "l0 + lstsq": ("C3", "s"), "l0 (no refit)": ("C2", "^"),
              "l0 joint": ("C1", "D"), "retraining-free + heal": ("C4", "v")}
    for ax, name in zip(axes, ("smollm2", "minilm")):
        data = section.get(name)
        if not data or "error" in data:
            ax.set_title(f"{name}: not measured")
            continue
        keys = ("prose", "code") if "ppl_by_text" in data["base"] else ("cosine", "spearman")
        for method in METHODS:
            pts = sorted((p for p in data["points"] if p["method"] == method), key=lambda p: -p["heads_kept"])
            if not pts:
                continue
            for key in keys:
                if "ppl_by_text" in data["base"]:
                    xs = [data["heads"]] + [p["heads_kept"] for p in pts]
                    ys = [data["base"]["ppl_by_text"][key]] + [p["ppl_by_text"][key] for p in pts]
                else:
                    xs = [data["heads"]] + [p["heads_kept"] for p in pts]
                    ys = [1.0] + [p[key] for p in pts]
                first = key == keys[0]  # prose / cosine solid, code / Spearman dotted; one colour per method
                ax.plot(xs, ys, color=styles[method][0], marker=styles[method][1], linestyle="-" if first else ":",
                        label=f"{method}: {key}")
        ax.set_xlabel("attention heads kept")
        if "ppl_by_text" in data["base"]:
            ax.set_ylabel("held-out perplexity")
            ax.set_yscale("log")
        else:
            ax.set_ylabel("fidelity to the unmodified model")
        ax.invert_xaxis()
        ax.set_title(f"{name} ({data['heads']} heads): L0 gates ({data['steps']} steps) vs retraining-free")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
