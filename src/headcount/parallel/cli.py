"""Commands of headcount.parallel (registered by headcount.cli; no torch import at module level).

    headcount bench parallel       one process with 2 threads vs 2 ranks with 1 thread each (bench.py)
    tp_setup                       `headcount generate --tp`: handed to models.cli.register by headcount/cli.py

`rank_errors(command)` (headcount/cli_errors.py) is what every multi-rank command wraps itself in.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from headcount.arguments import positive_int
from headcount.cli_options import JsonOpt
from headcount.cli_errors import rank_errors  # noqa: F401 (moved low: surgery and analysis commands use it too)


PromptTokensOpt = Annotated[int, typer.Option("--prompt-tokens", help="prompt length (prefill)")]
NewTokensOpt = Annotated[int, typer.Option("--new-tokens", help="decode steps timed")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="runs of each side (medians)")]


def tp_setup(model, *, seed, sample: bool, log):
    """`headcount generate --tp`: shard `model` over the torchrun ranks; (is rank 0, the shared seed). The
    switchboard (headcount/cli.py) hands it to models.cli.register, since models may not import this room."""
    from headcount.parallel.model import shared_seed, tensor_parallel_from_env

    main = tensor_parallel_from_env(model, log=log)
    return main, (shared_seed(seed) if sample else seed)


def bench_parallel(prompt_tokens: PromptTokensOpt = 256, new_tokens: NewTokensOpt = 32, repeats: RepeatsOpt = 3,
                   json_out: JsonOpt = False) -> None:
    """SmolLM2 fp32: one process with 2 threads vs 2 ranks (gloo) with 1 thread each, side by side:
    prefill and decode time, bytes all-reduced per token against the formula, and what the formula
    predicts for Llama 3 70B on 8 GPUs over NVLink."""
    with rank_errors("bench parallel"):
        from headcount.parallel import bench

        for name, value, low in (("--prompt-tokens", prompt_tokens, 2), ("--new-tokens", new_tokens, 2),
                                 ("--repeats", repeats, 1)):
            positive_int(name, value, low, expected=f"at least {low}")
        result = bench.run(prompt_tokens, new_tokens, repeats,
                           log=lambda m: typer.echo(f"headcount: {m}", err=True))
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    else:
        bench.render(result)


def register(app, bench_app) -> None:
    """Add `headcount bench parallel` (`generate --tp` is `tp_setup`, passed to models' register)."""
    bench_app.command("parallel")(bench_parallel)
