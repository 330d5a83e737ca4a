"""The pruning part of `headcount bench surgery` (surgery/bench.py runs it beside merging/bench.py).

    run_prune(quick, log, checkpoint, orders=None, curve_only=False) -> dict (JSON-ready)
    render(prune_section)                                             rich tables on stdout

Pruning part:
  scores      every order scored ONCE on calibration text of the unpruned model
              (headcount.analysis.importance), with Spearman against ablation and the cost in
              forward-pass equivalents (importance.agreement / importance.cost_ratio)
  smollm2     held-out perplexity vs fraction of query heads removed, for each order x compensation,
              on two held-out texts: default-corpus prose and code-like text (torch / numpy
              docstrings and comments, headcount.data.code_corpus); random = 3 seeds (mean, spread)
  minilm      the same with embedding fidelity (mean cosine, Spearman of pairwise similarities)
  costs       25% / 50% pruned (query and group modes, uniform): parameters, KV bytes / token, and
              prefill / decode time ratios against the unpruned model, timed side by side (paired)
--quick: fewer fractions, orders, windows and one random seed (minutes, not an hour).
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

ORDERS = ("reconstruction", "random", "gradient", "ablation", "confidence")  # the curve's order of work
COMPENSATIONS = ("lstsq", "mean", "none")  # most useful first: a run cut short keeps those


def _log(msg: str) -> None:
    print(f"headcount bench surgery: {msg}", file=sys.stderr, flush=True)


def settings(quick: bool) -> dict:
    if quick:
        return {"fractions": (0.1, 0.2, 0.3), "orders": ("reconstruction", "random"), "seeds": (0,),
                "compensations": ("none", "lstsq"), "calibration_windows": 8, "eval_windows": 4, "score_windows": 1,
                "timing_repeats": 3, "minilm_orders": ("reconstruction", "random")}
    # 8 calibration windows (prune's default; 16 double the cost) and 4 + 4 held-out windows: the full grid
    # (105 points for smollm2) then fits in about an hour on 2 cores; ratios against the base are paired (same
    # windows)
    return {"fractions": (0.1, 0.2, 0.3, 0.4, 0.5), "orders": ORDERS, "seeds": (0, 1, 2),
            "compensations": COMPENSATIONS, "calibration_windows": 8, "eval_windows": 4, "score_windows": 2,
            "timing_repeats": 5, "minilm_orders": ("ablation", "confidence", "reconstruction", "random")}


def _scores(model, orders, max_windows: int, given: dict | None = None) -> tuple[dict, dict]:
    """({method: HeadScores}, agreement JSON without the raw scores); `given` scores (the curve's orders,
    scored on the same calibration windows) are reused, not computed again."""
    from headcount.analysis import HeadScores
    from headcount.analysis.head_importance import agreement

    wanted = ("gradient", "confidence", "reconstruction")  # all three: their Spearman is reported
    agree = agreement(model, window=512, max_windows=max_windows, max_sentences=64 * max_windows, methods=wanted,
                      progress=False, given=given)
    scores = {m: HeadScores.from_json(s) for m, s in agree.pop("scores").items()}
    return scores, agree


def _order_scores(model, orders, max_windows: int, box: dict, key: str) -> dict:
    """Score each non-random order once (calibration text); kept in box[key]; returns a JSON summary."""
    from headcount.analysis import importance

    box[key] = {}
    for name in orders:
        if name != "random":
            box[key][name] = importance(model, None, name, max_windows=max_windows, max_sentences=64 * max_windows,
                                        progress=False)
    return {name: {"n_tokens": s.n_tokens, "source": s.source} for name, s in box[key].items()}


def _timing(model, repeats: int, prompt_tokens: int = 256, new_tokens: int = 32) -> dict:
    """Parameters, KV bytes / token, prefill and decode time of pruned copies vs the unpruned model."""
    import torch

    from headcount.bench.timing import paired_times
    from headcount.data import default_corpus
    from headcount.models.generation import generate
    from headcount.surgery.pruning.plan import plan_fraction, random_scores
    from headcount.surgery.pruning.removal import count_heads, kv_bytes_per_token, n_params, prune

    variants = {"unpruned": model}
    for mode in ("query", "group"):
        for frac in (0.25, 0.5):
            m = copy.deepcopy(model)
            # timing does not depend on which heads go: a seeded random choice, no compensation
            plan = plan_fraction(m, frac, random_scores(m, 0), mode=mode)
            prune(m, plan, mode=mode, compensate="none", progress=False)
            variants[f"{mode} {int(frac * 100)}%"] = m
    prompt = model.tokenizer.encode(default_corpus().held_out_text)[:prompt_tokens]
    contenders = {}
    for name, m in variants.items():
        contenders[f"{name} prefill"] = (lambda m=m: generate(m, prompt, 1, stop_at_eos=False))
        contenders[f"{name} generate"] = (lambda m=m: generate(m, prompt, new_tokens + 1, stop_at_eos=False))
    times = paired_times(contenders, repeats=repeats, warmup=1)
    rows = []
    base_p = times["unpruned prefill"]
    base_d = [g - p for g, p in zip(times["unpruned generate"], base_p)]
    for name, m in variants.items():
        pre = times[f"{name} prefill"]
        dec = [g - p for g, p in zip(times[f"{name} generate"], pre)]
        heads, kv = count_heads(m)
        rows.append({"variant": name, "heads": heads, "kv_heads": kv, "params": n_params(m),
                     "kv_bytes_per_token": kv_bytes_per_token(m),
                     "prefill_s": statistics.median(pre), "decode_tokens_per_s": new_tokens / statistics.median(dec),
                     "prefill_ratio": statistics.median(a / b for a, b in zip(pre, base_p)),
                     "decode_time_ratio": statistics.median(a / b for a, b in zip(dec, base_d))})
    return {"prompt_tokens": len(prompt), "new_tokens": new_tokens, "repeats": repeats,
            "threads": torch.get_num_threads(), "rows": rows,
            "note": "query rows: 25% / 50% of all query heads (a seeded random choice; uneven GQA groups, a KV "
                    "head goes only when its whole group does); group rows: 25% / 50% of the KV groups (rounded)"}


def _section(out: dict, key: str, fn, log, checkpoint) -> None:
    """out[key] = fn(); a failure is recorded (and logged) instead of losing the sections before it."""
    import json
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001  a benchmark keeps what it measured
        out[key] = {"error": f"{type(e).__name__}: {e}"}
        log(f"{key} failed: {type(e).__name__}: {e}")
    if checkpoint is not None:
        with open(checkpoint, "w") as f:
            json.dump({"prune": out}, f, indent=1, default=str)


def run_prune(quick: bool = False, log=_log, checkpoint=None, orders=None, curve_only: bool = False) -> dict:
    """orders: the smollm2 curve's orders (default: all of settings()); curve_only: score those orders
    and run the smollm2 curve alone (to split the long curve over processes)."""
    import os

    import torch

    from headcount.data import code_corpus
    from headcount.models import load

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)))  # 2 cores unless told otherwise
    cfg = settings(quick)
    if orders:
        bad = [o for o in orders if o not in ORDERS]
        if bad:
            raise ValueError(f"orders: expected names from {ORDERS}, got {bad}")
        cfg["orders"] = tuple(orders)
    out: dict = {"quick": quick, "curve_only": curve_only,
                 "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}}
    t0 = time.perf_counter()
    log("loading smollm2; scoring the curve's orders on calibration text")
    smol = load("smollm2")
    box: dict = {}
    _section(out, "smollm2_scores", lambda: _order_scores(smol, cfg["orders"], cfg["score_windows"], box, "scores"),
             log, checkpoint)
    held = {"prose": None, "code": code_corpus().texts("held_out")}
    # cheap sections first, the long smollm2 curve last (its points are checkpointed one by one)
    if not curve_only:
        _cheap_sections(out, smol, box, cfg, held, log, checkpoint)
    elif "ablation" in cfg["orders"]:  # the ground truth is scored anyway: the Spearman table comes cheap
        log("Spearman against ablation (smollm2)")
        _section(out, "smollm2_agreement", lambda: _scores(smol, (), cfg["score_windows"], box.get("scores"))[1],
                 log, checkpoint)
    _curve_section(out, smol, box, cfg, held, log, checkpoint)
    out["seconds"] = time.perf_counter() - t0
    return out


def _cheap_sections(out, smol, box, cfg, held, log, checkpoint) -> None:
    from headcount.models import load
    from headcount.surgery.pruning.curve import pruning_curve

    log("Spearman against ablation and scoring cost (smollm2)")
    _section(out, "smollm2_agreement", lambda: _scores(smol, (), cfg["score_windows"], box.get("scores"))[1], log,
             checkpoint)
    _section(out, "smollm2_cost", lambda: _cost(smol), log, checkpoint)
    log("timing pruned smollm2 copies side by side")
    _section(out, "smollm2_costs", lambda: _timing(smol, cfg["timing_repeats"]), log, checkpoint)
    log("minilm: scores, agreement, cost and embedding-fidelity curve")
    mini = load("minilm")
    _section(out, "minilm_scores", lambda: _order_scores(mini, cfg["minilm_orders"], cfg["score_windows"], box,
                                                         "mscores"), log, checkpoint)
    _section(out, "minilm_agreement", lambda: _scores(mini, (), cfg["score_windows"], box.get("mscores"))[1], log,
             checkpoint)
    _section(out, "minilm_cost", lambda: _cost(mini), log, checkpoint)
    _section(out, "minilm_curve", lambda: pruning_curve(
        mini, fractions=cfg["fractions"], orders=cfg["minilm_orders"], compensations=cfg["compensations"],
        seeds=cfg["seeds"], scores=box.get("mscores"), progress=False,
        log=lambda p: log(f"  minilm {p['order']}{p.get('seed', '')} {p['compensate']} {p['fraction']}: "
                          f"cos {p['cosine']:.4f} spearman {p['spearman']:.4f}")).to_json(), log, checkpoint)
    del mini
    log("smollm2: calibration on mixed prose + code (reconstruction order, lstsq)")
    _section(out, "smollm2_mixed", lambda: pruning_curve(
        smol, fractions=cfg["fractions"][:3], orders=("reconstruction",), compensations=("lstsq",), held_out=held,
        calibration="mixed", eval_windows=cfg["eval_windows"], calibration_windows=cfg["calibration_windows"],
        scores=box.get("scores"), progress=False,
        log=lambda p: log(f"  mixed {p['order']} {p['fraction']}: ppl {p['ppl']:.3f} "
                          f"code {p['ppl_by_text'].get('code', 0):.3f}")).to_json(), log, checkpoint)


def _curve_section(out, smol, box, cfg, held, log, checkpoint) -> None:
    from headcount.surgery.pruning.curve import pruning_curve

    log(f"smollm2 pruning curve ({len(cfg['fractions'])} fractions x orders {cfg['orders']} x {cfg['compensations']})")
    partial: list = []

    def point_done(p: dict) -> None:
        log(f"  {p['order']}{p.get('seed', '')} {p['compensate']} {p['fraction']}: "
            f"ppl {p['ppl']:.3f} code {p['ppl_by_text'].get('code', 0):.3f}")
        partial.append(p)
        if checkpoint is not None:  # a run cut short keeps the points it measured
            _section(out, "smollm2_curve_partial", lambda: {"points": partial}, log, checkpoint)

    _section(out, "smollm2_curve", lambda: pruning_curve(
        smol, fractions=cfg["fractions"], orders=cfg["orders"], compensations=cfg["compensations"], held_out=held,
        seeds=cfg["seeds"], eval_windows=cfg["eval_windows"], calibration_windows=cfg["calibration_windows"],
        scores=box.get("scores"), progress=False, log=point_done).to_json(), log, checkpoint)
    out.pop("smollm2_curve_partial", None)


def _cost(model) -> dict | None:
    try:
        from headcount.analysis.head_importance import cost_ratio
    except ImportError:
        return None
    return cost_ratio(model)


# ------------------------------------------------------------------------------------------ render
def curve_table(data: dict) -> list[dict]:
    """Rows {order, compensate, fraction -> value} with random seeds folded to mean and spread."""
    decoder = data.get("base_ppl") is not None
    groups: dict = {}
    for p in data["points"]:
        key = (p["order"], p["compensate"], p["fraction"])
        if decoder:
            value = {t: v for t, v in p["ppl_by_text"].items()}
        else:
            value = {"cosine": p["cosine"], "spearman": p["spearman"]}
        groups.setdefault(key, []).append(value)
    rows = []
    for (order, comp, frac), values in groups.items():
        agg = {}
        for k in values[0]:
            vs = [v[k] for v in values]
            agg[k] = statistics.mean(vs)
            if len(vs) > 1:
                agg[k + "_spread"] = (min(vs), max(vs))
        rows.append({"order": order, "compensate": comp, "fraction": frac, **agg, "n": len(values)})
    return rows


def render_curve(data: dict, console=None, texts=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    rows = curve_table(data)
    fractions = sorted({r["fraction"] for r in rows})
    decoder = data.get("base_ppl") is not None
    keys = (texts or list(data.get("base_by_text") or ["prose"])) if decoder else ["cosine", "spearman"]
    for key in keys:
        if decoder:
            base = data["base_by_text"].get(key, data["base_ppl"])
            title = f"{data['model']}: held-out perplexity on {key} (base {base:.3f}; % change vs base)"
        else:
            title = f"{data['model']}: held-out embedding fidelity, {key} (1.0 = unchanged)"
        table = Table(title=title)
        table.add_column("order")
        table.add_column("compensate")
        for f in fractions:
            table.add_column(f"{f:.0%}", justify="right")
        seen = []
        for r in rows:
            if (r["order"], r["compensate"]) not in seen:
                seen.append((r["order"], r["compensate"]))
        for order, comp in seen:
            cells = []
            for f in fractions:
                r = next((x for x in rows if (x["order"], x["compensate"], x["fraction"]) == (order, comp, f)), None)
                if r is None:
                    cells.append("")
                    continue
                v = r[key]
                spread = r.get(key + "_spread")
                if decoder:
                    cell = f"{v:.2f} ({(v / base - 1) * 100:+.0f}%)"
                    if spread:
                        cell += f" [{spread[0]:.1f}-{spread[1]:.1f}]"
                else:
                    cell = f"{v:.3f}" + (f" [{spread[0]:.3f}-{spread[1]:.3f}]" if spread else "")
                cells.append(cell)
            table.add_row(order + (f" x{r['n']}" if r["n"] > 1 else ""), comp, *cells)
        console.print(table)


def plot_curve(data: dict, path) -> None:
    """Perplexity (or cosine) against the fraction removed, one line per order x compensation."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = curve_table(data)
    decoder = data.get("base_ppl") is not None
    key = next(iter(data.get("base_by_text") or {"prose": 0})) if decoder else "cosine"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for order, comp in dict.fromkeys((r["order"], r["compensate"]) for r in rows):
        pts = sorted((r["fraction"], r[key]) for r in rows if (r["order"], r["compensate"]) == (order, comp))
        base = data["base_ppl"] if decoder else 1.0
        ax.plot([0] + [p[0] for p in pts], [base] + [p[1] for p in pts], marker="o", label=f"{order} / {comp}")
    ax.set_xlabel("fraction of query heads removed")
    ax.set_ylabel("held-out perplexity" if decoder else "mean cosine to unmodified embeddings")
    if decoder:
        ax.set_yscale("log")
    ax.set_title(f"{data['model']}: pruning curve")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(prune: dict, console=None) -> None:
    """The pruning section of `headcount bench surgery`'s result as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if prune:
        for key, value in list(prune.items()):
            if isinstance(value, dict) and "error" in value:
                console.print(f"{key}: not measured ({value['error']})")
                prune = {**prune, key: None}
        for name in ("smollm2", "minilm"):
            agree = prune.get(f"{name}_agreement")
            if agree:
                table = Table(title=f"{name}: Spearman of each order against ablation ({agree['n_heads']} heads, "
                                    f"{agree['n_tokens']:,} calibration tokens)")
                table.add_column("method")
                table.add_column("Spearman vs ablation", justify="right")
                for m, rho in agree["spearman"].items():
                    table.add_row(m, f"{rho:+.3f}")
                console.print(table)
            cost = prune.get(f"{name}_cost")
            if cost:
                console.print(f"{name}: scoring cost in forward-pass equivalents per batch: " + ", ".join(
                    f"{k[:-6]} {v:.2f}x" for k, v in cost.items() if k.endswith("_ratio")))
            curve = prune.get(f"{name}_curve")
            if curve:
                render_curve(curve, console)
            mixed = prune.get(f"{name}_mixed")
            if mixed:
                console.print(f"{name}, calibrated on mixed prose + code text (same order; compare the lstsq "
                              "rows above, calibrated on prose only):")
                render_curve(mixed, console)
        costs = prune.get("smollm2_costs")
        if costs:
            table = Table(title=f"smollm2 pruned (no compensation): accounts and time vs unpruned "
                                f"(prompt {costs['prompt_tokens']}, {costs['new_tokens']} decode steps, "
                                f"{costs['repeats']} paired repeats, {costs['threads']} threads)")
            for col in ("variant", "heads", "KV heads", "parameters", "KV bytes/token", "prefill ratio",
                        "decode time ratio"):
                table.add_column(col, justify="left" if col == "variant" else "right")
            for r in costs["rows"]:
                table.add_row(r["variant"], str(r["heads"]), str(r["kv_heads"]), f"{r['params']:,}",
                              f"{r['kv_bytes_per_token']:,}", f"{r['prefill_ratio']:.2f}",
                              f"{r['decode_time_ratio']:.2f}")
            console.print(table)
            console.print(costs["note"])
