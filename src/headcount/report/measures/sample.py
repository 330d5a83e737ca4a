"""The sample sentence's attention, every layer and head: the page's attention card (a grid of heads of one layer,
the others one click away), its titles naming each head's role."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from headcount.report.context import Context, Step
from headcount.report.measures.roles import strongest_roles
from headcount.report.page import e, fig_div, not_available
from headcount.report.sample import sample_attention
from headcount.report.section_base import Section
from headcount.report.style import ATTENTION_JS

NAME = "sample"


@dataclass
class Sample(Section):
    sentence: str = ""
    tokens: list = field(default_factory=list)
    scale: int = 1000  # the weights are stored as integers out of `scale`
    layers: list = field(default_factory=list)  # [layer][head][query][key]


def step(ctx: Context) -> dict:
    return sample_attention(ctx.model, ctx.sample)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, {"sentence": ctx.sample}, step)]


def chart(sample: Sample | None, layer: int, head_titles: list[str] | None = None):
    """Small multiples: one heatmap per head of `layer`, tokens on both axes (queries down, keys across)."""
    if sample is None or not sample.layers:
        return None
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headcount.report.charts import ATTN_SCALE, layout

    heads = sample.layers[layer]
    tokens = sample.tokens
    scale = sample.scale
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
            showscale=h == 0, colorbar=dict(thickness=10, len=0.3, y=1, yanchor="top",
                                            title=dict(text="weight", side="right")),
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


def _head_titles(r, n_layers: int, n_heads: int) -> list[list[str]]:
    best = None
    if r.roles:
        try:
            best, _ = strongest_roles(r.roles)
        except (KeyError, IndexError, TypeError, ValueError):
            best = None
    out = []
    for l in range(n_layers):
        row = []
        for h in range(n_heads):
            role = best[l][h] if best and l < len(best) and h < len(best[l]) else None
            row.append(f"head {h}" + (f" \u00b7 {role.replace('_', '-')}" if role else ""))
        out.append(row)
    return out


def _default_layer(r, n_layers: int) -> int:
    """The layer shown first: the strongest head of the most telling role, else the middle layer."""
    found = r.roles or {}
    for k in ("induction", "previous_token", "duplicate_token", "positional"):
        hs = found[k].heads if k in found else []
        if hs and hs[0][0] < n_layers:
            return int(hs[0][0])
    return n_layers // 2


def card(r) -> str:
    sample = r.sample
    if sample is None or not sample.layers:
        body = not_available("Attention on a sample sentence", r.unavailable.get("sample"))
    else:
        n_layers, n_heads = len(sample.layers), len(sample.layers[0])
        titles = _head_titles(r, n_layers, n_heads)
        layer = _default_layer(r, n_layers)
        fig = chart(sample, layer, titles[layer])
        payload = json.dumps({"scale": sample.scale, "layers": sample.layers, "titles": titles},
                             separators=(",", ":")).replace("</", "<\\/")
        options = "".join(f'<option value="{l}"{" selected" if l == layer else ""}>layer {l}</option>'
                          for l in range(n_layers))
        body = (f'<div class="controls"><button id="attn-prev" type="button">\u2190</button>'
                f'<select id="attn-layer" aria-label="layer">{options}</select>'
                f'<button id="attn-next" type="button">\u2192</button>'
                f'<span class="sentence">\u201c{e(sample.sentence)}\u201d ({len(sample.tokens)} tokens; '
                f'rows: queries, columns: keys)</span></div>{fig_div(fig, "fig-attention")}'
                f'<script type="application/json" id="attn-data">{payload}</script>'
                f"<script>{ATTENTION_JS}</script>")
    return ('<section class="card" id="attention"><h2>One sentence through every head</h2>'
            '<p class="lede">The attention weights of each head of one layer on a sentence that repeats itself: '
            'a previous-token head draws the diagonal just below the main one; an induction head, in the second '
            'half, looks at the token after the earlier copy of the current one; a sink head piles its weight on '
            'the first token. Switch layers with the menu or the arrows.</p>' + body + "</section>")
