"""`headcount frontier`: how much can I cut? Every point an edit of the unedited model, placed by what it saves
against what it keeps. Registered by headcount/cli.py; no torch import at module level.

    headcount frontier --model smollm2 [--point prune:0.2] [--point merge:0.75] [--point drop:0.25+merge:0.9]
                       [--point kv:0.75]
                       [--heal-steps K [--heal-calibration teacher-answers]] [--eval humaneval[:N] | PROBLEMS.jsonl]
                       [--out DIR [--force]] [--png F] [--keep 0.9] [--json]

Bad input (an unknown edit, a fraction outside (0, 1), a merge budget the model cannot reach, --eval on an
encoder, an --out holding another frontier without --force): one line on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from headcount.cli_options import (DeviceOpt, DtypeOpt, EvalOpt, EvalWindowsOpt, ForceOpt, HealStepsOpt, JsonOpt,
                                   ModelOpt, OutOpt, PngOpt, SensitivityOpt, TextOpt)
from headcount.surgery.healing.heal_steps import HealCalibrationOpt

POINT_HELP = ("EDIT:AMOUNT, '+' to chain (applied in order): prune:F (query heads removed), merge:B (KV bytes per "
              "token kept: a fraction or 12KiB), drop:F (attention layers removed), kv:B (B met by merges and "
              "drops together); repeatable (default: prune "
              "0.1/0.2/0.3, merge 0.9/0.75/0.5, drop 0.1/0.25/0.5)")
PointOpt = Annotated[Optional[list[str]], typer.Option("--point", help=POINT_HELP)]
KeepOpt = Annotated[float, typer.Option("--keep", help="name the cheapest point (in KV bytes, and in attention "
                                       "FLOPs) that keeps at least this share of the unedited model's pass@1 "
                                       "(held-out perplexity without --eval)")]
CalibrationWindowsOpt = Annotated[int, typer.Option("--calibration-windows", help="calibration windows of 512 "
                                                    "tokens each prune and merge chooses on")]


def check_keep(keep) -> float:
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
        raise ValueError(f"--keep: expected a share of the unedited quality in (0, 1], got {keep!r}")
    return float(keep)


def _keeping_lines(frontier, keep: float) -> list[str]:
    """One line per cost: the cheapest point keeping `keep` of the unedited quality, or that none does."""
    what = "pass@1" if frontier.score == "pass_at_1" else "quality (held-out perplexity)"
    found = frontier.keeping(keep)
    lines = []
    for cost, name in (("kv", "KV bytes"), ("flops", "attention FLOPs")):
        hit = found[cost]
        if hit is None:
            lines.append(f"keeping >= {keep:.0%} of the unedited {what}: no point saves {name}")
            continue
        row = next(r for r in frontier.rows if r.label == hit["label"])
        sure = ""
        if row.paired is not None:
            p = row.paired
            sure = f"; paired against the unedited: +{p['wins']} -{p['losses']}, p = {p['p_value']:.2g}"
        lines.append(f"keeping >= {keep:.0%} of the unedited {what}: {hit['label']} saves {hit['saved']:.0%} of the "
                     f"{name} and keeps {hit['kept']:.0%}{sure}")
    return lines


def _table(frontier) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = frontier.rows
    base = rows[0]
    task = frontier.score == "pass_at_1"
    table = Table(title=f"{frontier.model}: the frontier (* on it: no other point keeps more with fewer KV bytes; "
                        "f: with fewer attention FLOPs)", title_justify="left")
    for col in ("point", "", "KV bytes / token", "saved", f"attn FLOPs / token @ {base.context:,}", "@ 4k", "params"):
        table.add_column(col, justify="left" if col == "point" else "right")
    domains = list(base.perplexity) or list(base.fidelity)
    for d in domains:
        table.add_column(f"ppl {d}" if base.perplexity else f"cosine {d}", justify="right")
    if task:
        for col in ("pass@1", "95% CI", "vs unedited", "p"):
            table.add_column(col, justify="right")
    table.add_column("s", justify="right")
    for r in rows:
        flops = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
        cells = [r.label, ("*" if r.frontier else "") + ("f" if r.frontier_flops else ""), f"{r.kv_bytes_per_token:,}",
                 f"{1 - r.kv_bytes_per_token / base.kv_bytes_per_token:.0%}", flops(r.attention_flops_per_token),
                 flops(r.attention_flops_per_token_4k), f"{r.params:,}"]
        cells += [f"{r.perplexity[d]:.3f}" if r.perplexity else f"{r.fidelity[d]['cosine']:.4f}" for d in domains]
        if task:
            lo, hi = r.pass_at_1_ci95
            p = r.paired
            cells += [f"{r.pass_at_1:.3f}", f"{lo:.3f}-{hi:.3f}",
                      "" if p is None else f"+{p['wins']} -{p['losses']}", "" if p is None else f"{p['p_value']:.2g}"]
        cells.append(f"{r.seconds:.0f}")
        table.add_row(*cells)
    Console().print(table)
    if frontier.reused:
        typer.echo(f"read back from --out: {', '.join(frontier.reused)}", err=True)


def register(app, bench_app) -> None:
    """Add `headcount frontier`."""
    from headcount.cli_errors import one_line_errors

    @app.command("frontier")
    def frontier_cmd(model: ModelOpt = "smollm2", points: PointOpt = None, heal_steps: HealStepsOpt = 0,
                     evals: EvalOpt = None, out: OutOpt = None, force: ForceOpt = False, png: PngOpt = None,
                     json_out: JsonOpt = False, sensitivity: SensitivityOpt = "auto",
                     calibration_windows: CalibrationWindowsOpt = 8, eval_windows: EvalWindowsOpt = 4,
                     text: TextOpt = None, heal_calibration: HealCalibrationOpt = "mixed",
                     keep: KeepOpt = 0.9, dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu") -> None:
        """How much can I cut? Each point an edit of the unedited model: KV bytes, attention FLOPs, parameters,
        held-out perplexity and pass@1 (--eval) per point, the points no other beats marked; --out keeps every
        finished point and a rerun reads it back."""
        with one_line_errors("frontier"):
            from headcount.frontier.spec import parse_points

            parsed = parse_points(points)
            keep = check_keep(keep)
            from headcount.surgery.merging.planner import check_by

            check_by(sensitivity, "--sensitivity")
            from headcount.surgery.healing.cli import check_heal_steps
            from headcount.surgery.healing.heal_steps import check_heal_calibration

            check_heal_steps(heal_steps)
            check_heal_calibration(heal_calibration, heal_steps, text)
            if calibration_windows < 1 or eval_windows < 1:
                raise ValueError("--calibration-windows, --eval-windows: expected positive numbers, got "
                                 f"{calibration_windows} and {eval_windows}")
            from headcount.models.options import parse_device, parse_dtype

            parse_dtype(dtype), parse_device(device)
            from headcount.surgery.cli_common import task_specs

            specs = task_specs(evals)
            if len(specs) > 1:
                raise ValueError(f"--eval: a frontier is judged on one task, got {len(specs)} "
                                 f"({', '.join(s.label for s in specs)})")
            if png is not None:
                from headcount.paths import check_png
                png = check_png(png)
            from headcount.surgery.cli_common import calibration_and_held_out

            calibration, held_out, source = calibration_and_held_out(text)
            if specs:
                from headcount.surgery.healing.calibrations import check_stubs_not_evaluated
                from headcount.surgery.task_scores import check_not_calibrated_on
                check_not_calibrated_on(specs, calibration)
                check_stubs_not_evaluated(specs, heal_calibration, "--heal-calibration")  # what the teacher is asked
            from headcount.frontier.run import run_frontier
            from headcount.tasks.verdict_cache import cache_root

            frontier = run_frontier(model, parsed, heal_steps=heal_steps, spec=specs[0] if specs else None, out=out,
                                    force=force, eval_windows=eval_windows, calibration_windows=calibration_windows,
                                    sensitivity=sensitivity, dtype=dtype, device=device, calibration=calibration,
                                    held_out=held_out, source=source, task_cache=cache_root(),
                                    heal_calibration=heal_calibration)
            if png is not None:
                from headcount.frontier.plot import plot
                plot(frontier, png)
        if json_out:
            typer.echo(json.dumps(frontier.to_json(keep), indent=2))
            return
        _table(frontier)
        for line in _keeping_lines(frontier, keep):
            typer.echo(line)
        if png is not None:
            typer.echo(f"wrote {png}")
