"""`headcount report` (registered by headcount.cli; no torch import at module level).

    headcount report --model smollm2 [--dtype fp32|bf16|fp16] [--device cpu|cuda|auto] [--text FILE] [--out DIR]
                     [--force] [--seed N] [--quick] [--no-cache]

Writes DIR/index.html and DIR/report.json (default out/report-<model>), then prints the path of the
page and a five-line summary. Bad input: one line on stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer


def run_report(model: str, *, text: Optional[Path] = None, out: Optional[Path] = None, force: bool = False,
               seed: int = 0, quick: bool = False, use_cache: bool = True, sample: Optional[str] = None,
               command: str = "report", dtype: str = "fp32", device: str = "cpu") -> None:
    """Build the report and print where it is and what it found (shared by `report` and `demo`)."""
    from headcount.cli_errors import one_line_errors as _one_line_errors

    start = time.perf_counter()
    with _one_line_errors(command):
        try:
            from headcount.report.build import build_report, check_out, default_out

            if seed < 0:
                raise ValueError(f"--seed: expected a number >= 0, got {seed}")
            from headcount.models.options import parse_device, parse_dtype

            parse_dtype(dtype), parse_device(device)  # bad --dtype / --device: one line before any work
            target = check_out(default_out(model) if out is None else out, force)  # refuse before loading
            texts = None
            if text is not None:
                from headcount.data import read_text
                texts = [read_text(text)]
            import torch

            from headcount.experiments.train import cpu_threads

            # as many torch threads as there are idle CPUs: on a shared machine a thread with no idle core
            # spin-waits (measured: the same demo 80 s with 2 threads at load 2, 270 s when the load rose to 4)
            with cpu_threads(torch.get_num_threads()) as threads:
                if dtype != "fp32" or device != "cpu":  # the weights' hash (the cache key) carries the dtype
                    from headcount.models.options import load_model
                    model = load_model(model, dtype, device)
                report = build_report(model, texts, target, force=force, seed=seed, quick=quick, sample=sample,
                                      use_cache=use_cache)
        except TypeError as err:  # a wrong kind of argument reaching the library: still one line
            raise ValueError(str(err)) from None
    typer.echo(f"report: {report.index.resolve()}")
    for line in report.summary():
        typer.echo(f"  {line}")
    from headcount.report.meter import ReportMeter

    timings = dict(report.timings)
    measured = timings.pop(ReportMeter.TIMING, None)  # part of the pruning, merge and gates steps' seconds
    steps = ", ".join(f"{k} {v:.0f} s" + (" (cached)" if k in report.cached else "") for k, v in timings.items())
    if measured is not None:
        steps += f" ({measured:.1f} s of it measuring held-out quality)"
    typer.echo(f"  took {time.perf_counter() - start:.0f} s with {threads} torch thread{'s' if threads > 1 else ''}: "
               f"{steps}", err=True)


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app."""
    from headcount.models.options import DEVICE_HELP, DTYPE_HELP

    @app.command("report")
    def report(
        model: str = typer.Option("smollm2", "--model", "-m", help="zoo name (smollm2, minilm) or a checkpoint path"),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        text: Optional[Path] = typer.Option(None, "--text", help="UTF-8 text file (default: the built-in corpus)"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default out/report-<model>)"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
        seed: int = typer.Option(0, "--seed", help="seed for the random parts (same seed, same report.json)"),
        quick: bool = typer.Option(False, "--quick", help="smaller analyses: a first look in a fraction of the time"),
        no_cache: bool = typer.Option(False, "--no-cache", help="recompute everything (ignore $HEADCOUNT_CACHE)"),
        sample: Optional[str] = typer.Option(None, "--sample", help="the sentence shown head by head"),
    ) -> None:
        """The head report: roles, importance, pruning, K/V merge, attention, faithfulness, rank -> index.html."""
        run_report(model, text=text, out=out, force=force, seed=seed, quick=quick, use_cache=not no_cache,
                   sample=sample, dtype=dtype, device=device)
