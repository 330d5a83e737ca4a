"""The report's steps, in report.json's order: one module per measure (report/measures/), each giving its Steps.

    ctx = Context.build(model, texts, seed=, sizes=, sample=, progress=, results_dir=, timings=, weights=)
    report_steps(ctx) -> [Step(name, params, run, model_free)]    in report.json's order; run(ctx) -> JSON-able

A step whose section does not apply to the model (faithfulness on an encoder, a K/V merge of a model with one KV
head, healing without a saved result) raises NotApplicable with the reason, which collect.py records under
`unavailable`; any other exception is a failure of the report. `params` (with the weights' and the text's hashes)
is the step's cache key: change what a step computes and its params must change with it (in its measure module).
"""

from __future__ import annotations

from headcount.report.context import Context, Step, spread, split_texts  # noqa: F401 (collect's, the tests')
from headcount.report.measures import (checks, experiments, faithfulness, gates, healing, importance, kv_merge,
                                       prune_command, pruning, rank, roles, sample, shape)

# report.json's order; pruning reads importance's scores (ctx.done), so importance comes first
MEASURES = (shape, checks, sample, roles, faithfulness, rank, importance, pruning, prune_command, kv_merge, healing,
            gates, experiments)


def report_steps(ctx: Context) -> list[Step]:
    """The report's steps in order, each with its cache key's parameters (with the step's own sizes)."""
    return [step for measure in MEASURES for step in measure.steps(ctx)]
