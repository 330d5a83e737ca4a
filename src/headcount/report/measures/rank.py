"""Rank: the numerical rank of each head's QK^T against min(head_dim, n), below and above head_dim (C9)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headcount.analysis import rank
from headcount.report.context import Context, Step
from headcount.report.page import e, fig_div, fixed, not_available, pct
from headcount.report.section_base import Section

NAME = "rank"


@dataclass
class RankRow(Section):
    length: int
    bound: int
    mean_rank: float
    max_rank: int | None = None
    share_at_bound: float | None = None
    min_rank: int | None = None


@dataclass
class HeadRank(Section):
    layer: int
    head: int
    length: int
    rank: int


@dataclass
class Rank(Section):
    summary: list[RankRow] = field(default_factory=list)
    tolerance: Any = None
    heads: list[HeadRank] = field(default_factory=list)


def step(ctx: Context):
    return rank(ctx.model, ctx.cal, max_windows=ctx.sizes.rank_examples, seed=ctx.seed, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, ctx.sized | {"examples": ctx.sizes.rank_examples}, step)]


def chart(rk: Rank | None):
    if rk is None or not rk.summary:
        return None
    import plotly.graph_objects as go

    from headcount.report.charts import layout

    s = sorted(rk.summary, key=lambda r: r.length)
    xs = [r.length for r in s]
    fig = go.Figure()
    if rk.heads:
        fig.add_trace(go.Scatter(
            x=[h.length for h in rk.heads], y=[h.rank for h in rk.heads], mode="markers", name="one head",
            marker=dict(size=5, color="rgba(76,120,168,0.25)"),
            customdata=[[h.layer, h.head] for h in rk.heads],
            hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>n=%{x}: rank %{y}<extra></extra>"))
    fig.add_trace(go.Scatter(x=xs, y=[r.bound for r in s], mode="lines+markers", name="bound min(head_dim, n)",
                             line=dict(color="#E45756", dash="dash", width=2)))
    fig.add_trace(go.Scatter(
        x=xs, y=[r.mean_rank for r in s], mode="lines+markers", name="mean rank",
        line=dict(color="#1f2330", width=3),
        error_y=dict(type="data", symmetric=False, array=[r.max_rank - r.mean_rank for r in s],
                     arrayminus=[r.mean_rank - r.min_rank for r in s], color="#666", thickness=1)))
    layout(fig, height=360, legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title="sequence length n", type="log", tickvals=xs)
    fig.update_yaxes(title="numerical rank of QK^T", rangemode="tozero")
    return fig


def card(r) -> str:
    rk = r.rank
    if rk is None or not rk.summary:
        body = not_available("Rank", r.unavailable.get("rank"))
    else:
        rows = "".join(
            f'<tr><td>{s.length}</td><td>{s.bound}</td><td>{fixed(s.mean_rank, 1)}</td>'
            f'<td>{s.min_rank}</td><td>{s.max_rank}</td>'
            f'<td>{pct(s.share_at_bound)}</td></tr>'
            for s in sorted(rk.summary, key=lambda s: s.length))
        table = ('<table class="data"><tr><th>n</th><th>bound</th><th>mean rank</th><th>min</th><th>max</th>'
                 f'<th>at bound</th></tr>{rows}</table><p class="lede" style="margin-top:8px">Numerical rank of '
                 f'each head\'s pre-softmax scores QK^T on real text, tolerance {e(str(rk.tolerance))}.</p>')
        body = f'<div class="grid2"><div>{table}</div><div>{fig_div(chart(rk), "fig-rank")}</div></div>'
    return ('<section class="card" id="rank"><h2>How much can one head express?</h2>'
            '<p class="lede">A head\'s score matrix QK^T is n \u00d7 n but has rank at most head_dim '
            '(Bhojanapalli et al. 2020): past n = head_dim it cannot grow.</p>' + body + "</section>")
