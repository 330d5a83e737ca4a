"""`headcount heal` and the --heal-steps wiring the edit commands share (prune, prune --method l0, merge-kv).
Registered through headcount.surgery.cli; no torch import at module level.

    check_heal_steps(n)                     the flag's check, before anything is loaded
    teacher_for(model, n)                   the unedited copy to distil from (None when n == 0), taken BEFORE the edit
    healer(teacher, n)                      run_edit's heal step: heal, record the metadata; the JSON block
    print_heal_table(block)                 before the edit / after the edit / after healing, every domain

Bad input: one line on stderr naming the flag, exit 2, nothing written (every check before --out is touched;
the model is saved atomically, so an interrupted heal leaves no --out).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from headcount.models.options import DEVICE_HELP, DTYPE_HELP
from headcount.surgery.cli_common import EVAL_HELP


TEACHER_STREAM = "teacher"  # --calibration: the teacher's own samples (healing/teacher_text.py)
TEACHER_CHAT = "teacher-chat"  # --calibration: prose and the teacher's chat answers (teacher_chat_windows)
TEACHER_STREAMS = (TEACHER_STREAM, TEACHER_CHAT)


def check_heal_steps(heal_steps: int) -> None:
    if heal_steps is None or heal_steps < 0:
        raise ValueError(f"--heal-steps: expected a number of steps >= 0 (0 = no healing), got {heal_steps}")


def teacher_for(model, heal_steps: int, dtype: str = "fp32", deep: bool = False):
    """The unedited model to heal from: a copy of its attention (every other tensor shared; healing's "attention"
    default moves only attention and norms, and gives the student its own copy of anything else it moves).
    deep: a full copy, when the edit itself trains tensors outside attention in place (prune --joint: its norms)."""
    if not heal_steps:
        return None
    from headcount.models.copying import attention_copy
    from headcount.surgery.healing.weights import check_trainable_dtype

    if not hasattr(model, "lm_head"):
        raise ValueError(f"--heal-steps: healing distils next-token distributions; {model.name or 'this model'} is an "
                         "encoder (use 0)")
    try:
        check_trainable_dtype(model, "--dtype")
    except ValueError as e:
        raise ValueError(f"{e} (--heal-steps trains the edited model)") from None
    if deep:
        import copy
        return copy.deepcopy(model)
    return attention_copy(model)


def healer(teacher, heal_steps: int, *, progress: bool = True, eval_windows: int = 4, group=None, calibration=None,
           held_out=None):
    """run_edit's heal step for --heal-steps (None when there is no teacher): heal the edited model from `teacher`
    for `heal_steps` steps, reusing the edit's held-out figures before and after the edit. group: the torchrun
    group the edit ran on (the heal runs data-parallel over it, DDP); calibration / held_out: the calibration
    and held-out parts of the edit's --text (None: the default "mixed" calibration; the text's held-out part is
    measured as a fourth domain, "text", beside the three). The step returns HealResult.to_json()."""
    if teacher is None:
        return None

    def step(model, before, after) -> dict:
        from headcount.surgery.healing.loop import heal

        known = ({"before_edit": dict(before.perplexity), "after_edit": dict(after.perplexity)}
                 if len(before.perplexity) > 1 else None)
        result = heal(model, teacher, steps=heal_steps, known=known, progress=progress, eval_windows=eval_windows,
                      group=group, **text_args(calibration, held_out))
        model.healing = result.metadata()
        return result.to_json()

    return step


def text_args(calibration, held_out, stream: str = "mixed") -> dict:
    """heal()'s calibration and held_out_texts for --text's two parts (None: the named `stream`, "mixed" by
    default)."""
    return {"calibration": stream if calibration is None else calibration,
            "held_out_texts": {"text": held_out} if held_out else None}


def print_heal_table(block: dict, title: str = "healing") -> None:
    from rich.console import Console
    from rich.table import Table

    figures = block.get("held_out") or {}
    before, edit, healed = (figures.get(k) or {} for k in ("before_edit", "after_edit", "after_heal"))
    table = Table(title=f"{title}: {block['steps']} steps ({block['params']}), {block['tokens']:,} calibration tokens, "
                        f"{block['seconds']:.0f} s")
    for col in ("held-out perplexity", "before edit", "after edit", "after heal", "edit", "healed"):
        table.add_column(col, justify="left" if col.startswith("held") else "right")
    for name in before:
        b, e, h = before[name], edit.get(name), healed.get(name)
        table.add_row(name, f"{b:.3f}", f"{e:.3f}", f"{h:.3f}", f"{(e / b - 1) * 100:+.1f}%", f"{(h / b - 1) * 100:+.1f}%")
    Console().print(table)


def _load_pair(model_name: str, teacher_name: str, dtype: str, device: str):
    from headcount.models.options import load_model
    from headcount.surgery.healing.weights import check_teacher, check_trainable_dtype, share_unchanged

    model = load_model(model_name, dtype, device)
    try:
        check_trainable_dtype(model, "--dtype")
    except ValueError as e:
        raise ValueError(str(e)) from None
    teacher = load_model(teacher_name, dtype, device)
    try:
        check_teacher(model, teacher)
    except ValueError as e:
        message = str(e)
        flag = "--model" if message.startswith("model:") else "--teacher"
        raise ValueError(f"{flag}{message[message.index(':'):]}") from None
    share_unchanged(model, teacher)  # the student holds only what the edit changed (memory: docs/healing.md)
    return model, teacher


def register(app, bench_app) -> None:
    """Add `headcount heal`."""
    from headcount.cli_errors import rank_errors as _one_line_errors  # rank-prefixed under torchrun
    from headcount.surgery.healing.loop import (BATCH_SIZE, DEFAULT_LR, DEFAULT_PARAMS, DEFAULT_STEPS,
                                                  DEFAULT_TOKENS, REFERENCE_RMS, WINDOW)

    @app.command("heal")
    def heal_cmd(
        model: str = typer.Option(..., "--model", "-m", help="the edited model (a directory `headcount prune` / "
                                  "`merge-kv` saved, or any model)"),
        teacher: str = typer.Option(..., "--teacher", help="the unedited model it came from (zoo name or path)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory to save the healed model to"),
        steps: int = typer.Option(DEFAULT_STEPS, "--steps",
                                  help=f"optimizer steps ({BATCH_SIZE} window(s) of {WINDOW} tokens each)"),
        tokens: int = typer.Option(DEFAULT_TOKENS, "--tokens", help="distinct calibration tokens drawn (training + "
                                   "validation)"),
        params: str = typer.Option(DEFAULT_PARAMS, "--params", help="which weights move: attention (the edited "
                                   "layers' q/k/v/o and norms), all, or lora (merged back at the end)"),
        lr: Optional[float] = typer.Option(None, "--lr", help="peak learning rate (default: "
                                           + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items())
                                           + ", scaled down where the attention weights' RMS is under "
                                           f"{REFERENCE_RMS:g}, SmolLM2's)"),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        eval_windows: int = typer.Option(4, "--eval-windows", help="held-out windows of 512 tokens measured per "
                                         "domain"),
        text: Optional[Path] = typer.Option(None, "--text", help="UTF-8 text to heal on: its paragraphs are split "
                                            "into calibration (distilled on) and held-out parts (measured as the "
                                            "domain 'text' beside the three); default: the mixed corpus"),
        stream: str = typer.Option("mixed", "--calibration", help="the calibration stream without --text: mixed "
                                   "(prose + torch/numpy docstrings and comments), prose+source (prose + the "
                                   "same files' verbatim source: for code models), teacher (the teacher's own "
                                   "sampled continuations of mixed's calibration prompts, --tokens of them) or "
                                   "teacher-chat (for a chat model judged by its answers: half prose, half the "
                                   "teacher's greedy chat answers to function stubs of the torch/numpy "
                                   "calibration source, asked as --eval asks)"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
        evals: Optional[list[str]] = typer.Option(None, "--eval", help=EVAL_HELP + " (before edit: the teacher)"),
    ) -> None:
        """Heal an edited model by distillation from the unedited one (KL of next-token distributions on
        calibration text, a validation split for early stopping); print the held-out domains before the edit,
        after it and after healing; save. Under torchrun (`torchrun --nproc-per-node N -m headcount heal ...`)
        each step's windows are split over the ranks (DistributedDataParallel); rank 0 prints and saves."""
        with _one_line_errors("heal"):
            if steps < 1:
                raise ValueError(f"--steps: expected a positive number of steps, got {steps}")
            if tokens < 1:
                raise ValueError(f"--tokens: expected a positive number of tokens, got {tokens}")
            if params not in DEFAULT_LR:
                raise ValueError(f"--params: expected one of {', '.join(DEFAULT_LR)}, got {params!r}")
            if eval_windows < 1:
                raise ValueError(f"--eval-windows: expected a positive number, got {eval_windows}")
            if lr is not None and not lr > 0:
                raise ValueError(f"--lr: expected a positive learning rate, got {lr}")
            from headcount.analysis.batches import STREAMS
            if stream not in (*STREAMS, *TEACHER_STREAMS):
                raise ValueError(f"--calibration: expected one of {', '.join((*STREAMS, *TEACHER_STREAMS))}, "
                                 f"got {stream!r}")
            if text is not None and stream != "mixed":
                raise ValueError(f"--calibration: {stream!r} and --text both choose the calibration; give one")
            from headcount.models.options import parse_device, parse_dtype
            from headcount.surgery.cli_common import (calibration_and_held_out, check_eval_model, check_out_dir,
                                                      quality_meter, task_specs)
            from headcount.surgery.task_scores import check_not_calibrated_on

            parse_dtype(dtype), parse_device(device)
            specs = task_specs(evals)
            calibration, held_out, _ = calibration_and_held_out(text)
            check_not_calibrated_on(specs, calibration)
            if stream == TEACHER_CHAT:  # the stubs the teacher is asked about are calibration text too
                from headcount.data import function_stubs
                check_not_calibrated_on(specs, list(function_stubs()), "--calibration teacher-chat")
            out = check_out_dir(out, force)
            group, main = None, True
            if "WORLD_SIZE" in os.environ:  # under torchrun: data-parallel healing (DDP), rank 0 writes
                from headcount import distributed
                group = distributed.init()
                main = distributed.is_main(group)
            student, original = _load_pair(model, teacher, dtype, device)
            check_eval_model(specs, student)
            from headcount.surgery import save
            from headcount.surgery.editing import run_edit

            def heal_step(model, before, after) -> dict:
                from headcount.surgery.healing.loop import heal

                known = {"before_edit": dict(before.perplexity), "after_edit": dict(after.perplexity)}
                calibration_now, stream_now = calibration, stream
                if stream == TEACHER_STREAM:  # written by the teacher now, from the mixed stream's prompts
                    from headcount.surgery.healing.teacher_text import teacher_texts
                    calibration_now, stream_now = teacher_texts(original, tokens, progress=main), "mixed"
                elif stream == TEACHER_CHAT:  # as many windows as the heal draws, half of them the teacher's answers
                    from headcount.distributed import DataParallel
                    from headcount.surgery.healing.loop import windows_drawn
                    from headcount.surgery.healing.teacher_text import teacher_chat_windows
                    n = windows_drawn(steps, tokens, world=DataParallel(group).world)
                    calibration_now, stream_now = teacher_chat_windows(original, n, progress=main), "mixed"
                try:
                    result = heal(model, original, steps=steps, tokens=tokens, params=params, lr=lr, known=known,
                                  eval_windows=eval_windows, group=group,
                                  **text_args(calibration_now, held_out, stream_now))
                except ValueError as e:
                    if str(e).startswith("tokens:"):
                        raise ValueError(f"--{e}") from None
                    raise
                model.healing = {**result.metadata(), "teacher": teacher,
                                 **({"calibration": str(text)} if text else {}),
                                 **({"calibration": stream} if stream in TEACHER_STREAMS else {})}
                return result.to_json()

            # the teacher is the model before the edit, the student after it: the three held-out domains, with
            # --text's held-out part as a fourth, "text"
            meter = quality_meter(None, eval_windows, specs, extra={"text": held_out} if held_out else None)
            report = run_edit(student, None, unedited=original, meter=meter, heal=heal_step)
            if specs:
                student.task_scores = report.tasks()
            if not main:
                return
            save(student, out, force=force)
        from headcount.surgery.cli_common import command_line
        # weights_sha256: the unedited model's (the teacher: the weights before the edit, what a saved result is
        # keyed by); edited_weights_sha256: the student's before healing
        data = {**report.healing, **({"calibration": stream} if stream in TEACHER_STREAMS else {}),
                "teacher": teacher, "out": str(out), "weights_sha256": report.weights_sha256,
                "edited_weights_sha256": report.edited_weights_sha256, "command": command_line()}
        if specs:
            data["tasks"] = report.tasks()
        if json_out:
            typer.echo(json.dumps(data, indent=2))
            return
        print_heal_table(data, f"{model} healed from {teacher}")
        if specs:
            from headcount.surgery.cli_common import before_after_table, task_rows
            before_after_table(task_rows(data["tasks"]), f"{model}: task scores")
        typer.echo(f"saved to {out} (headcount.models.load / --model {out})")
