"""The commands of headcount.surgery, registered by the switchboard (headcount.cli): `prune` (pruning/cli.py),
`merge-kv` (merging/cli.py), `heal` (healing/cli.py) and `bench surgery` (here: it runs both rooms' benches).
Shared helpers live in cli_common.py, which both command families import. No torch import at module level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

PARTS = ("prune", "merge", "gates", "heal", "all")  # bench surgery --part

def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.arguments import one_of
    from headcount.cli_errors import one_line_errors as _one_line_errors
    from headcount.surgery.healing import cli as healing_cli
    from headcount.surgery.merging import cli as merging_cli
    from headcount.surgery.pruning import cli as pruning_cli

    pruning_cli.register(app, bench_app)
    merging_cli.register(app, bench_app)
    healing_cli.register(app, bench_app)
    __import__("headcount.surgery.dropping.cli", fromlist=["register"]).register(app, bench_app)

    @bench_app.command("surgery")
    def bench_surgery(
        part: str = typer.Option("all", "--part", help="prune, merge, gates (L0 gates vs retraining-free), heal (step speed, quality vs healing tokens) or all"),
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
        methods: Optional[str] = typer.Option(None, "--methods", help="gates part: comma-separated runs among "
                                              "retraining-free, l0 (frozen gates), l0 joint (default all); with "
                                              "--save, the other methods' saved points are kept"),
        models: Optional[str] = typer.Option(None, "--models", help="gates part: smollm2, minilm or both (default)"),
    ) -> None:
        """Every measured number of pruning, merging and healing: pruning curves (smollm2 prose and code, minilm),
        costs, merging, trained L0 gates vs retraining-free (--part gates, --png)."""
        with _one_line_errors("bench surgery"):
            one_of("--part", part, PARTS, expected="prune, merge, gates, heal or all")
            if png is not None:
                if part not in ("gates", "heal", "all"):
                    raise ValueError(f"--png: the plot is the gates or heal part's; use --part gates, heal (or all), "
                                     f"not {part!r}")
                from headcount.paths import check_png
                check_png(png)
            from headcount.surgery import bench

            if from_json is not None:
                try:
                    result = json.loads(from_json.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise ValueError(f"--from: expected a JSON file written by --save, got {from_json} ({e})") from None
                if not isinstance(result, dict) or not ({"prune", "merge", "gates", "heal"} & set(result)):
                    raise ValueError(f"--from: expected a JSON with 'prune', 'merge', 'gates' and/or 'heal' sections, "
                                     f"got {from_json}")
                save_json = None
                if png is not None and result.get("gates"):
                    from headcount.surgery.pruning.gates_bench import plot
                    plot(result["gates"], png)
                if png is not None and result.get("heal"):
                    from headcount.surgery.healing.bench import plot
                    plot(result["heal"], png)
            else:
                order_list = [o.strip() for o in orders.split(",") if o.strip()] if orders else None
                if order_list is not None and not order_list:
                    raise ValueError(f"--orders: expected comma-separated order names, got {orders!r}")
                result = bench.run(part=part, quick=quick, checkpoint=save_json, orders=order_list,
                                   curve_only=curve_only, png=png, gates=_gates_overrides(part, methods, models, quick))
        if save_json is not None:
            save_json.write_text(json.dumps(result, indent=1))
        if json_out:
            typer.echo(json.dumps(result, indent=1))
        else:
            from headcount.surgery import bench
            bench.render(result)

    def _gates_overrides(part, methods, models, quick) -> dict | None:  # noqa: ARG001
        """--methods / --models as the gates bench's settings overrides (checked, naming the flag)."""
        from headcount.surgery.pruning.gates_bench import RUNS

        if methods is None and models is None:
            return None
        if part not in ("gates", "all"):
            raise ValueError(f"--{'methods' if methods is not None else 'models'}: the gates part's; use --part gates")
        out = {}
        if methods is not None:
            runs = [m.strip() for m in methods.split(",") if m.strip()]
            if not runs or any(m not in RUNS for m in runs):
                raise ValueError(f"--methods: expected comma-separated names among {', '.join(RUNS)}, got {methods!r}")
            out["methods"] = tuple(runs)
        if models is not None:
            names = [m.strip() for m in models.split(",") if m.strip()]
            if not names or any(m not in ("smollm2", "minilm") for m in names):
                raise ValueError(f"--models: expected smollm2, minilm or both, got {models!r}")
            out |= {f"{m}_fractions": () for m in ("smollm2", "minilm") if m not in names}
        return out
