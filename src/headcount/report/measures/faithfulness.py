"""Faithfulness: is attention an explanation? Kendall tau of a head's attention against gradient x input and
leave-one-out, and the adversarial attention reached at the same output (Jain and Wallace; C13)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.analysis import faithfulness
from headcount.report.context import Context, Step
from headcount.report.not_applicable import NotApplicable
from headcount.report.page import fig_div, fixed, not_available
from headcount.report.section_base import Section

NAME = "faithfulness"


@dataclass
class FaithfulHead(Section):
    layer: int
    head: int
    tau_gradient: float | None = None
    tau_loo: float | None = None
    tau_uniform: float | None = None
    jsd: float | None = None
    tv: float | None = None


@dataclass
class Faithfulness(Section):
    heads: list[FaithfulHead] = field(default_factory=list)
    epsilon: float | None = None
    n_examples: int | None = None
    layers: list | None = None


def step(ctx: Context):
    if not ctx.decoder:
        raise NotApplicable("faithfulness needs a causal language model (a next-token loss); "
                            f"{ctx.name or 'this model'} is an encoder")
    s = ctx.sizes
    return faithfulness(ctx.model, ctx.held, layers=ctx.faithfulness_layers, n_examples=s.faithfulness_examples,
                        steps=s.faithfulness_steps, seed=ctx.seed, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    s = ctx.sizes
    return [Step(NAME, ctx.sized | {"layers": ctx.faithfulness_layers, "examples": s.faithfulness_examples,
                                    "steps": s.faithfulness_steps}, step)]


def chart(faith: Faithfulness | None):
    heads = faith.heads if faith is not None else []
    if not heads:
        return None
    import plotly.graph_objects as go

    from headcount.report.charts import LINE_COLORS, layout

    layers = sorted({h.layer for h in heads})
    fig = go.Figure()
    for i, l in enumerate(layers):
        hs = [h for h in heads if h.layer == l and h.tau_gradient is not None]
        fig.add_trace(go.Scatter(
            x=[h.tau_gradient for h in hs], y=[h.jsd for h in hs], mode="markers", name=f"layer {l}",
            marker=dict(size=10, color=LINE_COLORS[i % len(LINE_COLORS)], line=dict(width=1, color="white")),
            customdata=[[h.head, h.tau_loo, h.tv] for h in hs],
            hovertemplate=f"layer {l}, head %{{customdata[0]}}<br>tau (gradient) %{{x:.2f}}<br>"
                          "tau (leave-one-out) %{customdata[1]:.2f}<br>JSD %{y:.3f}, TV %{customdata[2]:.4f}"
                          "<extra></extra>"))
    fig.add_vline(x=0, line=dict(color="#bbb", dash="dot"))
    layout(fig, height=360, legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title="Kendall tau: attention vs gradient x input", range=[-1, 1])
    fig.update_yaxes(title="adversarial JSD at the same output", rangemode="tozero")
    return fig


def card(r) -> str:
    f = r.faithfulness
    if f is None or not f.heads:
        body = not_available("Faithfulness", r.unavailable.get("faithfulness"))
    else:
        rows = "".join(
            f'<tr><td>L{h.layer} H{h.head}</td><td>{fixed(h.tau_gradient, 2)}</td>'
            f'<td>{fixed(h.tau_loo, 2)}</td><td>{fixed(h.tau_uniform, 2)}</td>'
            f'<td>{fixed(h.jsd)}<span class="cell-bar" style="width:{int(40 * min(1.0, h.jsd or 0))}px">'
            f'</span></td><td>{fixed(h.tv, 4)}</td></tr>'
            for h in sorted(f.heads, key=lambda h: (h.layer, h.head)))
        table = ('<div class="scroll"><table class="data"><tr><th>head</th><th>\u03c4 gradient\u00d7input</th>'
                 '<th>\u03c4 leave-one-out</th><th>\u03c4 uniform</th><th>adversarial JSD</th><th>TV reached</th></tr>'
                 f"{rows}</table></div>")
        note = (f'<p class="lede" style="margin-top:8px">Kendall \u03c4 between a head\'s attention over the input '
                f'tokens and each token\'s importance for the loss; the adversarial search moves the attention as far '
                f'as it can (Jensen-Shannon divergence) while the next-token distribution moves by at most '
                f'\u03b5 = {f.epsilon} (total variation). {"?" if f.n_examples is None else f.n_examples} examples, '
                f'layers {", ".join(str(x) for x in f.layers or [])}.</p>')
        body = f'<div class="wide"><div>{table}{note}</div><div>{fig_div(chart(f), "fig-faith")}</div></div>'
    return ('<section class="card" id="faithfulness"><h2>Is attention an explanation?</h2>'
            '<p class="lede">Jain and Wallace (2019): attention weights often disagree with gradient importance, '
            'and very different attention can give the same prediction.</p>' + body + "</section>")
