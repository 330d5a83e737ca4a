"""The model's shape and its three accounts as MHA / GQA / MQA (parameters, FLOPs, score memory, KV cache), each
row `headcount cost`'s numbers (C4-C6, C10, C14 read them). One step gives both sections, `shape` and `accounts`."""

from __future__ import annotations

from dataclasses import dataclass

from headcount.report.accounts import accounts, shape_json, shape_of, window_note
from headcount.report.context import Context, Step
from headcount.report.page import e, fig_div, fmt_bytes, fmt_num, not_available
from headcount.report.section_base import Section

NAME = "shape"


@dataclass
class Shape(Section):
    head_dim: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    d_model: int | None = None
    attention_kind: str = ""
    describe: str = ""
    note: str | None = None  # what the accounts leave out (a bidirectional encoder's windows)


@dataclass
class AccountRow(Section):
    label: str
    n_kv_heads: int
    kv_bytes_per_token: int
    is_model: bool = False
    kv_bytes_per_token_past_window: int | None = None
    params: int | None = None
    attention_params: int | None = None
    kv_bytes_context: int | None = None
    kv_bytes_context_without_window: int | None = None
    flops: int | None = None
    flops_without_window: int | None = None
    score_bytes_per_layer: int | None = None


@dataclass
class SlidingWindow(Section):
    size: int
    local_layers: int
    global_layers: int


@dataclass
class Accounts(Section):
    rows: list[AccountRow]
    dtype: str = ""
    window: SlidingWindow | None = None
    seq: int | None = None

    @property
    def model_row(self) -> AccountRow | None:
        """The row of the model's own K/V head count."""
        return next((row for row in self.rows if row.is_model), None)


def step(ctx: Context) -> dict:
    s = shape_of(ctx.model)
    return {"shape": shape_json(s, window_note(ctx.model)), "accounts": accounts(s)}


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, {"version": 2}, step)]  # 2: q/k norms, post norms, windows, gated GELU, RMSNorm


def chart(acc: Accounts | None):
    rows = acc.rows if acc is not None else []
    if not rows:
        return None
    import plotly.graph_objects as go

    from headcount.report.charts import layout

    labels = [f"{r.label}, {r.n_kv_heads} KV head{'s' if r.n_kv_heads > 1 else ''}" for r in rows]
    colors = ["#E45756" if r.is_model else "#9FB3C8" for r in rows]
    fig = go.Figure(go.Bar(
        y=labels, x=[r.kv_bytes_per_token / 1024 for r in rows], marker_color=colors, orientation="h",
        text=[f"{r.kv_bytes_per_token / 1024:,.1f} KiB" for r in rows], textposition="outside",
        hovertemplate="%{y}<br>%{x:,.1f} KiB per token<extra></extra>", cliponaxis=False))
    layout(fig, height=260, margin=dict(l=120, r=70, t=20, b=50))
    fig.update_xaxes(title=f"KV cache per token, KiB ({acc.dtype})", rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return fig


def _window_note(r, acc: Accounts) -> str:
    """What the accounts say about sliding windows (Gemma 3), and what they leave out (a bidirectional encoder)."""
    out = ""
    win, mine = acc.window, acc.model_row
    if win and mine and mine.kv_bytes_context_without_window is not None:
        out += (f' Sliding window: {win.local_layers} of {win.local_layers + win.global_layers} layers see '
                f'the last {win.size:,} keys, so their KV cache holds at most {win.size:,} positions: at '
                f'{acc.seq:,} tokens this model keeps {fmt_bytes(mine.kv_bytes_context)} instead of '
                f'{fmt_bytes(mine.kv_bytes_context_without_window)}, and past the window each token adds '
                f'{fmt_bytes(mine.kv_bytes_per_token_past_window)} (the global layers only); causal FLOPs count '
                f'the band ({fmt_num(mine.flops)} instead of {fmt_num(mine.flops_without_window)}).')
    note = r.shape.note if r.shape is not None else None
    if note:
        out += f" Not counted: {e(note)}."
    return out


def card(r) -> str:
    acc = r.accounts
    if acc is None:
        body = not_available("The three accounts", r.unavailable.get("shape"))
    else:
        head = ("<tr><th>attention</th><th>KV heads</th><th>parameters</th><th>attention params</th>"
                f"<th>KV cache / token</th><th>KV cache at {acc.seq:,} tokens</th><th>FLOPs at {acc.seq:,}</th>"
                "<th>eager scores / layer</th></tr>")
        rows = "".join(
            f'<tr class="{"mine" if x.is_model else ""}"><td>{e(x.label)}'
            f'{" (this model)" if x.is_model else ""}</td><td>{x.n_kv_heads}</td>'
            f'<td>{x.params:,}</td><td>{x.attention_params:,}</td><td>{fmt_bytes(x.kv_bytes_per_token)}</td>'
            f'<td>{fmt_bytes(x.kv_bytes_context)}</td><td>{fmt_num(x.flops)}</td>'
            f'<td>{fmt_bytes(x.score_bytes_per_layer)}</td></tr>' for x in acc.rows)
        body = (f'<div class="wide"><div style="overflow-x:auto"><table class="data">{head}{rows}</table>'
                f'<p class="lede" style="margin-top:10px">Only n_kv_heads changes between the rows. Parameters and '
                f'FLOPs barely move; the KV cache falls in proportion to the KV heads. Batch 1, {e(acc.dtype)}, '
                f'from <code>headcount cost</code>.{_window_note(r, acc)}</p></div>'
                f'<div>{fig_div(chart(acc), "fig-accounts")}</div></div>')
    return ('<section class="card" id="accounts"><h2>Shape and the three accounts: MHA, GQA, MQA</h2>'
            f'<p class="lede">The same model counted three ways: with a K/V head per query head (MHA), '
            f'with groups of query heads sharing one (GQA), and with a single one (MQA).</p>{body}</section>')
