"""What the surgery commands share (prune, merge-kv, prune --method l0, heal): the --out check, --text split
into calibration and held-out, the quality meter (surgery/quality.py) and the before/after table. Imported by each command
family's cli.py; imports none of them (no cycle). No torch at module level."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from headcount.paths import check_out_dir  # noqa: F401 (the commands import it from here)


from headcount.cli_options import EVAL_HELP  # noqa: E402,F401 (declared once, with the shared options)


def task_specs(values):
    """surgery.task_scores.TaskSpec list for --eval's values (empty: measures nothing), checked and read before any
    work."""
    from headcount.surgery.task_scores import parse_eval

    return parse_eval(values)


def quality_meter(held_out, eval_windows: int, specs=(), extra: dict | None = None):
    """The commands' one measure (surgery.quality.QualityMeter): held-out windows of 512 tokens, the three
    domains on the default corpus, --eval's tasks logged as they finish and kept under $HEADCOUNT_CACHE/tasks
    (a model judged before is read back: tasks/verdict_cache.py)."""
    import typer

    from headcount.surgery.quality import QualityMeter
    from headcount.tasks.verdict_cache import cache_root
    from headcount.tasks.progress import scoring_bar

    return QualityMeter(held_out, eval_windows=eval_windows, window=512, extra=extra, tasks=specs,
                        log=lambda m: typer.echo(f"headcount: {m}", err=True), progress=scoring_bar,
                        task_cache=cache_root() if specs else None)


def task_rows(tasks: dict) -> list[tuple[str, float, float]]:
    """(name, before, after) rows for a before/after table from {label: {stage: pass@1}}: the latest stage against
    before_edit."""
    out = []
    for label, stages in tasks.items():
        if "before_edit" in stages and len(stages) > 1:
            last = "after_heal" if "after_heal" in stages else "after_edit"
            out.append((f"pass@1: {label} ({last.replace('_', ' ')})", stages["before_edit"], stages[last]))
    return out


def check_eval_model(evals, model) -> None:
    """--eval needs a decoder with a tokenizer: said before the edit starts, under --eval (the check names the
    model it was given, --model in `headcount eval`)."""
    if evals:
        from headcount.cli_errors import renamed
        from headcount.tasks.harness import check_model

        with renamed({"--model": "--eval"}):
            check_model(model)


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


def held_out_report(model, held_out, eval_windows: int, window: int, reference=None):
    """(quality, reference, {domain: perplexity} or None) through surgery.quality.QualityMeter: a decoder's
    headline perplexity (prose on the default corpus) and, on the default corpus, the three held-out domains
    (headcount.data.held_out_domains: prose, code and standard-library source, which nothing calibrates on);
    an encoder's (cosine, spearman) against `reference` (its unedited embeddings; None: this model's own)."""
    from headcount.surgery.quality import QualityMeter

    meter = QualityMeter(held_out, eval_windows=eval_windows, window=window,
                         references=None if reference is None else {"prose" if held_out is None else "text": reference})
    quality = meter.measure(model)
    if quality.perplexity:
        return quality.headline, None, (dict(quality.perplexity) if len(quality.perplexity) > 1 else None)
    return quality.headline, next(iter(meter.references(model).values())), None


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


def parse_layers(text: Optional[str]) -> Optional[list[int]]:
    """'0,5,7' -> [0, 5, 7]; None -> None (every layer): the --layers of merge-kv and drop-attention."""
    if text is None:
        return None
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--layers: expected comma-separated layer indices such as 0,5,7, got {text!r}") from None
    if not layers:
        raise ValueError(f"--layers: expected at least one layer index, got {text!r}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"--layers: duplicate layer indices in {text!r}")
    if any(i < 0 for i in layers):
        raise ValueError(f"--layers: expected indices >= 0, got {text!r}")
    return layers
