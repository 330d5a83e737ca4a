"""`headcount experiment NAME`. Registered by headcount.cli; no torch import at module level.

Bad input (an unknown experiment, head counts that do not divide d_model, --steps 0, an unwritable
--png path) prints one line to stderr and exits with status 2, no traceback.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from headcount.arguments import positive_int
from headcount.cli_options import JsonOpt, PngOpt, SeedOpt

NAMES = ("multi-relation", "heads-sweep", "low-rank", "write-address")

NameArg = Annotated[str, typer.Argument(help=f"one of: {', '.join(NAMES)}")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="the small version (under a minute) the tests run")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", help="training steps per model (default: the "
                                                                 "experiment's)")]
SeedsOpt = Annotated[Optional[int], typer.Option("--seeds", help="seeds per setting (seed, seed+1, ...)")]
HeadsOpt = Annotated[Optional[str], typer.Option("--heads", help="head counts, comma-separated (each must divide "
                                                                 "d_model); one number for low-rank / write-address")]
DModelOpt = Annotated[Optional[int], typer.Option("--d-model", help="model width (default: the experiment's)")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="torch threads (default: 1 for the tiny "
                                                                     "experiments; for the language models 2, fewer "
                                                                     "when the CPUs are busy)")]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="no progress bars on stderr")]


def _parse_heads(text: str) -> tuple[int, ...]:
    try:
        heads = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--heads: expected comma-separated whole numbers such as 1,2,4,8, got {text!r}") from None
    if not heads:
        raise ValueError(f"--heads: expected at least one head count, got {text!r}")
    return heads


def experiment_cmd(name: NameArg, quick: QuickOpt = False, json_out: JsonOpt = False, png: PngOpt = None,
                   seed: SeedOpt = 0, steps: StepsOpt = None, seeds: SeedsOpt = None, heads: HeadsOpt = None,
                   d_model: DModelOpt = None, threads: ThreadsOpt = None, no_progress: NoProgressOpt = False) -> None:
    """Run one of the chapter's experiments: small models trained from scratch on this CPU. --seed is the first
    seed; --json prints one JSON object with a `results` list."""
    from headcount.cli_errors import one_line_errors

    with one_line_errors("experiment"):
        from headcount.experiments.registry import format_text, get_experiment, run_experiment, save_plot

        get_experiment(name)
        positive_int("--steps", steps, none=True, expected="a positive number of training steps")
        positive_int("--seeds", seeds, none=True, expected="a positive number of seeds")
        positive_int("--seed", seed, 0, expected="a whole number >= 0")
        if png is not None:
            from headcount.paths import check_png
            check_png(png)
        options: dict = {}
        if d_model is not None:
            options["d_model"] = positive_int("--d-model", d_model, expected="a positive width")
        if heads is not None:
            counts = _parse_heads(heads)
            if name in ("multi-relation", "heads-sweep"):
                options["heads"] = counts
            elif len(counts) != 1:
                raise ValueError(f"--heads: {name} takes one head count, got {heads!r}")
            else:
                options["n_heads"] = counts[0]
        result = run_experiment(name, quick=quick, seed=seed, steps=steps, seeds=seeds,
                                progress=not no_progress, threads=threads, **options)
        if png is not None:
            save_plot(result, png)
            typer.echo(f"headcount experiment: wrote {png}", err=True)
    if json_out:
        typer.echo(json.dumps(result.to_json()))
    else:
        typer.echo(format_text(result))
        typer.echo(f"({result.seconds:.0f} s, {result.config['torch_threads']} torch thread(s))")


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    app.command("experiment")(experiment_cmd)
