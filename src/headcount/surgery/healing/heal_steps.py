"""The --heal-steps wiring every edit command shares (prune, prune --method l0, merge-kv, drop-attention, through
surgery/command.py) and `headcount heal`'s table. No torch import at module level; imports neither the skeleton
nor any command (the skeleton imports it).

    check_heal_steps(n)                     the flag's check, before anything is loaded
    check_heal_calibration(name, n, text)   --heal-calibration's check (calibrations.CALIBRATIONS), the same
    HealCalibrationOpt                      the flag, declared once for every edit command
    teacher_for(model, n)                   the unedited copy to distil from (None when n == 0), taken BEFORE the edit
    healer(teacher, n)                      run_edit's heal step: heal, record the metadata; the JSON block
    print_heal_table(block)                 before the edit / after the edit / after healing, every domain
"""

from __future__ import annotations

from typing import Annotated

import typer

from headcount.arguments import ArgumentError
from headcount.surgery.healing.calibrations import DEFAULT, HELP, TEACHER_STREAMS, check_calibration

HealCalibrationOpt = Annotated[str, typer.Option("--heal-calibration", help="with --heal-steps: " + HELP)]


def check_heal_steps(heal_steps: int) -> None:
    if heal_steps is None or heal_steps < 0:
        raise ValueError(f"--heal-steps: expected a number of steps >= 0 (0 = no healing), got {heal_steps}")


def check_heal_calibration(name: str, heal_steps: int, text) -> None:
    """--heal-calibration: one of calibrations.CALIBRATIONS; another than the default only with --heal-steps and
    without --text (whose calibration part the heal distils on)."""
    check_calibration("--heal-calibration", name)
    if name != DEFAULT and not heal_steps:
        raise ArgumentError("--heal-calibration", f"{name!r} chooses the heal's calibration; expected --heal-steps "
                                                  "> 0 beside it")
    if name != DEFAULT and text is not None:
        raise ArgumentError("--heal-calibration", f"{name!r} and --text both choose the heal's calibration; give one")


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
           held_out=None, name: str = DEFAULT, cache: bool = False):
    """run_edit's heal step for --heal-steps (None when there is no teacher): heal the edited model from `teacher`
    for `heal_steps` steps, reusing the edit's held-out figures before and after the edit. group: the torchrun
    group the edit ran on (the heal runs data-parallel over it, DDP); calibration / held_out: the calibration
    and held-out parts of the edit's --text (None: the calibration `name`, --heal-calibration, "mixed" by default;
    the text's held-out part is measured as a fourth domain, "text", beside the three). cache: what the teacher
    writes is kept under $HEADCOUNT_CACHE/teacher and read back for the same teacher (the commands ask for it).
    The step returns HealResult.to_json()."""
    if teacher is None:
        return None

    def step(model, before, after) -> dict:
        from headcount.surgery.healing.calibrations import build_calibration
        from headcount.surgery.healing.config import HealConfig
        from headcount.surgery.healing.loop import heal

        config = HealConfig(steps=heal_steps, eval_windows=eval_windows)
        known = ({"before_edit": dict(before.perplexity), "after_edit": dict(after.perplexity)}
                 if len(before.perplexity) > 1 else None)
        cal, stream = calibration, DEFAULT
        if calibration is None:  # the named calibration (the teacher's are written now, by the unedited teacher)
            from headcount.distributed import DataParallel
            cal, stream = build_calibration(name, teacher, config.steps, config.tokens,
                                            world=DataParallel(group).world, progress=progress, cache=cache,
                                            student=model)
            cal = None if isinstance(cal, str) else cal
        result = heal(model, teacher, config, known=known, progress=progress, group=group,
                      **text_args(cal, held_out, stream))
        if calibration is None and name in TEACHER_STREAMS:
            result.calibration = name  # what the teacher wrote, by the name the user chose
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
