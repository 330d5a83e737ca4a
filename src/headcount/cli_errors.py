"""What every command does with bad input: one line on stderr naming the command, exit status 2, no
traceback. Sits low so every room's CLI (models, formats, surgery, parallel, ...) can use it."""

from __future__ import annotations

import contextlib
from typing import Iterator

import typer

EXIT_BAD_INPUT = 2


@contextlib.contextmanager
def one_line_errors(command: str) -> Iterator[None]:
    try:
        yield
    except (ValueError, ImportError, OSError) as err:
        msg = " ".join(str(err).split()) or type(err).__name__
        typer.echo(f"headcount {command}: {msg}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(130) from None
