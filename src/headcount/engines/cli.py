"""`headcount bench serve`: registered on the bench group; no torch at import. The command is a module-level
function over the shared options (headcount.cli_options) and its own; register() only adds it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.arguments import positive_int
from headcount.cli_options import JsonOpt, ModelOpt, PngOpt
from headcount.engines.rows import ENGINES

EditedOpt = Annotated[Optional[list[str]], typer.Option("--edited", help="an edit of --model (a `prune` / `merge-kv` "
                                                                         "--out directory); repeat for several")]
EnginesOpt = Annotated[str, typer.Option("--engines", help=f"comma-separated: {', '.join(ENGINES)}")]
ContextOpt = Annotated[str, typer.Option("--context", help="prompt lengths (tokens; 4k = 4096)")]
BatchOpt = Annotated[str, typer.Option("--batch", help="sequences served at once")]
NewTokensOpt = Annotated[int, typer.Option("--new-tokens", help="new tokens per sequence: the first ends the prefill, "
                                                                "the rest time the decode")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="runs of each row; the fastest prefill and decode are "
                                                           "kept")]
WorkdirOpt = Annotated[Path, typer.Option("--workdir", help="where the GGUF / vLLM exports are kept (reused: their "
                                                            "names carry the weights' hash)")]


def serve_cmd(model: ModelOpt, edited: EditedOpt = None, engines: EnginesOpt = ",".join(ENGINES),
              context: ContextOpt = "512,4096,16384", batch: BatchOpt = "1,8", new_tokens: NewTokensOpt = 33,
              repeats: RepeatsOpt = 1, workdir: WorkdirOpt = Path("out/serve"), png: PngOpt = None,
              as_json: JsonOpt = False) -> None:
    """What an edit buys where a model is served: KV bytes, peak memory, prefill and decode tokens/s in headcount,
    llama.cpp and vLLM, the unedited model beside each edit, with the ratios the accounts predict. --model is the
    unedited model; --json prints {"rows": [...]} (and skipped / capacity / notes)."""
    import json
    import sys

    from headcount.cli_errors import one_line_errors

    with one_line_errors("bench serve"):
        from headcount.engines.serve import check_engines, check_ints, run_serve
        from headcount.paths import check_png

        names = check_engines(engines)
        contexts, batches = check_ints("--context", context), check_ints("--batch", batch)
        positive_int("--repeats", repeats, expected="a positive whole number")
        positive_int("--new-tokens", new_tokens, 2, expected="at least 2 (one for the prefill, one to time)")
        png_path = check_png(png) if png is not None else None
        result = run_serve(model, list(edited or []), names, contexts, batches, new_tokens=new_tokens,
                           workdir=workdir, repeats=repeats, log=lambda m: typer.echo(m, err=True),
                           progress=sys.stderr.isatty())
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=1))
    else:
        from rich.console import Console

        from headcount.engines.table import render

        render(result, Console(width=None if sys.stdout.isatty() else 220))
    if png_path is not None:
        from headcount.engines.plots import plot

        plot(result, png_path)
        typer.echo(f"wrote {png_path}", err=True)


def task_decode(model: str, task: str, *, limit, batch, engines, max_new_tokens, log):
    """`bench decode --task`'s run (models.cli calls it through the switchboard): (result, its render)."""
    from headcount.engines.task_decode import check_task_engines, render, run_task_decode

    result = run_task_decode(model, task, limit=limit, batch=batch, engines=check_task_engines(engines),
                             max_new_tokens=max_new_tokens, log=log)
    return result, render


def register(app, bench_app) -> None:
    bench_app.command("serve")(serve_cmd)
