"""Healing: what `headcount prune --fraction 0.5 --heal-steps 200` gives, held-out perplexity per domain before the
edit, after it and after healing (its saved --json for these weights; healing is never run here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.report import commands
from headcount.report.context import Context, Step
from headcount.report.measures.commanded import command_key, on_default_corpus
from headcount.report.measures.edits import Edit
from headcount.report.page import e, not_available, ppl, size_cell, source_line, tasks
from headcount.report.section_base import Section

NAME = "healing"


@dataclass
class HeldOut(Section):
    """Held-out perplexity per domain ({domain: perplexity}) at each stage of a healed edit."""
    before_edit: dict = field(default_factory=dict)
    after_edit: dict = field(default_factory=dict)
    after_heal: dict = field(default_factory=dict)


@dataclass
class Healing(Edit):
    """The healed edit: its `held_out` stages ({before_edit, after_edit, after_heal}: {domain: perplexity}) and
    the heal's own facts, as the command's --json gives them."""
    held_out: HeldOut | None = None
    steps: int | None = None
    planned_steps: int | None = None
    tokens: int | None = None
    tokens_seen: int | None = None
    params: str | None = None
    trainable_params: int | None = None
    lr: float | None = None
    heal_seconds: float | None = None
    command_seconds: float | None = None
    val_kl_first: float | None = None
    val_kl_best: float | None = None
    best_step: int | None = None


def step(ctx: Context) -> dict:
    on_default_corpus(ctx)
    return commands.healing_section(ctx.model, results=ctx.results_dir, weights=ctx.weights, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, {"version": 2} | command_key(ctx, "heal"), step)]  # 2: tasks


def _change(a, b) -> str:
    return f"{a / b - 1:+.1%}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "\u2013"


def _facts(h: Healing) -> str:
    seconds = h.heal_seconds
    return (f'{h.steps} steps (planned {h.planned_steps}), {h.tokens or 0:,} calibration tokens '
            f'({h.tokens_seen or 0:,} seen), weights that moved: {e(str(h.params))} '
            f'({h.trainable_params or 0:,}), lr {h.lr}'
            + (f", {seconds:,.0f} s of healing" if isinstance(seconds, (int, float)) else "")
            + (f" ({h.command_seconds:,.0f} s for the whole command)" if h.command_seconds else "")
            + (f"; validation KL {h.val_kl_first:.3f} \u2192 {h.val_kl_best:.3f} (best at step "
               f"{h.best_step})" if h.val_kl_first is not None and h.val_kl_best is not None else ""))


def card(r) -> str:
    h = r.healing
    if h is None:
        body = not_available("Healing", r.unavailable.get("healing", "not measured for this report"))
    else:
        figures = h.held_out or HeldOut()
        before, edit, healed = figures.before_edit or {}, figures.after_edit or {}, figures.after_heal or {}
        sizes = h.domain_sizes or {}
        rows = "".join(f'<tr><td>{e(name)}</td><td>{size_cell(sizes, name)}</td><td>{ppl(b)}</td>'
                       f'<td>{ppl(edit.get(name))}</td><td>{ppl(healed.get(name))}</td>'
                       f'<td>{_change(edit.get(name), b)}</td><td>{_change(healed.get(name), b)}</td></tr>'
                       for name, b in before.items())
        removed = (h.heads_before if h.heads_before is not None else 0) - (h.heads_after if h.heads_after is not None
                                                                           else 0)
        body = (f'<h3 class="sub" style="margin-top:0">What <code>{e(str(h.command))}</code> gives: '
                f'{removed} of {h.heads_before} heads removed, then '
                'healed by distillation from the unedited model</h3>'
                '<table class="data domains" id="healing-table"><tr><th>held-out perplexity</th><th>windows \u00d7 '
                'tokens</th><th>before the edit</th><th>after the edit</th><th>after healing</th><th>edit</th>'
                f'<th>healed</th></tr>{rows}</table>'
                f'<p class="lede" style="margin-top:4px">{_facts(h)}.</p>' + tasks(h, "heal")
                + source_line(h, r.model))
    return ('<section class="card" id="healing"><h2>Healing an edited model</h2>'
            '<p class="lede">An edit that costs too much can win part of the loss back by distillation from the '
            'unedited model on calibration text (<code>headcount heal</code>, <code>--heal-steps N</code> on every '
            'edit); the held-out domains are only measured, never trained or chosen on.</p>' + body + "</section>")
