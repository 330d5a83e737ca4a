"""The commands of headcount.surgery, registered by the switchboard (headcount.cli): `prune` (pruning/cli.py),
`merge-kv` (merging/cli.py), `heal` (healing/cli.py), `drop-attention` (dropping/cli.py), each an edit on the
one skeleton (command.py), and `bench surgery` (here: it runs the rooms' benches). Shared helpers live in
cli_common.py. No torch import at module level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cli_options import JsonOpt

PARTS = ("prune", "merge", "gates", "heal", "all")  # bench surgery --part

PartOpt = Annotated[str, typer.Option("--part", help="prune, merge, gates (L0 gates vs retraining-free), heal (step "
                                                      "speed, quality vs healing tokens) or all")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="fewer points (minutes, not an hour)")]
SaveOpt = Annotated[Optional[Path], typer.Option("--save", help="also write the JSON here (rewritten after every "
                                                                "finished section)")]
OrdersOpt = Annotated[Optional[str], typer.Option("--orders", help="comma-separated orders of the smollm2 pruning "
                                                                   "curve (default all: reconstruction, random, "
                                                                   "gradient, ablation, confidence)")]
CurveOnlyOpt = Annotated[bool, typer.Option("--curve-only", help="prune part: score --orders and run the smollm2 "
                                                                 "curve alone (split a long run over processes)")]
FromOpt = Annotated[Optional[Path], typer.Option("--from", help="print the tables of a JSON that --save wrote, "
                                                                "without measuring again")]
BenchPngOpt = Annotated[Optional[Path], typer.Option("--png", help="gates part: write Voita's curve (both models) "
                                                                   "here")]
MethodsOpt = Annotated[Optional[str], typer.Option("--methods", help="gates part: comma-separated runs among "
                                                                     "retraining-free, l0 (frozen gates), l0 joint "
                                                                     "(default all); with --save, the other "
                                                                     "methods' saved points are kept")]
ModelsOpt = Annotated[Optional[str], typer.Option("--models", help="gates part: smollm2, minilm or both (default)")]


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.surgery.healing import cli as healing_cli
    from headcount.surgery.merging import cli as merging_cli
    from headcount.surgery.pruning import cli as pruning_cli

    pruning_cli.register(app, bench_app)
    merging_cli.register(app, bench_app)
    healing_cli.register(app, bench_app)
    __import__("headcount.surgery.dropping.cli", fromlist=["register"]).register(app, bench_app)
    bench_app.command("surgery")(bench_surgery)


def bench_surgery(part: PartOpt = "all", quick: QuickOpt = False, json_out: JsonOpt = False,
                  save_json: SaveOpt = None, orders: OrdersOpt = None, curve_only: CurveOnlyOpt = False,
                  from_json: FromOpt = None, png: BenchPngOpt = None, methods: MethodsOpt = None,
                  models: ModelsOpt = None) -> None:
    """Every measured number of pruning, merging and healing: pruning curves (smollm2 prose and code, minilm),
    costs, merging, trained L0 gates vs retraining-free (--part gates, --png)."""
    from headcount.arguments import one_of
    from headcount.cli_errors import one_line_errors

    with one_line_errors("bench surgery"):
        one_of("--part", part, PARTS, expected="prune, merge, gates, heal or all")
        if png is not None:
            if part not in ("gates", "heal", "all"):
                raise ValueError(f"--png: the plot is the gates or heal part's; use --part gates, heal (or all), "
                                 f"not {part!r}")
            from headcount.paths import check_png
            check_png(png)
        if from_json is not None:
            result, save_json = saved_bench(from_json, png), None
        else:
            from headcount.surgery import bench

            order_list = [o.strip() for o in orders.split(",") if o.strip()] if orders else None
            if order_list is not None and not order_list:
                raise ValueError(f"--orders: expected comma-separated order names, got {orders!r}")
            result = bench.run(part=part, quick=quick, checkpoint=save_json, orders=order_list,
                               curve_only=curve_only, png=png, gates=gates_overrides(part, methods, models))
    if save_json is not None:
        save_json.write_text(json.dumps(result, indent=1))
    if json_out:
        typer.echo(json.dumps(result, indent=1))
    else:
        from headcount.surgery import bench
        bench.render(result)


def saved_bench(from_json: Path, png: Optional[Path]) -> dict:
    """--from: a JSON that --save wrote, checked (naming the flag); its plots drawn again with --png."""
    try:
        result = json.loads(from_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--from: expected a JSON file written by --save, got {from_json} ({e})") from None
    if not isinstance(result, dict) or not ({"prune", "merge", "gates", "heal"} & set(result)):
        raise ValueError(f"--from: expected a JSON with 'prune', 'merge', 'gates' and/or 'heal' sections, "
                         f"got {from_json}")
    if png is not None and result.get("gates"):
        from headcount.surgery.pruning.gates_bench import plot
        plot(result["gates"], png)
    if png is not None and result.get("heal"):
        from headcount.surgery.healing.bench import plot
        plot(result["heal"], png)
    return result


def gates_overrides(part, methods, models) -> dict | None:
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
