"""report.json -> one self-contained HTML page (plotly.js inlined once; no network, nothing beside it).

    render_html(report) -> str

Takes only the JSON-able report (collect.assemble's output), read once as the typed sections.ReportData, so the
page can be built and tested without running an analysis. Each measure's card is in its module
(report/measures/); this module puts them in the page's order under the header, the claims and the navigation.
A missing section becomes a "not available" panel with its reason.
"""

from __future__ import annotations

from headcount.report.measures import faithfulness, healing, pruning, rank, roles, sample, shape
from headcount.report.page import e, fmt_bytes, fmt_num
from headcount.report.sections import ReportData, check_format
from headcount.report.style import CSS
from headcount.report.verdicts import ROLE_NAMES

_STATUS_CLASS = {"held": "held", "partly": "partly", "did not hold": "nothold", "not measured": "na"}


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


def _footer(r: ReportData) -> str:
    p = r.params
    missing = "; ".join(f"{k}: {v}" for k, v in sorted(r.unavailable.items()))
    dot = " \u00b7 "
    quick = f"{dot}quick" if p is not None and p.quick else ""
    gone = f"<br>not available: {e(missing)}" if missing else ""
    text, seed = (p.text, p.seed) if p is not None else (None, None)
    return (f'<footer>headcount report{dot}model {e(str(r.model))}{dot}text: {e(str(text))}'
            f'{dot}seed {e(str(seed))}{quick}{gone}<br>report.json beside this page holds every '
            "number shown here.</footer>")


# the page's cards in order (the claims first), and the navigation to them
CARDS = (_claims, shape.card, roles.card, sample.card, pruning.card, healing.card, faithfulness.card, rank.card)
NAV = [("claims", "Claims"), ("accounts", "Accounts"), ("heads", "Head map"), ("attention", "Attention"),
       ("surgery", "Pruning & K/V merge"), ("healing", "Healing"), ("faithfulness", "Faithfulness"), ("rank", "Rank")]


def render_html(report: dict) -> str:
    """The page of a report.json of this FORMAT (another version: a one-line ValueError saying to rebuild it)."""
    from plotly.offline import get_plotlyjs

    check_format(report)
    data = ReportData.from_json(report)

    nav = "".join(f'<a href="#{a}">{e(b)}</a>' for a, b in NAV)
    body = "".join(card(data) for card in CARDS)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>headcount report: {e(str(data.model))}</title><style>{CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
            f"{_header(data)}<main><nav>{nav}</nav>{body}{_footer(data)}</main></body></html>\n")
