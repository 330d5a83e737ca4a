"""Roles (C7): seven role scores per (layer, head), labelled past thresholds; its card is the head map (each head
coloured by its strongest role) beside head importance, with the labelled heads listed."""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.analysis import roles
from headcount.report.context import Context, Step
from headcount.report.measures import importance
from headcount.report.page import e, fig_div, not_available
from headcount.report.section_base import Section
from headcount.report.verdicts import ROLE_NAMES, head_name

NAME = "roles"


@dataclass
class Role(Section):
    scores: list
    threshold: float | None = None
    heads: list = field(default_factory=list)  # [[layer, head(, extra)], ...], strongest first


def step(ctx: Context):
    s = ctx.sizes
    return roles(ctx.model, ctx.cal, max_tokens=s.roles_tokens, window=ctx.window, max_sentences=s.roles_sentences,
                 seed=ctx.seed, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, ctx.sized | {"tokens": ctx.sizes.roles_tokens, "sentences": ctx.sizes.roles_sentences}, step)]


def _label_of(entry) -> str | None:
    if len(entry) > 2 and entry[2] is not None:
        extra = entry[2]
        return f"{extra:+d}" if isinstance(extra, int) else str(extra)
    return None


def strongest_roles(found: dict) -> tuple[list[list[str | None]], list[list[str]]]:
    """Per (layer, head): the role it is labelled with most strongly (score / threshold; the sink only
    when nothing else), and a hover text listing every role's score. found: {role: Role or its JSON}."""
    found = {r: Role.from_json(v) for r, v in found.items() if isinstance(v, (dict, Role))}
    names = [r for r in ROLE_NAMES if r in found]
    first = found[names[0]].scores
    n_layers, n_heads = len(first), max(len(row) for row in first)
    labels = {r: {tuple(x[:2]): _label_of(x) for x in found[r].heads} for r in names}
    best: list[list[str | None]] = [[None] * n_heads for _ in range(n_layers)]
    hover: list[list[str]] = [[""] * n_heads for _ in range(n_layers)]
    for l in range(n_layers):
        for h in range(n_heads):
            cands = []
            lines = [f"<b>layer {l}, head {h}</b>"]
            for r in names:
                row = found[r].scores[l] if l < len(found[r].scores) else []
                s = row[h] if h < len(row) else None
                thr = found[r].threshold
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


def chart(found: dict[str, Role] | None):
    """The head map: every (layer, head) coloured by its strongest role."""
    if not found:
        return None
    import plotly.graph_objects as go

    from headcount.report.charts import NONE_COLOR, ROLE_COLORS, ROLE_SHORT, layout

    best, hover = strongest_roles(found)
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


def _legend() -> str:
    from headcount.report.charts import NONE_COLOR, ROLE_COLORS, ROLE_SHORT

    chips = "".join(f'<span><i style="background:{ROLE_COLORS[r]}"></i>{e(r.replace("_", "-"))} '
                    f'({ROLE_SHORT[r]})</span>' for r in ROLE_NAMES)
    return f'<div class="legend">{chips}<span><i style="background:{NONE_COLOR}"></i>no role</span></div>'


def _labelled(found: dict[str, Role]) -> str:
    from headcount.report.charts import ROLE_COLORS

    rows = []
    for k in ROLE_NAMES:
        role = found.get(k)
        hs = role.heads if role is not None else []
        threshold = role.threshold if role is not None and role.threshold is not None else "–"
        names = ", ".join(head_name(h) for h in hs[:6]) + (f" and {len(hs) - 6} more" if len(hs) > 6 else "")
        rows.append(f'<tr><td><i style="display:inline-block;width:10px;height:10px;border-radius:2px;'
                    f'background:{ROLE_COLORS[k]};margin-right:6px"></i>{e(k)}</td>'
                    f'<td>{threshold}</td><td>{len(hs)}</td>'
                    f'<td style="text-align:left">{e(names) or "–"}</td></tr>')
    return ('<h3 class="sub">Labelled heads, highest score first</h3><table class="data"><tr><th>role</th>'
            '<th>threshold</th><th>heads</th><th style="text-align:left">which</th></tr>' + "".join(rows)
            + "</table>")


def card(r) -> str:
    """The head map card: roles left, importance right, the labelled heads under them."""
    found, imp = r.roles, r.importance
    left = (_legend() + fig_div(chart(found), "fig-headmap")) if found else not_available(
        "Role scores", r.unavailable.get("roles"))
    right = (fig_div(importance.chart(imp), "fig-importance") if imp is not None and imp.scores
             else not_available("Head importance", r.unavailable.get("importance",
                                                                     "headcount.analysis.importance was not run")))
    tops = _labelled(found) if found else ""
    method = imp.method if imp is not None else None
    return ('<section class="card" id="heads"><h2>The head map</h2>'
            '<p class="lede">Every (layer, head) coloured by its strongest role (score over threshold; the sink '
            'only when nothing else). Hover a cell for all its scores. Right: how much the loss depends on each '
            f'head{f" ({e(method)})" if method else ""}.</p>'
            f'<div class="grid2"><div>{left}</div><div><div class="legend">&nbsp;</div>{right}</div></div>'
            f"{tops}</section>")
