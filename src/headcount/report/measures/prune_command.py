"""What `headcount prune --fraction 0.2` gives (C11): its saved --json for these weights, or its defaults run here
through the functions it calls."""

from __future__ import annotations

from headcount.report import commands
from headcount.report.context import Context, Step
from headcount.report.measures.commanded import command_key, on_default_corpus
from headcount.report.page import domains, e, kpi, ppl, source_line, tasks

NAME = "prune_command"  # its section is a measures.edits.Edit


def step(ctx: Context) -> dict:
    on_default_corpus(ctx)
    return commands.prune_section(ctx.model, results=ctx.results_dir, weights=ctx.weights, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, {"version": 2} | command_key(ctx, "prune"), step)]  # 2: run_edit


def card(r) -> str:
    """The command's part of the surgery card, under the pruning curve ("" without it)."""
    pc = r.prune_command
    if pc is None:
        return ""
    kpis = (f'<div class="kpi"><span>heads removed</span><b>{pc.heads_removed} of {pc.heads_before}</b>'
            f'<small> (order {e(str(pc.order))}, compensation {e(str(pc.compensate))})</small></div>')
    if pc.ppl_before is not None:
        kpis += kpi("held-out perplexity (prose)", pc.ppl_before, pc.ppl_after, ppl)
    elif pc.cosine is not None:
        kpis += f'<div class="kpi"><span>embedding cosine</span><b>{pc.cosine:.3f}</b></div>'
    return (f'<h3 class="sub" id="prune-command">What <code>{e(str(pc.command))}</code> gives (claim C11)</h3>'
            f'<div class="kpis">{kpis}</div>' + domains(pc, "after the prune") + tasks(pc, "prune")
            + source_line(pc, r.model))
