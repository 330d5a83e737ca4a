"""Plotly figures from report.json's sections. Each function takes JSON (never a model) and returns
a plotly Figure, or None when its section is missing (the page then shows a "not available" panel).
"""

from __future__ import annotations

import math

from headcount.report.verdicts import ROLE_NAMES

ROLE_COLORS = {
    "previous_token": "#4C78A8", "duplicate_token": "#72B7B2", "induction": "#E45756", "positional": "#F58518",
    "syntactic": "#54A24B", "rare_word": "#B279A2", "sink": "#9D755D",
}
NONE_COLOR = "#ECECF2"
ROLE_SHORT = {"previous_token": "PREV", "duplicate_token": "DUP", "induction": "IND", "positional": "POS",
              "syntactic": "SYN", "rare_word": "RARE", "sink": "SINK"}
# attention weights: most are small, so the scale spends its colours on the low end
ATTN_SCALE = [[0.0, "#ffffff"], [0.03, "#eef4fb"], [0.1, "#c6dbef"], [0.25, "#6baed6"], [0.5, "#2171b5"],
              [1.0, "#08306b"]]
FONT = dict(family="Inter, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif", size=12, color="#1f2330")


def layout(fig, *, height: int, **kw):
    kw.setdefault("margin", dict(l=60, r=20, t=40, b=50))
    fig.update_layout(template="plotly_white", font=FONT, height=height, paper_bgcolor="rgba(0,0,0,0)",
                      plot_bgcolor="rgba(0,0,0,0)", **kw)
    return fig


# ------------------------------------------------------------------------------------- surgery
DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]
LINE_COLORS = ["#4C78A8", "#E45756", "#54A24B", "#F58518", "#B279A2", "#72B7B2"]


def pruning_chart(pruning: dict | None):
    points = (pruning or {}).get("points") or []
    if not points:
        return None
    import plotly.graph_objects as go

    base = pruning.get("base_ppl")
    metric, label = ("ppl", "held-out perplexity") if base else ("cosine", "held-out embedding cosine to unpruned")
    if not base:
        base = 1.0
    groups: dict[tuple, list] = {}
    for p in points:
        if p.get(metric) is None:
            continue
        key = (str(p.get("order")), str(p.get("compensate")), str(p.get("mode")))
        groups.setdefault(key, []).append(p)
    fig = go.Figure()
    for i, (key, ps) in enumerate(sorted(groups.items())):
        ps = sorted(ps, key=lambda p: p["fraction"])
        xs, ys = [0.0, *(p["fraction"] for p in ps)], [base, *(p[metric] for p in ps)]
        name = f"{key[0]} order, compensation {key[1]}"
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=name,
            line=dict(color=LINE_COLORS[i % len(LINE_COLORS)], dash=DASHES[(i // len(LINE_COLORS)) % 5],
                      width=2.5),
            customdata=[0, *(p.get("heads_removed") for p in ps)],
            hovertemplate="%{x:.0%} of heads (%{customdata} removed)<br>" + label + " %{y:.3f}<extra>" + name
                          + "</extra>"))
    default = pruning.get("default") or {}
    if default.get(metric) is not None:  # claim C11: prune_to with the project's defaults
        fig.add_trace(go.Scatter(
            x=[default["fraction"]], y=[default[metric]], mode="markers", name="prune_to defaults (C11)",
            marker=dict(symbol="star", size=16, color="#1f2330", line=dict(width=1, color="white")),
            hovertemplate=f"prune_to(model, {default['fraction']:g}): order {default.get('order')}, compensation "
                          f"{default.get('compensate')}<br>{label} %{{y:.3f}}<extra></extra>"))
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
