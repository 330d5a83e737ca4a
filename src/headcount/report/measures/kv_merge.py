"""The K/V merge (C15): what `headcount merge-kv --kv-heads 1` gives (its saved --json for these weights, or its
defaults run here), or on a user's text the merge at the report's sizes."""

from __future__ import annotations

from dataclasses import dataclass

from headcount.report import commands
from headcount.report.context import Context, Step
from headcount.report.measures.commanded import command_key
from headcount.report.measures.edits import Edit
from headcount.report.page import (domains, e, fmt_bytes, fmt_num, kpi, not_available, ppl, source_line, tasks)
from headcount.report.verdicts import merge_how

NAME = "kv_merge"


@dataclass
class Merge(Edit):
    """A K/V merge: the KV cache and the parameters before / after, beside Edit's heads and perplexities."""
    kv_bytes_per_token_before: int | None = None
    kv_bytes_per_token_after: int | None = None
    params_before: int | None = None
    params_after: int | None = None


def step(ctx: Context) -> dict:
    if not ctx.user_text:
        return commands.merge_section(ctx.model, results=ctx.results_dir, weights=ctx.weights, progress=ctx.progress)
    s = ctx.sizes  # the merge on the user's text, at the report's sizes
    steps_ = {k: v for k, v in (("local_steps", s.merge_local_steps), ("uptrain_steps", s.merge_uptrain_steps))
              if v is not None}
    return commands.text_merge_section(ctx.model, calibration=ctx.calibration(s.merge_windows), meter=ctx.meter,
                                       n_windows=s.merge_windows, window=ctx.window, progress=ctx.progress, **steps_)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, {"version": 5} | command_key(ctx, "merge"), step)]  # 5: run_edit


def _number(fmt):
    return lambda v: fmt(v) if isinstance(v, (int, float)) else "\u2013"


def card(r) -> str:
    """The merge's part of the surgery card (its right column)."""
    m = r.kv_merge
    if m is None:
        return not_available("The K/V merge", r.unavailable.get("kv_merge", "headcount.surgery.merge_kv was not run"))
    kpis = ('<div class="kpis">'
            + kpi("KV heads (all layers)", m.heads_before, m.heads_after)
            + kpi("KV cache / token", m.kv_bytes_per_token_before, m.kv_bytes_per_token_after, _number(fmt_bytes))
            + kpi("parameters", m.params_before, m.params_after, _number(fmt_num))
            + kpi("held-out perplexity (prose)", m.ppl_before, m.ppl_after, ppl)
            + "</div>")
    if m.source == "text":
        return (f'<h3 class="sub" style="margin-top:0">Merging K/V heads to one per layer on the report\'s own text '
                f'(merge_kv\'s defaults: {e(merge_how(m))})</h3>' + kpis + domains(m, "after the merge"))
    return (f'<h3 class="sub" style="margin-top:0" id="merge-command">What <code>{e(str(m.command))}</code> '
            f'gives ({e(merge_how(m))}; claim C15)</h3>' + kpis + domains(m, "after the merge")
            + tasks(m, "merge") + source_line(m, r.model))
