"""What the surgery commands share (prune, merge-kv, prune --method l0): the --out check, --text split
into calibration and held-out, held-out quality and the before/after table. Imported by each command
family's cli.py; imports none of them (no cycle). No torch at module level."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from headcount.paths import check_out_dir  # noqa: F401 (the commands import it from here)


EVAL_HELP = ("TASK[:N]: also judge the edit by pass@1 on a task (humaneval, or a JSONL file of problems; N = the "
             "first N), before the edit, after it and after healing; repeatable")


def task_scores(values, log=None):
    """surgery.task_scores.TaskScores for --eval's values (empty: measures nothing), checked before any work."""
    from headcount.surgery.task_scores import TaskScores, parse_eval

    return TaskScores(parse_eval(values), log=log)


def check_eval_model(evals, model) -> None:
    """--eval needs a decoder with a tokenizer: said before the edit starts."""
    if evals:
        from headcount.tasks.harness import check_model
        try:
            check_model(model)
        except ValueError as e:
            raise ValueError(str(e).replace("--model:", "--eval:")) from None


def calibration_and_held_out(text: Optional[Path]):
    """(calibration texts or None, held-out texts or None, source name) from --text FILE."""
    if text is None:
        return None, None, "default corpus"
    from headcount.data import corpus_from_text, read_text

    corpus = corpus_from_text(read_text(text), name=text.name)
    if not corpus.calibration or not corpus.held_out:
        raise ValueError(f"--text: {text} needs at least two paragraphs (blank-line separated): one to calibrate on, "
                         "one held out to measure on")
    return corpus.texts("calibration"), corpus.texts("held_out"), str(text)


def held_out_quality(model, held_out, eval_windows: int, window: int, reference=None):
    """Held-out perplexity (decoder) or (fidelity cosine, reference embeddings) for an encoder."""
    from headcount.surgery.held_out import embed, evaluate, held_out_sets

    sets = held_out_sets(model, held_out, eval_windows, window, sentences=16 * eval_windows)
    if hasattr(model, "lm_head"):
        return next(iter(evaluate(model, sets).values())), None
    name = next(iter(sets))
    if reference is None:
        reference = embed(model, sets[name])
    return evaluate(model, sets, {name: reference})[name], reference


def held_out_report(model, held_out, eval_windows: int, window: int, reference=None):
    """(quality, reference, {domain: perplexity} or None): held_out_quality, and for a decoder measured on the
    default corpus, the three held-out domains (headcount.data.held_out_domains: prose, code and
    standard-library source, which nothing calibrates on), so a user sees the spread, not one number."""
    if held_out is not None or not hasattr(model, "lm_head"):
        quality, reference = held_out_quality(model, held_out, eval_windows, window, reference)
        return quality, reference, None
    from headcount.data import held_out_domains
    from headcount.surgery.held_out import evaluate, held_out_sets

    texts = held_out_domains()
    texts["prose"] = None  # the default corpus's held-out part, exactly as held_out_quality measures it
    by_domain = evaluate(model, held_out_sets(model, texts, eval_windows, window))
    return by_domain["prose"], None, by_domain


def domain_rows(before: dict | None, after: dict | None) -> list[tuple[str, object, object]]:
    """Before/after table rows, one per held-out domain."""
    if not before or not after:
        return []
    return [(f"held-out perplexity: {name}", before[name], after[name]) for name in before]


def before_after_table(rows: list[tuple[str, object, object]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("", "before", "after", "change"):
        table.add_column(col, justify="right" if col else "left")
    for name, before, after in rows:
        if isinstance(before, float) or isinstance(after, float):
            change = f"{(after / before - 1) * 100:+.1f}%" if before and after is not None else ""
            table.add_row(name, f"{before:.3f}", f"{after:.3f}", change)
        else:
            change = f"{(after / before - 1) * 100:+.1f}%" if before else ""
            table.add_row(name, f"{before:,}", f"{after:,}", change)
    Console().print(table)


def command_line() -> str:
    """The command being run, as a user would type it to run it again: `headcount <command>` and the options given
    on the command line (not the defaults), in the command's own order, e.g. `headcount prune --model smollm2
    --fraction 0.2 --json`. What a saved --json result records in `command` (the report quotes it)."""
    import shlex

    ctx, ParameterSource = None, None
    for package in ("typer._click", "click"):  # typer >= 0.2x runs its own copy of click
        try:
            module = __import__(f"{package}.globals", fromlist=["get_current_context"])
            ctx = module.get_current_context(silent=True)
            ParameterSource = __import__(f"{package}.core", fromlist=["ParameterSource"]).ParameterSource
        except (ImportError, AttributeError):
            continue
        if ctx is not None:
            break
    if ctx is None:
        return ""
    words = ["headcount", ctx.info_name or ""]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        value = ctx.params.get(param.name)
        if getattr(param, "is_flag", False):
            if value:
                words.append(flag)
            else:  # a --no-x secondary flag
                words.append(next((o for o in param.secondary_opts if o.startswith("--")), flag))
        else:
            words += [flag, str(value)]
    return shlex.join(words)
