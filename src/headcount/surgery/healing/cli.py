"""`headcount heal`, on the edit commands' skeleton (surgery/command.py): the model arrives edited (--model), the
unedited one is --teacher, and the edit is the heal. What this module adds is heal's options (HealSettings, which
build a HealConfig), their checks and the `Heal` edit. The --heal-steps wiring of the other edit commands is
heal_steps.py (re-exported here). Registered through headcount.surgery.cli; no torch import at module level.

Bad input: one line on stderr naming the flag, exit 2, nothing written (every check before --out is touched;
the model is saved atomically, so an interrupted heal leaves no --out).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cli_options import (EVAL_HELP, DeviceOpt, DtypeOpt, EditedModelOpt, EvalWindowsOpt, ForceOpt,
                                   JsonOpt, OutOpt, TeacherOpt)
from headcount.surgery.command import Edit, EditOptions, register_edit
# the --heal-steps wiring lives in heal_steps.py (the skeleton imports it); re-exported for the commands' imports
from headcount.surgery.healing.heal_steps import (check_heal_steps, healer, print_heal_table,  # noqa: F401
                                                  teacher_for, text_args)
from headcount.surgery.healing.config import (BATCH_SIZE, DEFAULT_LR, DEFAULT_PARAMS, DEFAULT_STEPS,
                                                DEFAULT_TOKENS, REFERENCE_RMS, WINDOW)
# --calibration's values are declared once, in calibrations.py (every edit command's --heal-calibration takes them)
from headcount.surgery.healing.calibrations import HELP as CALIBRATION_HELP
from headcount.surgery.healing.calibrations import TEACHER as TEACHER_STREAM  # noqa: F401
from headcount.surgery.healing.calibrations import TEACHER_CHAT, TEACHER_STREAMS, check_calibration  # noqa: F401


def load_pair(model_name: str, teacher_name: str, dtype: str, device: str):
    """(the edited model, its unedited teacher), checked: a trainable --dtype, the teacher its ancestor (an
    ArgumentError naming model or teacher: Heal.flags shows it as --model or --teacher)."""
    from headcount.models.options import load_model
    from headcount.surgery.healing.weights import check_teacher, check_trainable_dtype, share_unchanged

    model = load_model(model_name, dtype, device)
    check_trainable_dtype(model, "--dtype")
    teacher = load_model(teacher_name, dtype, device)
    check_teacher(model, teacher)
    share_unchanged(model, teacher)  # the student holds only what the edit changed (memory: docs/healing.md)
    return model, teacher


@dataclass(frozen=True)
class HealSettings:
    """heal's own options, as given."""

    teacher: str
    steps: int = DEFAULT_STEPS
    tokens: int = DEFAULT_TOKENS
    params: str = DEFAULT_PARAMS
    lr: Optional[float] = None
    stream: str = "mixed"

    def config(self, eval_windows: int):
        """The heal's settings (HealConfig: checked once, recorded whole in the result)."""
        from headcount.surgery.healing.config import HealConfig

        return HealConfig(steps=self.steps, tokens=self.tokens, params=self.params, lr=self.lr,
                          eval_windows=eval_windows)

    def check(self, text: Optional[Path]) -> None:
        """Every flag checked (naming it) before anything is loaded."""
        if self.steps < 1:
            raise ValueError(f"--steps: expected a positive number of steps, got {self.steps}")
        if self.tokens < 1:
            raise ValueError(f"--tokens: expected a positive number of tokens, got {self.tokens}")
        if self.params not in DEFAULT_LR:
            raise ValueError(f"--params: expected one of {', '.join(DEFAULT_LR)}, got {self.params!r}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"--lr: expected a positive learning rate, got {self.lr}")
        check_calibration("--calibration", self.stream)
        if text is not None and self.stream != "mixed":
            raise ValueError(f"--calibration: {self.stream!r} and --text both choose the calibration; give one")


@register_edit
class Heal(Edit):
    """Heal an edited model by distillation from the unedited one: the model arrives edited (--model), the
    unedited one is --teacher; before_edit is the teacher's quality, after_edit the student's, after_heal the
    healed model's."""

    name = "heal"
    example = ("--teacher", "{model}", "--steps", "1", "--tokens", str(10 * WINDOW))
    flags = {"model": "--model", "teacher": "--teacher", "tokens": "--tokens", "steps": "--steps", "lr": "--lr"}
    legacy_keys = ("steps", "tokens", "planned_steps", "tokens_seen", "validation_tokens", "lr", "params", "layers",
                   "trainable_params", "lora_rank", "teacher", "calibration", "window", "batch_size",
                   "val_kl_first", "val_kl_best", "best_step", "stopped_early", "val_losses", "world_size",
                   "checkpoint_layers", "lr_backoffs")

    def __init__(self, settings: HealSettings):
        self.settings = settings

    def check(self, opts: EditOptions) -> None:
        self.settings.check(opts.text)
        self.settings.config(opts.eval_windows)  # HealConfig's own checks, before loading

    def check_calibration(self, specs) -> None:
        from headcount.surgery.healing.calibrations import check_stubs_not_evaluated

        check_stubs_not_evaluated(specs, self.settings.stream, "--calibration")

    def load(self, run):
        model, run.unedited = load_pair(run.opts.model, self.settings.teacher, run.opts.dtype, run.opts.device)
        return model

    def check_model(self, model, run) -> None:
        from headcount.surgery.healing.loop import windows_drawn

        config = self.settings.config(run.opts.eval_windows)  # the tokens budget, in the model's windows
        windows_drawn(config.steps, config.tokens, window=min(config.window, model.config.max_position))

    def meter(self, run):
        from headcount.surgery.cli_common import quality_meter

        # the teacher is the model before the edit, the student after it: the three held-out domains, with --text's
        # held-out part as a fourth, "text"
        return quality_meter(None, run.opts.eval_windows, run.specs,
                             extra={"text": run.held_out} if run.held_out else None)

    def healer(self, run):
        return lambda model, before, after: heal_step(model, before, after, self.settings, run)

    def legacy(self, report, run) -> dict:
        stream = self.settings.stream
        healing = {k: report.healing.get(k) for k in self.legacy_keys}
        return healing | ({"calibration": stream} if stream in TEACHER_STREAMS else {}) | \
            {"teacher": self.settings.teacher}

    def table(self, data: dict, run) -> None:
        print_heal_table(data["heal"], f"{run.opts.model} healed from {self.settings.teacher}")
        if data.get("tasks"):
            from headcount.surgery.cli_common import before_after_table, task_rows
            before_after_table(task_rows(data["tasks"]), f"{run.opts.model}: task scores")


def heal_calibration(settings: HealSettings, run, student=None):
    """(calibration, stream) the heal distils on: --text's calibration part, a named stream, or the teacher's own
    text written now (for student-answers, the student's: calibrations.build_calibration)."""
    if settings.stream in TEACHER_STREAMS:
        from headcount.distributed import DataParallel
        from headcount.surgery.healing.calibrations import build_calibration

        return build_calibration(settings.stream, run.unedited, settings.steps, settings.tokens,
                                 world=DataParallel(run.group).world, progress=run.main, cache=True, student=student)
    return run.calibration, settings.stream


def heal_step(model, before, after, settings: HealSettings, run) -> dict:
    """run_edit's heal step for `headcount heal`: heal, record the metadata (saved with the model)."""
    from headcount.surgery.healing.loop import heal

    known = {"before_edit": dict(before.perplexity), "after_edit": dict(after.perplexity)}
    calibration, stream = heal_calibration(settings, run, student=model)
    result = heal(model, run.unedited, settings.config(run.opts.eval_windows), known=known, group=run.group,
                  **text_args(calibration, run.held_out, stream))
    text = run.opts.text
    model.healing = {**result.metadata(), "teacher": settings.teacher,
                     **({"calibration": str(text)} if text else {}),
                     **({"calibration": settings.stream} if settings.stream in TEACHER_STREAMS else {})}
    return result.to_json()


StepsOpt = Annotated[int, typer.Option("--steps", help=f"optimizer steps ({BATCH_SIZE} window(s) of {WINDOW} tokens "
                                                       "each)")]
TokensOpt = Annotated[int, typer.Option("--tokens", help="distinct calibration tokens drawn (training + validation)")]
ParamsOpt = Annotated[str, typer.Option("--params", help="which weights move: attention (the edited layers' q/k/v/o "
                                                         "and norms), all, or lora (merged back at the end)")]
LrOpt = Annotated[Optional[float], typer.Option("--lr", help="peak learning rate (default: "
                                                + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items())
                                                + ", scaled down where the attention weights' RMS is under "
                                                f"{REFERENCE_RMS:g}, SmolLM2's)")]
HealTextOpt = Annotated[Optional[Path], typer.Option("--text", help="UTF-8 text to heal on: its paragraphs are split "
                                                     "into calibration (distilled on) and held-out parts (measured "
                                                     "as the domain 'text' beside the three); default: the mixed "
                                                     "corpus")]
StreamOpt = Annotated[str, typer.Option("--calibration", help=CALIBRATION_HELP)]
HealEvalOpt = Annotated[Optional[list[str]], typer.Option("--eval", help=EVAL_HELP + " (before edit: the teacher)")]


def heal_cmd(
    model: EditedModelOpt = ...,
    teacher: TeacherOpt = ...,
    out: OutOpt = None,
    steps: StepsOpt = DEFAULT_STEPS,
    tokens: TokensOpt = DEFAULT_TOKENS,
    params: ParamsOpt = DEFAULT_PARAMS,
    lr: LrOpt = None,
    dtype: DtypeOpt = "fp32",
    device: DeviceOpt = "cpu",
    eval_windows: EvalWindowsOpt = 4,
    text: HealTextOpt = None,
    stream: StreamOpt = "mixed",
    force: ForceOpt = False,
    json_out: JsonOpt = False,
    evals: HealEvalOpt = None,
) -> None:
    """Heal an edited model by distillation from the unedited one (KL of next-token distributions on
    calibration text, a validation split for early stopping); print the held-out domains before the edit,
    after it and after healing; save. Under torchrun (`torchrun --nproc-per-node N -m headcount heal ...`)
    each step's windows are split over the ranks (DistributedDataParallel); rank 0 prints and saves."""
    from headcount.surgery.command import run_command

    opts = EditOptions(model=model, dtype=dtype, device=device, out=out, force=force, text=text,
                       evals=tuple(evals or ()), eval_windows=eval_windows, json_out=json_out)
    run_command(Heal(HealSettings(teacher=teacher, steps=steps, tokens=tokens, params=params, lr=lr,
                                  stream=stream)), opts)


def register(app, bench_app) -> None:  # noqa: ARG001
    """Add `headcount heal`."""
    app.command("heal")(heal_cmd)
