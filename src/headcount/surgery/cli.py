"""The commands of headcount.surgery, registered by the switchboard (headcount.cli): `prune` (pruning/cli.py),
`merge-kv` (merging/cli.py) and `bench surgery` (here: it runs both rooms' benches). Shared helpers live in
cli_common.py, which both command families import. No torch import at module level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.cli_errors import one_line_errors as _one_line_errors
    from headcount.surgery.merging import cli as merging_cli
    from headcount.surgery.pruning import cli as pruning_cli

    pruning_cli.register(app, bench_app)
    merging_cli.register(app, bench_app)

    @bench_app.command("surgery")
    def bench_surgery(
        part: str = typer.Option("all", "--part", help="prune, merge, gates (L0 gates vs retraining-free) or all"),
        quick: bool = typer.Option(False, "--quick", help="fewer points (minutes, not an hour)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
        save_json: Optional[Path] = typer.Option(None, "--save", help="also write the JSON here (rewritten after "
                                                 "every finished section)"),
        orders: Optional[str] = typer.Option(None, "--orders", help="comma-separated orders of the smollm2 "
                                             "pruning curve (default all: reconstruction, random, gradient, "
                                             "ablation, confidence)"),
        curve_only: bool = typer.Option(False, "--curve-only", help="prune part: score --orders and run the "
                                        "smollm2 curve alone (split a long run over processes)"),
        from_json: Optional[Path] = typer.Option(None, "--from", help="print the tables of a JSON that --save "
                                                 "wrote, without measuring again"),
        png: Optional[Path] = typer.Option(None, "--png", help="gates part: write Voita's curve (both models) here"),
    ) -> None:
        """Every measured number of issues 7 and 16: pruning curves (smollm2 prose and code, minilm), costs, merging,
        trained L0 gates vs retraining-free (--part gates, --png)."""
        with _one_line_errors("bench surgery"):
            if part not in ("prune", "merge", "gates", "all"):
                raise ValueError(f"--part: expected prune, merge, gates or all, got {part!r}")
            if png is not None:
                if part not in ("gates", "all"):
                    raise ValueError(f"--png: the plot is the gates part's; use --part gates (or all), not {part!r}")
                from headcount.paths import check_png
                check_png(png)
            from headcount.surgery import bench

            if from_json is not None:
                try:
                    result = json.loads(from_json.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise ValueError(f"--from: expected a JSON file written by --save, got {from_json} ({e})") from None
                if not isinstance(result, dict) or not ({"prune", "merge", "gates"} & set(result)):
                    raise ValueError(f"--from: expected a JSON with 'prune', 'merge' and/or 'gates' sections, got "
                                     f"{from_json}")
                save_json = None
                if png is not None and result.get("gates"):
                    from headcount.surgery.pruning.gates_bench import plot
                    plot(result["gates"], png)
            else:
                order_list = [o.strip() for o in orders.split(",") if o.strip()] if orders else None
                if order_list is not None and not order_list:
                    raise ValueError(f"--orders: expected comma-separated order names, got {orders!r}")
                result = bench.run(part=part, quick=quick, checkpoint=save_json, orders=order_list,
                                   curve_only=curve_only, png=png)
        if save_json is not None:
            save_json.write_text(json.dumps(result, indent=1))
        if json_out:
            typer.echo(json.dumps(result, indent=1))
        else:
            from headcount.surgery import bench
            bench.render(result)
