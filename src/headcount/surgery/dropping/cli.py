"""`headcount drop-attention`, on the edit commands' skeleton (surgery/command.py): what this module adds is the
command's options, their checks and the edit (drop_attention). Registered through headcount.surgery.cli; no torch
import at module level.

    headcount drop-attention --model M --fraction 0.25 [--by similarity|loss] [--out DIR] [--json]
    headcount drop-attention --model M --layers 13,18 [--eval humaneval] [--heal-steps K]

--json is the edit commands' one schema (kv_bytes_per_token_before / _after among its top-level keys), the
DropResult under "edit", and `dropped` (the layers whose attention went) beside them.
Bad input (--fraction outside (0, 1), --layers naming a layer the model lacks, both or neither of them, an --by
that is not similarity or loss): one line, exit 2, nothing written.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from headcount.cli_options import (CalibrationWindowsOpt, DeviceOpt, DtypeOpt, EvalOpt, EvalWindowsOpt, ForceOpt,
                                   HealStepsOpt, JsonOpt, ModelOpt, OutOpt, TextOpt)
from headcount.surgery.cli_common import parse_layers
from headcount.surgery.command import Edit, EditOptions, account_rows, heal_table, quality_rows, register_edit
from headcount.surgery.healing.heal_steps import HealCalibrationOpt

BY = ("similarity", "loss")  # choose.BY, repeated so that --help imports no torch (a test checks they agree)
N_WINDOWS = 8  # choose.N_WINDOWS (the same check)

DropFractionOpt = Annotated[Optional[float], typer.Option(
    "--fraction", help="share of the layers whose attention sublayer goes, in (0, 1): round(F x layers), at least one, "
                       "the cheapest by --by")]
DropLayersOpt = Annotated[Optional[str], typer.Option(
    "--layers", help="comma-separated layers whose attention goes (instead of --fraction)")]
ByOpt = Annotated[str, typer.Option(
    "--by", help="the order of --fraction: similarity (cos of each attention's input and output, He et al. 2024; "
                 "one forward pass) or loss (the calibration loss of dropping each layer alone)")]
@register_edit
class DropAttention(Edit):
    name = "drop-attention"
    example = ("--layers", "1")
    out_required = False
    what = "the model's held-out quality with attention sublayers dropped"
    legacy_keys = ("dropped",)
    flags = {"layers": "--layers", "fraction": "--fraction", "by": "--by"}

    def __init__(self, fraction: Optional[float], layers: Optional[str], by: str, calibration_windows: int):
        self.fraction, self.layers_text, self.by = fraction, layers, by
        self.calibration_windows = calibration_windows
        self.layers: Optional[list[int]] = None

    def check(self, opts: EditOptions) -> None:
        if (self.fraction is None) == (self.layers_text is None):
            raise ValueError("--fraction, --layers: expected exactly one of them (a share of the layers, or which "
                             f"layers), got {'both' if self.fraction is not None else 'neither'}")
        if self.fraction is not None and not 0.0 < self.fraction < 1.0:
            raise ValueError(f"--fraction: expected a share of the layers in (0, 1), got {self.fraction}")
        if self.layers_text is not None:
            self.layers = parse_layers(self.layers_text)
        if self.by not in BY:
            raise ValueError(f"--by: expected one of {', '.join(BY)}, got {self.by!r}")
        if self.calibration_windows < 1:
            raise ValueError(f"--calibration-windows: expected a positive number, got {self.calibration_windows}")

    def check_model(self, model, run) -> None:
        from headcount.surgery.dropping.drop import check_layers, layer_count

        if not hasattr(model, "lm_head") or not hasattr(model.layers[0], "drop_attention"):
            raise ValueError(f"--model: drop-attention edits decoders; {run.opts.model} is "
                             f"{type(model).__name__}")
        n = len(model.layers)
        if self.layers is not None:
            check_layers(model, self.layers)  # an ArgumentError named "layers": shown under --layers (flags)
            return
        live = n - len(model.dropped_layers)
        if layer_count(n, self.fraction) >= live:
            raise ValueError(f"--fraction: {self.fraction} of {n} layers is {layer_count(n, self.fraction)}, and "
                             f"{live} still have attention; keep at least one")

    def apply(self, model, run):
        from headcount.surgery.dropping.drop import drop_attention

        return drop_attention(model, fraction=self.fraction, layers=self.layers, by=self.by,
                              calibration=run.calibration, n_windows=self.calibration_windows, progress=run.main)

    def legacy(self, report, run) -> dict:
        return {"dropped": (report.edit or {}).get("dropped")}

    def table(self, data: dict, run) -> None:
        from headcount.surgery.cli_common import before_after_table, task_rows

        edit = data.get("edit") or {}
        how = f"by {edit['by']}" if edit.get("by") else "as named"
        before_after_table(account_rows(data) + quality_rows(data, run.source),
                           f"{run.opts.model}: attention dropped in layers {edit.get('dropped')} ({how})")
        if data.get("tasks"):
            before_after_table(task_rows(data["tasks"]), f"{run.opts.model}: task scores")
        heal_table(data, f"{run.opts.model}: healed after dropping attention")


def register(app, bench_app) -> None:
    """Add `headcount drop-attention`."""

    @app.command("drop-attention")
    def drop_attention_cmd(
        model: ModelOpt = "smollm2",
        fraction: DropFractionOpt = None,
        layers: DropLayersOpt = None,
        by: ByOpt = "similarity",
        out: OutOpt = None,
        force: ForceOpt = False,
        json_out: JsonOpt = False,
        text: TextOpt = None,
        evals: EvalOpt = None,
        heal_steps: HealStepsOpt = 0,
        heal_calibration: HealCalibrationOpt = "mixed",
        eval_windows: EvalWindowsOpt = 4,
        calibration_windows: CalibrationWindowsOpt = N_WINDOWS,
        dtype: DtypeOpt = "fp32",
        device: DeviceOpt = "cpu",
    ) -> None:
        """Remove whole attention sublayers (every head and its K/V cache; the MLP stays): the layers whose
        attention changes the residual stream least first. Prints before/after; --out saves the model."""
        from headcount.surgery.command import run_command

        run_command(DropAttention(fraction, layers, by, calibration_windows),
                    EditOptions(model=model, dtype=dtype, device=device, out=out, force=force, text=text,
                                evals=tuple(evals or ()), eval_windows=eval_windows, heal_steps=heal_steps,
                                json_out=json_out, heal_calibration=heal_calibration))
