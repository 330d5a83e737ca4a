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


def _label_of(entry) -> str | None:
    if len(entry) > 2 and entry[2] is not None:
        e = entry[2]
        return f"{e:+d}" if isinstance(e, int) else str(e)
    return None


# ------------------------------------------------------------------------------------------ roles
def strongest_roles(roles: dict) -> tuple[list[list[str | None]], list[list[str]]]:
    """Per (layer, head): the role it is labelled with most strongly (score / threshold; the sink only
    when nothing else), and a hover text listing every role's score."""
    names = [r for r in ROLE_NAMES if isinstance(roles.get(r), dict)]
    first = roles[names[0]]["scores"]
    n_layers, n_heads = len(first), max(len(row) for row in first)
    labels = {r: {tuple(e[:2]): _label_of(e) for e in roles[r].get("heads") or []} for r in names}
    best: list[list[str | None]] = [[None] * n_heads for _ in range(n_layers)]
    hover: list[list[str]] = [[""] * n_heads for _ in range(n_layers)]
    for l in range(n_layers):
        for h in range(n_heads):
            cands = []
            lines = [f"<b>layer {l}, head {h}</b>"]
            for r in names:
                row = roles[r]["scores"][l] if l < len(roles[r]["scores"]) else []
                s = row[h] if h < len(row) else None
                thr = roles[r].get("threshold")
                mark = ""
                if (l, h) in labels[r]:
                    extra = labels[r][(l, h)]
                    mark = " \u2714" + (f" {extra}" if extra else "")
                    ratio = (s / thr) if (s is not None and thr) else 0.0
                    cands.append((r != "sink", ratio, r))
                lines.append(f"{r.replace('_', '-')}: {'n/a' if s is None else f'{s:.3f}'}"
                             f"{'' if thr is None else f' (thr {thr:g})'}{mark}")
            if cands:
                best[l][h] = max(cands)[2]
            hover[l][h] = "<br>".join(lines)
    return best, hover


def head_map(roles: dict | None):
    if not roles:
        return None
    import plotly.graph_objects as go

    best, hover = strongest_roles(roles)
    order = [None, *ROLE_NAMES]
    n = len(order)
    colors = [NONE_COLOR, *(ROLE_COLORS[r] for r in ROLE_NAMES)]
    scale = []
    for i, c in enumerate(colors):  # a stepped scale: index i owns [i/n, (i+1)/n]
        scale += [[i / n, c], [(i + 1) / n, c]]
    z = [[order.index(b) + 0.5 for b in row] for row in best]
    text = [[ROLE_SHORT.get(b, "") if b else "" for b in row] for row in best]
    n_layers, n_heads = len(z), len(z[0])
    fig = go.Figure(go.Heatmap(
        z=z, zmin=0, zmax=n, colorscale=scale, showscale=False, text=text, texttemplate="%{text}",
        textfont=dict(size=9, color="white"), hovertext=hover, hoverinfo="text", xgap=2, ygap=2,
        x=list(range(n_heads)), y=list(range(n_layers))))
    layout(fig, height=max(320, 22 * n_layers + 90), margin=dict(l=60, r=10, t=10, b=50))
    fig.update_xaxes(title="head", dtick=1, side="bottom", showgrid=False)
    fig.update_yaxes(title="layer", dtick=1 if n_layers <= 16 else 2, autorange="reversed", showgrid=False)
    return fig


def importance_map(importance: dict | None):
    if not importance or not importance.get("scores"):
        return None
    import plotly.graph_objects as go

    z = importance["scores"]
    n_layers = len(z)
    fig = go.Figure(go.Heatmap(
        z=z, colorscale="Viridis", xgap=2, ygap=2, colorbar=dict(title=dict(text="importance", side="right"),
                                                                    thickness=12),
        hovertemplate="layer %{y}, head %{x}<br>importance %{z:.3g}<extra></extra>"))
    layout(fig, height=max(320, 22 * n_layers + 90), margin=dict(l=60, r=10, t=10, b=50))
    fig.update_xaxes(title="head", dtick=1, showgrid=False)
    fig.update_yaxes(title="layer", dtick=1 if n_layers <= 16 else 2, autorange="reversed", showgrid=False)
    return fig


# ----------------------------------------------------------------------------------- attention
def attention_grid(sample: dict | None, layer: int, head_titles: list[str] | None = None):
    """Small multiples: one heatmap per head of `layer`, tokens on both axes (queries down, keys across)."""
    if not sample or not sample.get("layers"):
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    heads = sample["layers"][layer]
    tokens = sample["tokens"]
    scale = sample.get("scale", 1000)
    n = len(heads)
    cols = 3 if n <= 9 else 4
    rows = math.ceil(n / cols)
    titles = head_titles or [f"head {h}" for h in range(n)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.07,
                        vertical_spacing=0.2 / rows)
    idx = list(range(len(tokens)))
    hover = [[f"{tokens[q]} \u2192 {tokens[k]}" for k in idx] for q in idx]
    for h, w in enumerate(heads):
        r, c = divmod(h, cols)
        fig.add_trace(go.Heatmap(
            z=[[v / scale for v in row] for row in w], x=idx, y=idx, zmin=0, zmax=1, colorscale=ATTN_SCALE,
            showscale=h == 0, colorbar=dict(thickness=10, len=0.3, y=1, yanchor="top", title=dict(text="weight", side="right")),
            customdata=hover, hovertemplate=f"head {h}<br>%{{customdata}}<br>weight %{{z:.3f}}<extra></extra>"),
            row=r + 1, col=c + 1)
    for i in range(1, n + 1):  # square cells: each subplot's y axis keeps its x axis's scale
        fig.update_layout({f"yaxis{'' if i == 1 else i}": dict(scaleanchor=f"x{'' if i == 1 else i}",
                                                               constrain="domain"),
                           f"xaxis{'' if i == 1 else i}": dict(constrain="domain")})
    small = 7 if len(tokens) > 24 else 9
    fig.update_xaxes(tickvals=idx, ticktext=tokens, tickangle=-90, tickfont=dict(size=small), showgrid=False)
    fig.update_yaxes(tickvals=idx, ticktext=tokens, autorange="reversed", tickfont=dict(size=small), showgrid=False)
    layout(fig, height=(430 if cols == 3 else 340) * rows + 40, margin=dict(l=60, r=10, t=40, b=60))
    fig.update_annotations(font=dict(size=12))
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
