"""`headcount bench surgery --part heal`: what healing costs and what it buys.

    run_heal(quick=False, log=print, png=None) -> dict (JSON-ready)
    render(result, console=None), plot(result, png)

(a) speed: one healing step (loop.train_step, with the teacher's forward run every step, i.e. no hidden-state
    cache, so the two do the same work) against a plain PyTorch training step of the same model on the same
    batch: the teacher's full logits, the student's full logits, F.kl_div, backward, the same AdamW; paired
    medians in one run (bench/timing.py), on the edit the curve heals. Target: ratio <= 1.25.
(b) the curve: smollm2 with 50% of its heads pruned (`headcount prune`'s defaults), ONE heal with the defaults
    (200 steps), the held-out perplexity per domain measured on the weights after 25, 50 and 100 steps of that
    run (heal(checkpoints=...): one schedule, so an early point is that run's weights then, not a shorter run
    with its own, fully decayed schedule) and at the end (the weights kept: the best validation step), against
    the healing tokens seen, so a user can choose the budget.
"""

from __future__ import annotations

import sys

MODEL = "smollm2"
FRACTION = 0.5
CURVE_STEPS = (0, 25, 50, 100, 200)  # the last is the run's length (heal's default budget)
QUICK_STEPS = (0, 10, 25)


def _log(msg: str) -> None:
    print(f"headcount bench surgery: {msg}", file=sys.stderr, flush=True)


def speed(model, teacher, *, batch: int | None = None, repeats: int = 7, params: str = "attention",
          windows=None) -> dict:
    """Paired medians of a healing step and a plain PyTorch distillation step (see the module doc).
    windows: the batch, LongTensor [batch, T] (None: `batch` mixed calibration windows of loop.WINDOW; batch None:
    loop.BATCH_SIZE, as a healing step)."""
    import torch
    import torch.nn.functional as F

    from headcount.bench.timing import paired_medians
    from headcount.surgery.healing.loop import BATCH_SIZE, WINDOW, _Teacher, _windows, train_step
    from headcount.surgery.healing.weights import Mover, edited_layers

    batch = BATCH_SIZE if batch is None else batch
    windows = _windows(model, "mixed", batch, WINDOW) if windows is None else windows
    layers = edited_layers(model, teacher) or list(range(len(model.layers)))
    mover = Mover(model, teacher, params, layers)
    trainable = mover.trainable()
    source = _Teacher(teacher, windows, budget=0)  # the teacher's forward every step, as the plain step
    rows = list(range(windows.shape[0]))
    lr = 1e-12  # the weights barely move: every repeat times the same model
    heal_opt = torch.optim.AdamW(trainable, lr=lr)
    plain_opt = torch.optim.AdamW(trainable, lr=lr)

    def heal_step():
        train_step(model, source, rows, teacher.lm_head, heal_opt, trainable)

    def plain_step():
        ids = windows
        with torch.no_grad():
            target = F.log_softmax(teacher(ids[:, :-1]).logits.float(), dim=-1)
        logits = model(ids[:, :-1]).logits.float()
        v = logits.shape[-1]
        loss = F.kl_div(F.log_softmax(logits, dim=-1).reshape(-1, v), target.reshape(-1, v), log_target=True,
                        reduction="batchmean")
        plain_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        plain_opt.step()

    model.train()
    try:
        timed = paired_medians({"heal": heal_step, "plain": plain_step}, repeats=repeats, warmup=1, baseline="plain")
    finally:
        model.eval()
        mover.finish()
    return {"batch_windows": windows.shape[0], "window": windows.shape[1], "params": params, "repeats": repeats,
            "heal_s": timed["heal"]["median_s"], "plain_s": timed["plain"]["median_s"],
            "ratio": timed["heal"]["ratio"], "target": 1.25}


def curve(pruned, teacher, steps_list, log=_log, **heal_kwargs) -> dict:
    """ONE heal of `pruned` (in place) for max(steps_list) steps, the held-out domains measured at every budget
    in steps_list (0: the edit itself); {"before_edit": {domain: ppl}, "curve": [rows], "heal": HealResult JSON}."""
    from headcount.surgery.healing.loop import heal

    steps_list = sorted(set(steps_list))
    total = steps_list[-1]
    r = heal(pruned, teacher, steps=total, checkpoints=[s for s in steps_list if s < total], log=log, **heal_kwargs)
    rows = []
    for point in r.curve:
        rows.append({"steps": point["steps"], "tokens_seen": point["tokens_seen"], "seconds": point["seconds"],
                     "val_kl": point["val_kl"], "held_out": point["held_out"]})
    rows.append({"steps": r.steps, "tokens_seen": r.tokens_seen, "seconds": round(r.seconds, 1),
                 "val_kl": r.val_best, "held_out": r.held_out["after_heal"], "kept_step": r.best_step})
    return {"before_edit": r.held_out["before_edit"], "curve": rows, "heal": r.to_json()}


def run_heal(quick: bool = False, log=_log, png=None) -> dict:
    import torch

    from headcount.models import load
    from headcount.models.copying import attention_copy
    from headcount.surgery import prune_to

    if png is not None:
        from headcount.paths import check_png
        check_png(png)
    torch.manual_seed(0)
    teacher = load(MODEL)
    pruned = attention_copy(teacher)
    log(f"heal: pruning {FRACTION:.0%} of {MODEL}'s heads (headcount prune's defaults)")
    prune_to(pruned, FRACTION, progress=False)
    log("heal: timing a healing step against a plain PyTorch step")
    timing = speed(pruned, teacher, repeats=3 if quick else 7)
    log(f"heal: step ratio {timing['ratio']:.3f} (heal {timing['heal_s']:.2f} s, plain {timing['plain_s']:.2f} s)")
    points = curve(pruned, teacher, QUICK_STEPS if quick else CURVE_STEPS, log)
    out = {"model": MODEL, "fraction": FRACTION, "speed": timing, "curve": points["curve"],
           "before_edit": points["before_edit"], "heal": points["heal"]}
    if png is not None:
        plot(out, png)
    return out


def render(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = result["speed"]
    console.print(f"healing step vs plain PyTorch step ({s['batch_windows']} x {s['window']} tokens, {s['params']}): "
                  f"{s['heal_s']:.3f} s vs {s['plain_s']:.3f} s, ratio {s['ratio']:.3f} (target <= {s['target']})")
    before = result["before_edit"]
    table = Table(title=f"{result['model']}, {result['fraction']:.0%} of heads pruned: held-out perplexity vs "
                        "healing tokens")
    for col in ("steps", "tokens seen", "seconds", "val KL", *(f"{d} (+% vs unpruned)" for d in before)):
        table.add_column(col, justify="right")
    table.add_row("unpruned", "", "", "", *(f"{v:.3f}" for v in before.values()))
    for row in result["curve"]:
        kept = f" (kept: step {row['kept_step']})" if row.get("kept_step") not in (None, row["steps"]) else ""
        val = row.get("val_kl")
        table.add_row(f"{row['steps']}{kept}", f"{row['tokens_seen']:,}", f"{row['seconds']:.0f}",
                      "" if val is None else f"{val:.4f}",
                      *(f"{row['held_out'][d]:.3f} ({(row['held_out'][d] / before[d] - 1) * 100:+.1f}%)" for d in before))
    console.print(table)
    console.print("one heal run: each row is that run's weights after its steps (one schedule); the last row is the "
                  "weights it kept (lowest validation KL)")


def plot(result: dict, png) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = result["before_edit"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [row["tokens_seen"] for row in result["curve"]]
    for d in before:
        ax.plot(xs, [(row["held_out"][d] / before[d] - 1) * 100 for row in result["curve"]], marker="o", label=d)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("healing tokens seen")
    ax.set_ylabel("held-out perplexity, % above the unpruned model")
    ax.set_title(f"{result['model']}, {result['fraction']:.0%} of heads pruned, healed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
