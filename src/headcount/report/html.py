"""report.json -> one self-contained HTML page (plotly.js inlined once; no network, nothing beside it).

    render_html(report) -> str

Takes only the JSON-able report (collect.assemble's output), so the page can be built and tested
without running an analysis. A missing section becomes a "not available" panel with its reason.
"""

from __future__ import annotations

import html
import json

from headcount.report import charts
from headcount.report.claims import GATES_FILE, ROLE_NAMES, command_source, domain_table, head_name, merge_how
from headcount.report.measures import faithfulness, healing, pruning, rank, roles, sample, shape
from headcount.report.page import fmt_bytes, fmt_num
from headcount.report.sections import ReportData, check_format
from headcount.report.style import ATTENTION_JS, CSS

PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines"]}
_STATUS_CLASS = {"held": "held", "partly": "partly", "did not hold": "nothold", "not measured": "na"}

e = html.escape


def _fig(fig, div_id: str) -> str:
    import plotly.io as pio
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG,
                       validate=False)


def _na(what: str, reason: str | None) -> str:
    return (f'<div class="na"><b>{e(what)}: not available</b>{e(reason or "not computed for this report")}'
            "</div>")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_num(n: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:,.2f}{unit}"
    return f"{n:,.0f}"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _f(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


# ----------------------------------------------------------------------------------------- parts
def _header(r: ReportData) -> str:
    s = r.shape
    mine = r.accounts.model_row if r.accounts is not None else None
    roles = r.roles or {}
    labelled = {tuple(x[:2]) for k in ROLE_NAMES if k in roles for x in roles[k].heads}
    stats = []
    if s is not None:
        stats += [(f"{s.n_layers} \u00d7 {s.n_heads}", "layers \u00d7 query heads"),
                  (f"{s.n_kv_heads}", f"KV heads per layer ({s.attention_kind})"),
                  (f"{s.head_dim}", "head_dim"), (f"{s.d_model}", "d_model")]
    if mine:
        stats += [(fmt_num(mine.params), "parameters"),
                  (fmt_bytes(mine.kv_bytes_per_token), f"KV cache / token ({r.accounts.dtype})")]
    if roles:
        stats.append((str(len(labelled)), "heads with a role"))
    held = sum(c.status == "held" for c in r.claims)
    stats.append((f"{held} / {len(r.claims)}", "chapter claims held"))
    cards = "".join(f'<div class="stat"><b>{e(a)}</b><span>{e(b)}</span></div>' for a, b in stats)
    desc = s.describe if s is not None else ""
    return (f'<header><h1>What the heads of {e(str(r.model))} do</h1>'
            f'<div class="sub">{e(r.kind or "")} \u00b7 {e(desc)}</div><div class="stats">{cards}</div></header>')


def _number(x) -> str:
    if x is None:
        return "\u2013"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1e5 else f"{x:.4g}"
    return str(x)


def _claims(r: ReportData) -> str:
    claims = r.claims
    items = []
    for c in claims:
        cls = _STATUS_CLASS.get(c.status, "na")
        items.append(
            f'<div class="claim {cls}" id="claim-{e(c.id)}"><h3><span class="id">{e(c.id)}</span>{e(c.title)}'
            f'<span class="badge {cls}">{e(c.status)}</span></h3>'
            f'<p class="says">Chapter: {e(c.claim)}</p><p class="found">{e(c.finding)}</p>'
            f'<p class="num">Number: <b>{e(_number(c.number))}</b></p>'
            f'<p class="test">Test: {e(c.test)}</p>'
            f'<p class="src">Source: {e(c.source or "not available in this report")}</p></div>')
    held = sum(c.status == "held" for c in claims)
    return ('<section class="card" id="claims"><h2>The chapter\'s claims, on this model</h2>'
            f'<p class="lede">Each of the {len(claims)} claims of chapter 2.3 next to what this model showed '
            f'({held} of {len(claims)} held), with the number and the test that decided it, and where the number '
            'came from: measured on this model in this run, or a small model trained from scratch (a saved full '
            'run of the experiment, or its --quick run). A claim that did not hold is shown as such.</p>'
            f'<div class="claims">{"".join(items)}</div></section>')


def _kpi(label, a, b, fmt=str) -> str:
    change = ""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
        change = f"<small> ({b / a - 1:+.1%})</small>"
    return f'<div class="kpi"><span>{e(label)}</span><b>{e(fmt(a))} \u2192 {e(fmt(b))}</b>{change}</div>'


def _ppl(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "\u2013"


def _source_line(section: dict, model) -> str:
    return f'<p class="lede source" style="margin-top:4px">Source: {_code(command_source(section, model))}</p>'


def _code(text: str) -> str:
    """Escape text and show its `quoted` parts as code."""
    parts = str(text).split("`")
    return "".join(f"<code>{e(p)}</code>" if i % 2 else e(p) for i, p in enumerate(parts))


def _footer(r: dict) -> str:
    p = r.get("params") or {}
    un = r.get("unavailable") or {}
    missing = "; ".join(f"{k}: {v}" for k, v in sorted(un.items()))
    dot = " \u00b7 "
    quick = f"{dot}quick" if p.get("quick") else ""
    gone = f"<br>not available: {e(missing)}" if missing else ""
    return (f'<footer>headcount report{dot}model {e(str(r.get("model")))}{dot}text: {e(str(p.get("text")))}'
            f'{dot}seed {e(str(p.get("seed")))}{quick}{gone}<br>report.json beside this page holds every '
            "number shown here.</footer>")


NAV = [("claims", "Claims"), ("accounts", "Accounts"), ("heads", "Head map"), ("attention", "Attention"),
       ("surgery", "Pruning & K/V merge"), ("healing", "Healing"), ("faithfulness", "Faithfulness"), ("rank", "Rank")]


def render_html(report: dict) -> str:
    """The page of a report.json of this FORMAT (another version: a one-line ValueError saying to rebuild it)."""
    from plotly.offline import get_plotlyjs

    check_format(report)
    data = ReportData.from_json(report)

    nav = "".join(f'<a href="#{a}">{e(b)}</a>' for a, b in NAV)
    body = "".join([_claims(data), shape.card(data), roles.card(data), sample.card(data), pruning.card(data),
                    healing.card(data), faithfulness.card(data), rank.card(data)])
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>headcount report: {e(str(report.get('model')))}</title><style>{CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
            f"{_header(data)}<main><nav>{nav}</nav>{body}{_footer(report)}</main></body></html>\n")
