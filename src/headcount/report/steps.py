"""The report's steps: one function per section of report.json, each taking the run's Context.

    ctx = Context.build(model, texts, seed=, sizes=, sample=, progress=, results_dir=, timings=, weights=)
    report_steps(ctx) -> [Step(name, params, run, model_free)]    in report.json's order; run(ctx) -> JSON-able

A step whose section does not apply to the model (faithfulness on an encoder, a K/V merge of a model with one KV
head, healing without a saved result) raises NotApplicable with the reason, which collect.py records under
`unavailable`; any other exception is a failure of the report. `params` (with the weights' and the text's hashes)
is the step's cache key: change what a step computes and its params must change with it.
"""

from __future__ import annotations

import functools

from headcount.analysis import HeadScores, importance, roles
from headcount.report import commands
from headcount.report.accounts import accounts, shape_json, shape_of, window_note
from headcount.report.checks import chapter_checks
from headcount.report.context import Context, Step, spread, split_texts  # noqa: F401 (collect's, the tests')
from headcount.report.curve import pruning_section
from headcount.report.measures import faithfulness, gates, healing, kv_merge, prune_command, pruning, rank, shape
from headcount.report.not_applicable import NotApplicable
from headcount.report.sample import sample_attention
from headcount.report.trained import (EXPERIMENT_NAMES, experiment_section, experiment_source, gates_section,
                                      gates_source, saved_gates)


# ------------------------------------------------------------------------------ the model's own steps
def checks_step(ctx: Context) -> dict:
    return chapter_checks(ctx.model, ctx.sample)


def sample_step(ctx: Context) -> dict:
    return sample_attention(ctx.model, ctx.sample)


def roles_step(ctx: Context):
    s = ctx.sizes
    return roles(ctx.model, ctx.cal, max_tokens=s.roles_tokens, window=ctx.window, max_sentences=s.roles_sentences,
                 seed=ctx.seed, progress=ctx.progress)


def importance_step(ctx: Context):
    s = ctx.sizes
    if ctx.decoder:
        return importance(ctx.model, method=ctx.method, windows=ctx.calibration(s.importance_windows),
                          max_windows=None, window=ctx.window, progress=ctx.progress)
    return importance(ctx.model, ctx.cal, method=ctx.method, window=ctx.window, max_windows=s.importance_windows,
                      max_sentences=s.encoder_sentences, progress=ctx.progress)


def experiment_step(name: str, ctx: Context) -> dict:
    return experiment_section(name, results=ctx.results_dir, seed=ctx.seed, progress=ctx.progress)


def report_steps(ctx: Context) -> list[Step]:
    """The report's steps in order, each with its cache key's parameters (with the step's own sizes)."""
    s = ctx.sizes
    sized = {"seed": ctx.seed, "window": ctx.window}
    cal_key = {"calibration": s.importance_windows, "eval": s.eval_windows, "sentences": s.encoder_sentences}
    domain_key = {"domains": [s.domain_windows, s.domain_window]}  # code and source too
    steps = [
        *shape.steps(ctx),
        Step("checks", {"sentence": ctx.sample, "version": 3}, checks_step),
        Step("sample", {"sentence": ctx.sample}, sample_step),
        Step("roles", sized | {"tokens": s.roles_tokens, "sentences": s.roles_sentences}, roles_step),
        *faithfulness.steps(ctx),
        *rank.steps(ctx),
        Step("importance", sized | {"windows": s.importance_windows, "method": ctx.method}, importance_step),
        *pruning.steps(ctx),
        *prune_command.steps(ctx),
        *kv_merge.steps(ctx),
        *healing.steps(ctx),
        *gates.steps(ctx),
    ]
    for name in EXPERIMENT_NAMES:
        steps.append(Step(f"experiment-{name}", {"seed": ctx.seed} | experiment_source(name, ctx.results_dir),
                          functools.partial(experiment_step, name), model_free=True))
    return steps
