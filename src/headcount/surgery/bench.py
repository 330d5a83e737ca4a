"""`headcount bench surgery`: every measured number of the surgery issues, each part measured by the bench
that sits beside its code (pruning/bench.py, pruning/gates_bench.py, merging/bench.py, healing/bench.py).

    run(part="all" | "prune" | "merge" | "gates" | "heal", quick=False) -> dict (JSON-ready)
    render(result)                                     rich tables on stdout
"""

from __future__ import annotations

import sys

from headcount.surgery.healing import bench as heal_bench
from headcount.surgery.merging import bench as merge_bench
from headcount.surgery.pruning import bench as prune_bench
from headcount.surgery.pruning import gates_bench

PARTS = ("prune", "merge", "gates", "heal", "all")


def _log(msg: str) -> None:
    print(f"headcount bench surgery: {msg}", file=sys.stderr, flush=True)


def run(part: str = "all", quick: bool = False, log=_log, checkpoint=None, orders=None,
        curve_only: bool = False, png=None, gates: dict | None = None) -> dict:
    """checkpoint: a JSON file rewritten after every finished section (a long run keeps what it measured).
    png: the gates part's plot (Voita's curve, both models); gates: overrides of the gates part's settings."""
    if part not in PARTS:
        raise ValueError(f"part: expected one of {', '.join(PARTS)}, got {part!r}")
    out: dict = {}
    if part in ("prune", "all"):
        out["prune"] = prune_bench.run_prune(quick, log, checkpoint, orders=orders, curve_only=curve_only)
    if part in ("merge", "all"):
        out["merge"] = merge_bench.run(quick=quick)
    if part in ("gates", "all"):
        out["gates"] = gates_bench.run_gates(quick, log, checkpoint, png=png, overrides=gates)
    if part in ("heal", "all"):
        heal_png = png if png is None or part == "heal" else png.with_name(f"{png.stem}_heal{png.suffix}")
        out["heal"] = heal_bench.run_heal(quick, log, png=heal_png)
    return out


def render(result: dict, console=None) -> None:
    if result.get("prune"):
        prune_bench.render(result["prune"], console)
    if result.get("merge"):
        merge_bench.render(result["merge"], console)
    if result.get("gates"):
        gates_bench.render(result["gates"], console)
    if result.get("heal"):
        heal_bench.render(result["heal"], console)
