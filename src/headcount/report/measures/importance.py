"""Head importance: how much the loss depends on each head (the pruning order's scores; the head map's right
half)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.analysis import importance
from headcount.report.context import Context, Step
from headcount.report.section_base import Section

NAME = "importance"


@dataclass
class Importance(Section):
    method: str | None = None
    scores: list = field(default_factory=list)  # [layer][head]


def step(ctx: Context):
    s = ctx.sizes
    if ctx.decoder:
        return importance(ctx.model, method=ctx.method, windows=ctx.calibration(s.importance_windows),
                          max_windows=None, window=ctx.window, progress=ctx.progress)
    return importance(ctx.model, ctx.cal, method=ctx.method, window=ctx.window, max_windows=s.importance_windows,
                      max_sentences=s.encoder_sentences, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, ctx.sized | {"windows": ctx.sizes.importance_windows, "method": ctx.method}, step)]


def chart(imp: Importance | None):
    if imp is None or not imp.scores:
        return None
    import plotly.graph_objects as go

    from headcount.report.charts import layout

    z = imp.scores
    n_layers = len(z)
    fig = go.Figure(go.Heatmap(
        z=z, colorscale="Viridis", xgap=2, ygap=2, colorbar=dict(title=dict(text="importance", side="right"),
                                                                    thickness=12),
        hovertemplate="layer %{y}, head %{x}<br>importance %{z:.3g}<extra></extra>"))
    layout(fig, height=max(320, 22 * n_layers + 90), margin=dict(l=60, r=10, t=10, b=50))
    fig.update_xaxes(title="head", dtick=1, showgrid=False)
    fig.update_yaxes(title="layer", dtick=1 if n_layers <= 16 else 2, autorange="reversed", showgrid=False)
    return fig
