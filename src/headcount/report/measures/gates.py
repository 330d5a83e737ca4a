"""Trained gates (C12): heads removed by hard-concrete L0 gates, from the gates bench's saved result for the model
when there is one, else a short `train_gates` run here."""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.report.context import Context, Step
from headcount.report.page import e, fixed, not_available, pct
from headcount.report.section_base import Section
from headcount.report.trained import GATES_FILES, gates_section, gates_source, saved_gates

NAME = "gates"
GATES_FILE = GATES_FILES[0]  # where the gates bench saves its result (the report reads it before training)


@dataclass
class GatePoint(Section):
    heads_removed: int
    heads_before: int
    fraction: float | None = None
    ppl: float | None = None
    base_ppl: float | None = None
    cosine: float | None = None
    model: str | None = None
    steps: int | None = None
    params: str | None = None


@dataclass
class Gates(Section):
    source: str = "run"
    path: str | None = None
    quick: bool = False
    joint: bool = False
    steps: int | None = None
    points: list[GatePoint] = field(default_factory=list)  # saved: the bench's points
    fraction: float = 0.0  # run here: one target
    heads_before: int | None = None
    heads_removed: int | None = None
    reached: bool | None = None
    n_gates: int | None = None
    n_closed: int | None = None
    n_removed_ranked: int | None = None
    ppl_before: float | None = None
    ppl_after: float | None = None
    cosine: float | None = None
    compensate: str | None = None
    objective: str | None = None
    params: str | None = None


def step(ctx: Context) -> dict:
    """The gates bench's saved result for this model when there is one, else a short run here."""
    if gates_source(ctx.results_dir, ctx.name, ctx.weights)["source"] == "saved":
        return saved_gates(ctx.results_dir, ctx.name, ctx.weights)
    s = ctx.sizes
    gw = min(s.gate_window, ctx.window)
    return gates_section(ctx.model, calibration=ctx.calibration(s.gate_windows, gw), meter=ctx.meter,
                         steps=s.gate_steps, n_windows=s.gate_windows, window=gw, calibration_windows=s.gate_windows,
                         lr=s.gate_lr, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    s = ctx.sizes
    return [Step(NAME, ctx.sized | ctx.calibration_key | gates_source(ctx.results_dir, ctx.name, ctx.weights)
                 | {"steps": s.gate_steps, "windows": s.gate_windows, "version": 3, "gate_window": s.gate_window,
                    "lr": s.gate_lr}, step)]


def card(r) -> str:
    """The gates' part of the surgery card (under the K/V merge)."""
    g = r.gates
    if g is None:
        return not_available("Trained gates", r.unavailable.get("gates", "headcount.surgery.train_gates was not run"))
    if g.source == "saved":
        rows = "".join(f'<tr><td>{e(str(p.model or ""))}</td><td>{p.heads_removed} / {p.heads_before}'
                       f'</td><td>{fixed(p.base_ppl, 2)} \u2192 {fixed(p.ppl, 2)}</td></tr>' for p in g.points)
        quick = " --quick" if g.quick else ""
        return (f'<h3 class="sub">Trained gates (from {e(str(g.path))})</h3><table class="data"><tr><th>model</th>'
                f'<th>heads removed</th><th>held-out perplexity</th></tr>{rows}</table>'
                f'<p class="lede" style="margin-top:4px">Source: the gates bench\'s saved{quick} result '
                f'(<code>headcount bench surgery --part gates{quick}</code>, {g.steps} steps of training, then '
                'the lstsq refit), preferred to a short run on this model.</p>')
    kpis = (f'<div class="kpi"><span>heads removed by the gates</span><b>{g.heads_removed} of '
            f'{g.heads_before}</b><small> (target {pct(g.fraction)}'
            f'{"" if g.reached is not False else ", NOT reached"})</small></div>')
    if g.ppl_before is not None and g.ppl_after is not None:
        kpis += (f'<div class="kpi"><span>held-out perplexity</span><b>{g.ppl_before:.2f} \u2192 '
                 f'{g.ppl_after:.2f}</b><small> ({g.ppl_after / g.ppl_before - 1:+.1%})</small></div>')
    elif g.cosine is not None:
        kpis += f'<div class="kpi"><span>embedding cosine</span><b>{g.cosine:.3f}</b></div>'
    return (f'<h3 class="sub">Trained gates ({g.steps} steps, model frozen, then removal with compensation '
            f'{e(str(g.compensate))})</h3><div class="kpis">{kpis}</div>'
            f'<p class="lede" style="margin-top:4px">Source: a short run of <code>train_gates</code> on this model in '
            f'this report\'s run: the gates bench has no saved result for it in '
            f'<code>benchmarks/results/{e(GATES_FILE)}</code>.</p>')
