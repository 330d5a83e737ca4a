"""What every card of the page shares: escaping, the "not available" panel, a plotly figure as a div, number
formats and the before / after pieces of the edits (KPIs, the held-out domains, task pass@1, the source line).

Cards (one per report measure, in report/measures/) take typed sections (sections.ReportData) and return HTML;
html.py puts them in order.
"""

from __future__ import annotations

import html

from headcount.report.verdicts import command_source, domain_table

PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines"]}

e = html.escape


def fig_div(fig, div_id: str) -> str:
    import plotly.io as pio
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG,
                       validate=False)


def not_available(what: str, reason: str | None) -> str:
    return (f'<div class="na"><b>{e(what)}: not available</b>{e(reason or "not computed for this report")}'
            "</div>")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_num(n: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:,.2f}{unit}"
    return f"{n:,.0f}"


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def fixed(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def ppl(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "\u2013"


def kpi(label, a, b, fmt=str) -> str:
    change = ""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
        change = f"<small> ({b / a - 1:+.1%})</small>"
    return f'<div class="kpi"><span>{e(label)}</span><b>{e(fmt(a))} \u2192 {e(fmt(b))}</b>{change}</div>'


def code(text: str) -> str:
    """Escape text and show its `quoted` parts as code."""
    parts = str(text).split("`")
    return "".join(f"<code>{e(p)}</code>" if i % 2 else e(p) for i, p in enumerate(parts))


def source_line(section, model) -> str:
    return f'<p class="lede source" style="margin-top:4px">Source: {code(command_source(section, model))}</p>'


def size_cell(sizes: dict | None, name: str) -> str:
    """A held-out domain's "windows x tokens" cell."""
    n, w = ((sizes or {}).get(name) or [None, None])[:2]
    return f"{n} \u00d7 {w}" if n else "\u2013"


def domains(section, after: str) -> str:
    """The three held-out domains before / after an edit (a sections.Domains): one row per domain, or why not."""
    rows = domain_table(section)
    if not rows:
        note = section.domains_note
        return f'<p class="lede" style="margin-top:8px">Held-out domains: {e(note)}.</p>' if note else ""
    body = "".join(f'<tr><td>{e(name)}</td><td>{size_cell(section.domain_sizes, name)}</td><td>{before:.2f}</td>'
                   f'<td>{after_:.2f}</td><td>{after_ / before - 1:+.1%}</td></tr>' for name, before, after_ in rows
                   if before)
    return (f'<table class="data domains" style="margin-top:8px"><tr><th>held-out perplexity</th><th>windows \u00d7 '
            f'tokens</th><th>unmodified</th><th>{e(after)}</th><th>change</th></tr>{body}</table>')


TASK_STAGES = (("before_edit", "before the edit"), ("after_edit", "after the edit"), ("after_heal", "after healing"))


def _pass(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "\u2013"


def _paired(block) -> str:
    """A tasks block's paired comparisons ({stage: {wins, losses, p_value, ...}}) in one cell."""
    if not isinstance(block, dict) or not block:
        return "\u2013"
    return "; ".join(f"{e(stage.replace('_', ' '))}: {p.get('wins')} / {p.get('losses')}, "
                     f"p = {p.get('p_value', 1.0):.2g}" for stage, p in block.items() if isinstance(p, dict))


def tasks(section, kind: str) -> str:
    """An edit's `tasks` block (--eval: {task: {stage: pass@1}}) as a table beside its perplexities."""
    found = section.tasks
    if not found:
        return ""
    stages = [(k, label) for k, label in TASK_STAGES if any(k not in v.absent for v in found.values())]
    head = "".join(f"<th>{e(label)}</th>" for _, label in stages)
    paired = any(isinstance(v.paired, dict) and v.paired for v in found.values())
    head += "<th>paired against before the edit (wins / losses, exact McNemar p)</th>" if paired else ""
    rows = "".join(f'<tr><td>{e(name)}</td>' + "".join(f"<td>{_pass(getattr(v, k))}</td>" for k, _ in stages)
                   + (f"<td>{_paired(v.paired)}</td>" if paired else "") + "</tr>" for name, v in found.items())
    return (f'<table class="data tasks" id="{kind}-tasks" style="margin-top:8px"><tr><th>task pass@1 (greedy)</th>'
            f'{head}</tr>{rows}</table>')
