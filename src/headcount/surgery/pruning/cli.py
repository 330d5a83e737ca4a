"""`headcount prune` (one pruned model, or --curve), on the edit commands' skeleton (surgery/command.py): what
this module adds is prune's options (PruneSettings), their checks and the edit (`Prune`). Registered through
headcount.surgery.cli; no torch import at module level. Bad input: one line on stderr, exit 2, nothing written
(every check runs before the model is loaded or the output directory is touched; the checks that need the
model, such as --method l0's gate target and whether the gates reached it, run before anything is saved).

--method retraining-free (the default): heads chosen by --order on the unpruned model. --method l0: heads
chosen by trained hard-concrete gates (headcount.surgery.train_gates, --steps, --lr); the JSON's
`method` key says which, and for l0 `prune.gates` holds the GateResult. --joint (with --method l0): the
model's weights (--joint-params) train with the gates (Voita's setup, pruning/gates_joint.py) and the closed
heads are removed from the trained model as it is (--compensate none, its default there).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cli_options import (CalibrationWindowsOpt, CompensateOpt, CurveOpt, DeviceOpt, DtypeOpt, EvalOpt,
                                   EvalWindowsOpt, ForceOpt, FractionOpt, HealStepsOpt, JointOpt, JointParamsOpt,
                                   JsonOpt, ModelOpt, OrderOpt, OutOpt, PngOpt, PruneMethodOpt, PruneModeOpt,
                                   SeedOpt, TextOpt, UniformOpt)
from headcount.surgery.command import Edit, EditOptions, account_rows, heal_table, quality_rows, register_edit
from headcount.surgery.healing.heal_steps import HealCalibrationOpt
from headcount.surgery.pruning.gates_config import JOINT_STEPS, L0_LR, L0_STEPS, GateConfig  # the gates' defaults

PRUNE_JSON_KEYS = ("heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
                   "kv_bytes_per_token_after", "ppl_before", "ppl_after")
METHODS = ("retraining-free", "l0")

# prune's options whose help quotes this module's defaults (the rest are cli_options')
L0StepsOpt = Annotated[Optional[int], typer.Option("--steps", help=f"--method l0: gate training steps (default "
                                                                  f"{L0_STEPS}; with --joint {JOINT_STEPS})")]
L0LrOpt = Annotated[Optional[float], typer.Option("--lr", help=f"--method l0: the gates' learning rate (default "
                                                               f"{L0_LR})")]


@dataclass(frozen=True)
class PruneSettings:
    """prune's own options, as given (None: the default resolve() fills in)."""

    fraction: Optional[float] = None
    mode: str = "query"
    compensate: Optional[str] = None
    order: str = "reconstruction"
    uniform: bool = False
    seed: int = 0
    calibration_windows: int = 8
    method: str = "retraining-free"
    steps: Optional[int] = None
    lr: Optional[float] = None
    joint: bool = False
    joint_params: Optional[str] = None
    gates: Optional[GateConfig] = None  # --method l0: how the gates train (resolve() builds it)

    def resolve(self, curve: bool = False, specs=()) -> "PruneSettings":
        """Checked (naming the flag), with the defaults that depend on other flags filled in."""
        compensate = check_joint(self.method, self.joint, self.joint_params, self.compensate)
        for name, value, allowed in (("--mode", self.mode, ("query", "group")),
                                     ("--compensate", compensate, ("none", "mean", "lstsq")),
                                     ("--method", self.method, METHODS)):
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        if self.calibration_windows < 1:
            raise ValueError("--calibration-windows, --eval-windows: expected positive numbers")
        if specs and curve:
            raise ValueError("--eval: judges one edit; --curve measures many (drop one of them)")
        gates = check_l0(self, curve)
        if not curve and (self.fraction is None or not 0 < self.fraction < 1):
            raise ValueError(f"--fraction: expected a number in (0, 1), got {self.fraction}")
        joint_params = gates.params if gates is not None and gates.joint else None
        return dataclasses.replace(self, compensate=compensate, steps=gates and gates.steps, lr=gates and gates.lr,
                                   joint_params=joint_params, gates=gates)


def check_joint(method, joint, joint_params, compensate) -> str:
    """--joint's rules (before anything is loaded); the compensation to use."""
    if joint and method != "l0":
        raise ValueError(f"--joint: trains the model with L0 gates, only with --method l0, got --method {method}")
    if joint_params is not None and not joint:
        raise ValueError("--joint-params: only with --joint (the weights that train with the gates)")
    if joint_params is not None and joint_params not in ("attention", "all"):
        raise ValueError(f"--joint-params: expected one of attention, all, got {joint_params!r}")
    if joint and compensate not in (None, "none"):
        raise ValueError(f"--compensate: --joint removes the closed heads from the model trained with them as it "
                         f"is (none), got {compensate}")
    return compensate or ("none" if joint else "lstsq")


def check_l0(p: PruneSettings, curve: bool) -> GateConfig | None:
    """--method l0's GateConfig (its defaults filled in; a bad --steps or --lr is an ArgumentError, which
    Prune.flags shows under the flag), None otherwise."""
    if p.method != "l0":
        if p.steps is not None or p.lr is not None:
            raise ValueError(f"--{'steps' if p.steps is not None else 'lr'}: only with --method l0 (gate training)")
        return None
    given = {k: v for k, v in (("steps", p.steps), ("lr", p.lr)) if v is not None}
    joint = {"joint": True, "params": p.joint_params or "attention"} if p.joint else {}
    config = GateConfig(mode=p.mode, **given, **joint)
    if curve:
        raise ValueError("--method: --curve compares retraining-free orders; use --method l0 without --curve (or "
                         "`headcount bench surgery --part gates`)")
    return config


@register_edit
class Prune(Edit):
    """Remove attention heads: retraining-free (--order) or trained L0 gates (--method l0, --joint)."""

    name = "prune"
    example = ("--fraction", "0.5", "--compensate", "none", "--order", "random")
    # library argument -> flag: the gates' target (resolve_target) and GateConfig's checks name their arguments
    flags = {"fraction": "--fraction", "steps": "--steps", "lr": "--lr"}
    what = "the pruned model's held-out quality"
    legacy_keys = ("fraction_removed", "method", "prune")

    def __init__(self, settings: PruneSettings):
        self.settings = settings

    def check(self, opts: EditOptions) -> None:
        self.settings = self.settings.resolve()
        self.deep_teacher = bool(self.settings.joint_params)  # --joint trains norms too, in place: a full copy

    def distributed(self, opts: EditOptions):
        import os

        from headcount.surgery.command import torchrun_group

        if "WORLD_SIZE" in os.environ and self.settings.method == "l0":
            raise ValueError("--method: l0 trains gates in one process; run it without torchrun")
        return torchrun_group()  # the calibration windows are split over the ranks

    def check_model(self, model, run) -> None:
        if self.settings.method == "l0":
            l0_target(model, self.settings.fraction, self.settings.mode)

    def before(self, model, meter, run):
        # joint training changes the model: measure the unedited one first
        return meter.measure(model) if self.settings.joint_params else None

    def apply(self, model, run):
        return prune_edit(model, self.settings, run)

    def legacy(self, report, run) -> dict:
        before, after = report.accounts_before["heads"], report.accounts_after["heads"]
        return {"fraction_removed": round((before - after) / before, 4),
                "method": report.edit.get("method") or self.settings.method, "prune": report.edit}

    def table(self, data: dict, run) -> None:
        print_prune(data, self.settings, run)


def prune_edit(model, p: PruneSettings, run):
    """The edit: the gates' choice (--method l0) or prune_to's (the PruneResult)."""
    from headcount.surgery import apply_gates, prune_to

    if p.method == "l0":  # the gates keep exactly their target (or refuse it, naming --fraction)
        gates = train_l0(model, p, run.calibration, run.opts.force)
        return apply_gates(model, gates, compensate=p.compensate, calibration=run.calibration, force=True,
                           calibration_windows=p.calibration_windows)
    say_plan(model, p.fraction, p.mode, p.uniform, run.main)
    return prune_to(model, p.fraction, order=p.order, mode=p.mode, compensate=p.compensate, uniform=p.uniform,
                    calibration=run.calibration, seed=p.seed, calibration_windows=p.calibration_windows,
                    group=run.group)


def say_plan(model, fraction, mode, uniform, main) -> None:
    """Before any work, when the heads that will go are not the fraction asked (uniform pruning rounds per
    GQA group: --fraction 0.2 --uniform removes one head of every group of three, 33.3%): say so."""
    from headcount.surgery.pruning import plan as _plan

    if not main:
        return
    total = sum(layer.attn.n_heads for layer in model.layers)
    fake = {(l, h): 0.0 for l, layer in enumerate(model.layers) for h in layer.attn.kept_heads}
    n = sum(len(v) for v in _plan.plan_fraction(model, fraction, fake, mode=mode, uniform=uniform).values())
    if mode == "query" and n != round(fraction * total):
        typer.echo(f"headcount prune: removing {n} of {total} query heads ({n / total:.1%}), not the "
                   f"{fraction:.1%} asked: {'uniform pruning rounds per GQA group' if uniform else 'rounding'}",
                   err=True)


def train_l0(model, p: PruneSettings, calibration, force: bool):
    """Train the gates (every check first, naming the flag); refuse a missed target unless --force."""
    from headcount.surgery.pruning.gates import REACH_TOLERANCE, train_gates

    unit = l0_target(model, p.fraction, p.mode)
    gates = train_gates(model, p.gates, fraction=p.fraction, calibration=calibration)
    if not gates.reached and not force:
        raise ValueError(f"--steps: the L0 target is unreachable in {p.steps} steps: the gates' expected L0 ended at "
                         f"{gates.final_expected_l0:.1f} open {unit}, target {gates.heads_to_keep} of "
                         f"{gates.n_gates} (more than {REACH_TOLERANCE:.0%} off); nothing written. Give more "
                         "--steps or a larger --lr, or --force to prune by the gates' ranking anyway")
    return gates


def l0_target(model, fraction, mode) -> str:
    """Check the gates' target (an ArgumentError naming `fraction`, shown as --fraction); the gates' unit."""
    from headcount.surgery.pruning.gates import gate_count, resolve_target

    unit = "query heads" if mode == "query" else "KV groups"
    resolve_target(*gate_count(model, mode), fraction=fraction, unit=unit)
    return unit


def print_prune(data: dict, p: PruneSettings, run) -> None:
    """prune's before/after table, the task scores, the gates' line, the healing table, the GQA note."""
    from headcount.surgery.cli_common import before_after_table, task_rows

    model = run.opts.model
    how = (f"L0 gates{' trained with the ' + joint_params_of(data) if p.joint else ''}, {p.steps} steps"
           if p.method == "l0" else f"order {data['prune']['order']}")
    before_after_table(account_rows(data, "query heads") + quality_rows(data, run.source),
                       f"{model}: {data['prune']['heads_removed']} heads removed ({p.mode} mode, {how}, "
                       f"compensate {p.compensate})")
    if data.get("tasks"):
        before_after_table(task_rows(data["tasks"]), f"{model}: task scores")
    if p.method == "l0":
        g = data["prune"]["gates"]
        typer.echo(f"gates: expected L0 {g['final_expected_l0']:.1f} (target {g['heads_to_keep']}); removed "
                   f"{g['n_removed_closed']} closed + {g['n_removed_ranked']} by rank; "
                   f"{g['forward_equivalents']:.0f} forward-pass equivalents, {g['seconds']:.0f} s")
    heal_table(data, f"{model}: healed after pruning")
    if p.mode == "query" and not p.uniform and data["kv_heads_before"] < data["heads_before"]:
        typer.echo("note: query mode leaves uneven GQA groups, which a GGUF export writes with copied KV heads "
                   "(a larger llama.cpp cache); --mode group or --uniform keep an export compact")


def joint_params_of(data) -> str:
    return f"model's {data['prune']['gates'].get('params')} weights"


def run_curve(model_name, text, p: PruneSettings, png, json_out, eval_windows) -> None:
    """--curve: the pruning curve of the retraining-free orders (no edit saved)."""
    from headcount.models import load
    from headcount.surgery import pruning_curve
    from headcount.surgery.cli_common import calibration_and_held_out

    cal, held, _ = calibration_and_held_out(text)
    model = load(model_name)
    curve = pruning_curve(model, mode=p.mode, uniform=p.uniform, calibration=cal, held_out=held,
                          calibration_windows=p.calibration_windows, eval_windows=eval_windows,
                          orders=("gradient", "reconstruction", "random"), seeds=(0,))
    data = curve.to_json()
    if png is not None:
        from headcount.surgery.pruning.bench import plot_curve
        plot_curve(data, png)
    if json_out:
        typer.echo(json.dumps(data, indent=2))
    else:
        from headcount.surgery.pruning.bench import render_curve
        render_curve(data)


def curve_command(opts: EditOptions, p: PruneSettings, png: Optional[Path]) -> None:
    """--curve's checks (the shared ones, then prune's), then the curve."""
    from headcount.cli_errors import one_line_errors
    from headcount.surgery.command import check_shared

    with one_line_errors("prune"):
        specs = check_shared(opts)
        p.resolve(curve=True, specs=specs)
        if png is not None:
            from headcount.paths import check_png
            check_png(png)
        run_curve(opts.model, opts.text, p, png, opts.json_out, opts.eval_windows)


def prune_cmd(
    model: ModelOpt = "smollm2",
    dtype: DtypeOpt = "fp32",
    device: DeviceOpt = "cpu",
    fraction: FractionOpt = None,
    mode: PruneModeOpt = "query",
    compensate: CompensateOpt = None,
    order: OrderOpt = "reconstruction",
    uniform: UniformOpt = False,
    out: OutOpt = None,
    force: ForceOpt = False,
    text: TextOpt = None,
    curve: CurveOpt = False,
    png: PngOpt = None,
    seed: SeedOpt = 0,
    calibration_windows: CalibrationWindowsOpt = 8,
    eval_windows: EvalWindowsOpt = 4,
    json_out: JsonOpt = False,
    method: PruneMethodOpt = "retraining-free",
    steps: L0StepsOpt = None,
    lr: L0LrOpt = None,
    joint: JointOpt = False,
    joint_params: JointParamsOpt = None,
    heal_steps: HealStepsOpt = 0,
    heal_calibration: HealCalibrationOpt = "mixed",
    evals: EvalOpt = None,
) -> None:
    """Remove attention heads (retraining-free order, or trained L0 gates; with compensation); print
    before/after and save. --force also prunes when the L0 gates missed their target."""
    opts = EditOptions(model=model, dtype=dtype, device=device, out=out, force=force, text=text,
                       evals=tuple(evals or ()), eval_windows=eval_windows, heal_steps=heal_steps, json_out=json_out,
                       heal_calibration=heal_calibration)
    settings = PruneSettings(fraction=fraction, mode=mode, compensate=compensate, order=order, uniform=uniform,
                             seed=seed, calibration_windows=calibration_windows, method=method, steps=steps, lr=lr,
                             joint=joint, joint_params=joint_params)
    if curve:
        curve_command(opts, settings, png)
        return
    from headcount.surgery.command import run_command

    run_command(Prune(settings), opts)


def register(app, bench_app) -> None:  # noqa: ARG001
    """Add `headcount prune`."""
    app.command("prune")(prune_cmd)
