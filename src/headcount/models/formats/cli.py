"""`headcount export`: write a (pruned, merged or untouched) model in another format — a transformers
checkpoint directory, or a llama.cpp GGUF file. Registered by models/cli.py; no torch at module level."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from headcount.paths import check_out_dir

EXPORT_TARGETS = ("transformers", "gguf", "gguf-f16")


def register(app) -> None:
    """Add `headcount export`."""
    from headcount.cli_errors import one_line_errors as _one_line_errors

    @app.command("export")
    def export_cmd(
        model: str = typer.Option(..., "--model", "-m", help="a saved directory (or zoo name)"),
        to: str = typer.Option("transformers", "--to", help="target format: transformers (a checkpoint directory), "
                               "gguf or gguf-f16 (a llama.cpp `deci` file, per-layer head counts)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory (transformers) or FILE.gguf to write"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
    ) -> None:
        """Write a checkpoint that transformers loads with no headcount code (LlamaForCausalLM / BertModel), or a
        llama.cpp GGUF file (architecture deci) that keeps each layer's head counts."""
        with _one_line_errors("export"):
            if to not in EXPORT_TARGETS:
                raise ValueError(f"--to: expected one of {', '.join(EXPORT_TARGETS)}, got {to!r}")
            if to == "transformers":
                out = check_out_dir(out, force)
            else:
                from headcount.models.formats.gguf_deci import check_gguf_path
                out = check_gguf_path(out, force, "--out")
            from headcount.models import load

            if to == "transformers":
                from headcount.models.formats.hf import export_transformers

                export_transformers(load(model), out, force=force)
            else:
                from headcount.models.formats.gguf_deci import export_gguf

                export_gguf(load(model), out, dtype="f16" if to == "gguf-f16" else "f32", force=force)
        if to == "transformers":
            typer.echo(f"wrote {out} (transformers from_pretrained)")
        else:
            typer.echo(f"wrote {out} (llama.cpp deci GGUF; headcount.models.load reads it back)")
