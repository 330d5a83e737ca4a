"""What the steps of the commands' edits share (prune_command, kv_merge, healing): their cache key, and the refusal
on a user's text (the commands calibrate and measure on the default corpus)."""

from __future__ import annotations

from headcount.report import commands
from headcount.report.context import Context
from headcount.report.not_applicable import NotApplicable


def on_default_corpus(ctx: Context) -> None:
    if ctx.user_text:
        raise NotApplicable("the report's own text: the commands calibrate and measure on the default corpus "
                            "(run the command with --text FILE for this text)")


def command_key(ctx: Context, kind: str) -> dict:
    """What a command step reads or runs, as cache-key parameters."""
    if ctx.user_text:
        s = ctx.sizes
        return {"source": "text", "windows": s.merge_windows, "eval": s.eval_windows,
                "steps": [s.merge_local_steps, s.merge_uptrain_steps]}
    return commands.command_source(ctx.results_dir, ctx.name, kind, ctx.weights)
