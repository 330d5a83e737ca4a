"""`headcount experiment NAME`. Registered by headcount.cli; no torch import at module level.

Bad input (an unknown experiment, head counts that do not divide d_model, --steps 0, an unwritable
--png path) prints one line to stderr and exits with status 2, no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from headcount.arguments import positive_int

NAMES = ("multi-relation", "heads-sweep", "low-rank", "write-address")


def _parse_heads(text: str) -> tuple[int, ...]:
    try:
        heads = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--heads: expected comma-separated whole numbers such as 1,2,4,8, got {text!r}") from None
    if not heads:
        raise ValueError(f"--heads: expected at least one head count, got {text!r}")
    return heads


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.cli_errors import one_line_errors as _one_line_errors

    @app.command("experiment")
    def experiment_cmd(
        name: str = typer.Argument(..., help=f"one of: {', '.join(NAMES)}"),
        quick: bool = typer.Option(False, "--quick", help="the small version (under a minute) the tests run"),
        json_out: bool = typer.Option(False, "--json", help="print one JSON object with a `results` list"),
        png: Optional[Path] = typer.Option(None, "--png", help="write a plot to this PNG file"),
        seed: int = typer.Option(0, "--seed", help="first random seed"),
        steps: Optional[int] = typer.Option(None, "--steps", help="training steps per model (default: the "
                                            "experiment's)"),
        seeds: Optional[int] = typer.Option(None, "--seeds", help="seeds per setting (seed, seed+1, ...)"),
        heads: Optional[str] = typer.Option(None, "--heads", help="head counts, comma-separated (each must "
                                            "divide d_model); one number for low-rank / write-address"),
        d_model: Optional[int] = typer.Option(None, "--d-model", help="model width (default: the experiment's)"),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default: 1 for the tiny "
                                              "experiments; for the language models 2, fewer when the CPUs are busy)"),
        no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars on stderr"),
    ) -> None:
        """Run one of the chapter's experiments: small models trained from scratch on this CPU."""
        with _one_line_errors("experiment"):
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
