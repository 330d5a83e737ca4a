"""What every command does with bad input: one line on stderr naming the command, exit status 2, no
traceback. Sits low so every room's CLI (models, formats, surgery, parallel, ...) can use it.

A library error that knows its argument (arguments.ArgumentError) is shown under the command's flag: `flags`
maps the library's argument names to flags ({"fraction": "--fraction", "model": "--eval"}); `renamed` is the
one place that does it, by the error's name, never by reading its message."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import typer

from headcount.arguments import ArgumentError

EXIT_BAD_INPUT = 2


@contextlib.contextmanager
def renamed(flags: dict | None) -> Iterator[None]:
    """An ArgumentError raised inside, re-raised under flags[its name] when the name is there."""
    try:
        yield
    except ArgumentError as err:
        if flags and err.name in flags:
            raise err.renamed(flags[err.name]) from None
        raise


@contextlib.contextmanager
def one_line_errors(command: str, flags: dict | None = None) -> Iterator[None]:
    try:
        with renamed(flags):
            yield
    except (ValueError, ImportError, OSError) as err:
        msg = " ".join(str(err).split()) or type(err).__name__
        typer.echo(f"headcount {command}: {msg}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(130) from None


# Under torchrun: bad input exits 2 with one line prefixed by the rank, and a collective that failed or
# timed out because another rank is gone is reported the same way instead of as a traceback.
def _rank_label(command: str) -> str:
    world = os.environ.get("WORLD_SIZE", "1")
    return f"{command} (rank {os.environ.get('RANK', '?')})" if world not in ("", "1") else command


@contextlib.contextmanager
def rank_errors(command: str, flags: dict | None = None) -> Iterator[None]:
    with one_line_errors(_rank_label(command), flags):
        try:
            yield
        except RuntimeError as err:
            import torch.distributed as dist

            text = " ".join(str(err).split())
            if isinstance(err, ValueError):  # NotInitializedError, WeightMismatchError: already clear
                raise
            if isinstance(err, getattr(dist, "DistError", ())) or any(
                    w in text.lower() for w in ("gloo", "nccl", "timed out", "timeout", "connection", "peer")):
                raise ValueError(f"a collective failed: another rank most likely failed or did not answer within "
                                 f"the timeout ({text[:300]})") from None
            raise
