"""`headcount bench serve`: registered on the bench group; no torch at import."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from headcount.arguments import positive_int
from headcount.engines.rows import ENGINES


def register(app, bench_app) -> None:
    from headcount.cli_errors import one_line_errors

    @bench_app.command("serve")
    def serve_cmd(
        model: str = typer.Option(..., "--model", "-m", help="the unedited model: a zoo name or a directory"),
        edited: Optional[list[str]] = typer.Option(None, "--edited", help="an edit of --model (a `prune` / `merge-kv` "
                                                   "--out directory); repeat for several"),
        engines: str = typer.Option(",".join(ENGINES), "--engines", help=f"comma-separated: {', '.join(ENGINES)}"),
        context: str = typer.Option("512,4096,16384", "--context", help="prompt lengths (tokens; 4k = 4096)"),
        batch: str = typer.Option("1,8", "--batch", help="sequences served at once"),
        new_tokens: int = typer.Option(33, "--new-tokens", help="new tokens per sequence: the first ends the prefill, "
                                       "the rest time the decode"),
        repeats: int = typer.Option(1, "--repeats", help="runs of each row; the fastest prefill and decode are kept"),
        workdir: Path = typer.Option(Path("out/serve"), "--workdir", help="where the GGUF / vLLM exports are kept "
                                     "(reused: their names carry the weights' hash)"),
        png: Optional[Path] = typer.Option(None, "--png", help="write the measured and predicted ratios as a PNG"),
        as_json: bool = typer.Option(False, "--json", help='print {"rows": [...]} (and skipped / capacity / notes)'),
    ) -> None:
        """What an edit buys where a model is served: KV bytes, peak memory, prefill and decode tokens/s in headcount,
        llama.cpp and vLLM, the unedited model beside each edit, with the ratios the accounts predict."""
        import json
        import sys

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
