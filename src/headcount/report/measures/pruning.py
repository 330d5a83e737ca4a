"""The pruning curve (chapter 2.3.6): held-out quality as the least important heads go, with prune_to's defaults
as the starred point; its card is the page's surgery card, the curve beside the K/V merge, with the prune command's
result (C11) under the curve and the trained gates (C12) under the merge."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from headcount.analysis import HeadScores
from headcount.report.context import Context, Step
from headcount.report.curve import pruning_section
from headcount.report.measures import gates, kv_merge, prune_command
from headcount.report.measures.edits import Domains
from headcount.report.page import domains, e, fig_div, not_available
from headcount.report.section_base import Section
from headcount.report.verdicts import domain_table

NAME = "pruning"


@dataclass
class PrunePoint(Section):
    fraction: float
    order: Any = None
    compensate: Any = None
    mode: str | None = None
    heads_removed: int | None = None
    heads_before: int | None = None
    ppl: float | None = None
    cosine: float | None = None


@dataclass
class Pruning(Domains):
    default: PrunePoint = field(kw_only=True)  # prune_to's defaults at C11's fraction: the point C11 reads
    points: list[PrunePoint] = field(default_factory=list)
    base_ppl: float | None = None


def step(ctx: Context) -> dict:
    found = ctx.done.get("importance")
    scores = {ctx.method: HeadScores.from_json(found)} if found and found["method"] == ctx.method else None
    return pruning_section(ctx.model, calibration=ctx.calibration(ctx.sizes.importance_windows), meter=ctx.meter,
                           sizes=ctx.sizes, seed=ctx.seed, scores=scores, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    s = ctx.sizes
    return [Step(NAME, ctx.sized | ctx.calibration_key | ctx.domains_key
                 | {"fractions": list(s.pruning_fractions), "order": ctx.method, "random": list(s.random_fractions),
                    "defaults": 2}, step)]


def chart(pruning: Pruning | None):
    points = pruning.points if pruning is not None else []
    if not points:
        return None
    import plotly.graph_objects as go

    from headcount.report.charts import DASHES, LINE_COLORS, layout

    base = pruning.base_ppl
    metric, label = ("ppl", "held-out perplexity") if base else ("cosine", "held-out embedding cosine to unpruned")
    if not base:
        base = 1.0
    groups: dict[tuple, list] = {}
    for p in points:
        if getattr(p, metric) is None:
            continue
        groups.setdefault((str(p.order), str(p.compensate), str(p.mode)), []).append(p)
    fig = go.Figure()
    for i, (key, ps) in enumerate(sorted(groups.items())):
        ps = sorted(ps, key=lambda p: p.fraction)
        xs, ys = [0.0, *(p.fraction for p in ps)], [base, *(getattr(p, metric) for p in ps)]
        name = f"{key[0]} order, compensation {key[1]}"
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=name,
            line=dict(color=LINE_COLORS[i % len(LINE_COLORS)], dash=DASHES[(i // len(LINE_COLORS)) % 5],
                      width=2.5),
            customdata=[0, *(p.heads_removed for p in ps)],
            hovertemplate="%{x:.0%} of heads (%{customdata} removed)<br>" + label + " %{y:.3f}<extra>" + name
                          + "</extra>"))
    default = pruning.default
    if getattr(default, metric) is not None:  # claim C11: prune_to with the project's defaults
        fig.add_trace(go.Scatter(
            x=[default.fraction], y=[getattr(default, metric)], mode="markers", name="prune_to defaults (C11)",
            marker=dict(symbol="star", size=16, color="#1f2330", line=dict(width=1, color="white")),
            hovertemplate=f"prune_to(model, {default.fraction:g}): order {default.order}, compensation "
                          f"{default.compensate}<br>{label} %{{y:.3f}}<extra></extra>"))
    if metric == "ppl":
        # on a log axis an annotation's y is log10 of the value (a shape's is the value): add_hline's own
        # annotation_text would sit at 10^value and stretch the axis to 1e20, so the labels are placed by hand
        for y, text, where, color in ((base, f"unpruned {base:.2f}", "left", "#888"),
                                      (base * 1.1, "+10%", "right", "#bbb")):
            fig.add_hline(y=y, line=dict(color=color, dash="dot"))
            fig.add_annotation(x=0 if where == "left" else 1, xref="paper", y=math.log10(y), yref="y", text=text,
                               showarrow=False, xanchor=where, yanchor="bottom" if where == "left" else "top",
                               font=dict(size=11, color="#666"))
    layout(fig, height=380, legend=dict(orientation="h", y=-0.3))
    fig.update_xaxes(title="share of heads removed", tickformat=".0%", rangemode="tozero")
    fig.update_yaxes(title=label, type="log" if metric == "ppl" else "linear")
    return fig


DOMAINS_LEDE = (" Under the curve and the merge, held-out perplexity on three domains, as <code>headcount prune</code> "
                "and <code>merge-kv</code> print it: prose (the default corpus's held-out topics, the number above), "
                "code (held-out torch / numpy docstrings and comments) and standard-library Python source (a domain "
                "nothing calibrates on).")


def _how(pr: Pruning | None, commanded: bool) -> str:
    default = pr.default if pr is not None else None
    how = (f" The starred point is <code>prune_to(model, {default.fraction:g})</code> with the project's "
           f"defaults (order {e(str(default.order))}, compensation {e(str(default.compensate))}) at the "
           "curve's sizes." if default is not None else "")
    if commanded:
        how += (" The curve is measured at the report's small sizes (its shape is the point); under it, claim C11 is "
                "what the command gives, on the command's own held-out windows.")
    return how


def card(r) -> str:
    """The surgery card: the curve (and C11's command) left, the K/V merge (and C12's gates) right."""
    pr, pc, m = r.pruning, r.prune_command, r.kv_merge
    left = (fig_div(chart(pr), "fig-pruning") if pr is not None and pr.points
            else not_available("The pruning curve", r.unavailable.get("pruning",
                                                                      "headcount.surgery.pruning_curve was not run")))
    if pc is not None:
        left += prune_command.card(r)
    elif pr is not None:
        left += domains(pr, f"prune_to({(pr.default.fraction or 0.2):g}), the starred point")
    right = kv_merge.card(r) + gates.card(r)
    return ('<section class="card" id="surgery"><h2>Removing heads, merging K/V heads</h2>'
            '<p class="lede">Left: held-out perplexity as the least important heads are removed (chapter 2.3.6).'
            f'{_how(pr, pc is not None)} Right: the GQA trade-off measured on this model: fewer K/V heads, a smaller '
            'cache, and what it costs (chapter 2.3.7); below it, heads removed by trained hard-concrete gates (claim '
            f'C12).{DOMAINS_LEDE if domain_table(pc or pr) or domain_table(m) else ""}</p>'
            f'<div class="grid2"><div>{left}</div><div>{right}</div></div></section>')
