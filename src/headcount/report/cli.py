"""`headcount report` (registered by headcount.cli; no torch import at module level).

    headcount report --model smollm2 [--dtype fp32|bf16|fp16] [--device cpu|cuda|auto] [--text FILE] [--out DIR]
                     [--force] [--seed N] [--quick] [--no-cache]

Writes DIR/index.html and DIR/report.json (default out/report-<model>), then prints the path of the
page and a five-line summary. Bad input: one line on stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cli_options import DeviceOpt, DtypeOpt, ForceOpt, ModelOpt, SeedOpt, TextOpt

# the report's own options (demo shares PageOutOpt and QuickOpt): its --out is a folder for a page, not a model
PageOutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="output folder (default "
                                                                        "out/report-<model>)")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="smaller analyses: a first look in a fraction of the time")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="recompute everything (ignore $HEADCOUNT_CACHE)")]
SampleOpt = Annotated[Optional[str], typer.Option("--sample", help="the sentence shown head by head")]


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


def report_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
               text: TextOpt = None, out: PageOutOpt = None, force: ForceOpt = False, seed: SeedOpt = 0,
               quick: QuickOpt = False, no_cache: NoCacheOpt = False, sample: SampleOpt = None) -> None:
    """The head report: roles, importance, pruning, K/V merge, attention, faithfulness, rank -> index.html.
    The same --seed gives the same report.json."""
    run_report(model, text=text, out=out, force=force, seed=seed, quick=quick, use_cache=not no_cache,
               sample=sample, dtype=dtype, device=device)


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app."""
    app.command("report")(report_cmd)
