"""One skeleton for every edit command (prune, prune --method l0, merge-kv, heal, and any edit to come).

A command adds its own options and its edit; everything else is here, once:

    from headcount.cli_options import ModelOpt, JsonOpt, OutOpt, ...
    from headcount.surgery.command import Edit, EditOptions, register_edit, run_command

    @register_edit
    class DropLayers(Edit):
        name = "drop-layers"                      # the command, and the prefix of its one-line errors
        example = ("--layers", "1")               # the smallest run (the schema test runs it on a tiny model)

        def __init__(self, layers: str):
            self.layers = layers

        def check(self, opts):                    # its own flags, before anything is loaded or written
            self.indices = parse_layers(self.layers)

        def apply(self, model, run):              # the edit itself: returns a result with to_json()
            return drop_layers(model, self.indices, calibration=run.calibration)

    @app.command("drop-layers")
    def drop_layers_cmd(model: ModelOpt = "smollm2", out: OutOpt = None, ..., layers: LayersOpt = "1"):
        run_command(DropLayers(layers), EditOptions(model=model, out=out, ...))

run_command does, in order: the shared flags' checks (--heal-steps, --heal-calibration, --eval-windows, --dtype,
--device, the --eval specs), the command's `check`, the --out check, the --text split into calibration and held-out, the --eval
checks (no eval problem in the calibration text; a decoder with a tokenizer), loading (`Edit.load`), the
command's `check_model`, the teacher for --heal-steps (taken before the edit), the meter, `run_edit` (measure,
edit, measure, heal, measure), the --eval scores back onto the model, saving, and the JSON (EditReport.to_json(),
the same top-level keys for every edit) or the command's table. Under torchrun the edit runs on every rank and
rank 0 alone saves and prints.

A library error that knows its argument (headcount.arguments.ArgumentError) is shown under the command's flag:
`Edit.flags` maps the library's argument names to the command's flags, and cli_errors applies it.
No torch import at module level (`headcount --help` stays fast).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

EDITS: dict[str, type["Edit"]] = {}  # every edit command, by name: register_edit fills it


def register_edit(cls: type["Edit"]) -> type["Edit"]:
    """Class decorator: the edit joins EDITS (what the one-schema test runs, every edit command)."""
    EDITS[cls.name] = cls
    return cls


@dataclass(frozen=True)
class EditOptions:
    """The flags every edit command shares (cli_options declares them; the command passes their values)."""

    model: str = "smollm2"
    dtype: str = "fp32"
    device: str = "cpu"
    out: Optional[Path] = None
    force: bool = False
    text: Optional[Path] = None
    evals: tuple = ()
    eval_windows: int = 4
    heal_steps: int = 0
    json_out: bool = False
    heal_calibration: str = "mixed"  # healing/calibrations.py's CALIBRATIONS


@dataclass
class EditRun:
    """One run's state, handed to the command's hooks: the options, the --eval specs, the two parts of the text,
    the torchrun group, the teacher (--heal-steps)."""

    opts: EditOptions
    specs: list = field(default_factory=list)
    calibration: Any = None  # list of texts, or None: the default corpus
    held_out: Any = None
    source: str = "default corpus"
    out: Optional[Path] = None
    group: Any = None
    main: bool = True  # rank 0 (or no torchrun): prints and saves
    teacher: Any = None
    unedited: Any = None  # the model before the edit when it arrives edited (heal)
    start: float = field(default_factory=time.perf_counter)


class Edit:
    """What an edit command adds to the skeleton. Override what differs; the defaults are prune's and merge-kv's."""

    name = "edit"  # the command's name: its errors' prefix, its key in EDITS
    example: tuple = ()  # the smallest arguments of a run, "{model}" standing for the model's path
    flags: dict = {}  # library argument name -> the command's flag (ArgumentError renamed, cli_errors)
    out_required = True  # False: --out is optional (merge-kv)
    deep_teacher = False  # the teacher is a full copy (the edit trains tensors outside attention in place)
    what = "the edited model's held-out quality"  # named when a perplexity comes out NaN / inf
    legacy_keys: tuple = ()  # top-level keys this command's JSON carried before the one schema (kept for scripts)
    heads_counted = "query"  # what the JSON's heads_before / heads_after count: "query" or "kv" heads

    def check(self, opts: EditOptions) -> None:
        """The command's own flags, before anything is loaded or written."""

    def check_calibration(self, specs) -> None:
        """More calibration text the edit will read, checked against --eval's problems (none held by it)."""

    def distributed(self, opts: EditOptions):
        """(group, main) under torchrun, else (None, True)."""
        return torchrun_group()

    def load(self, run: EditRun):
        """The model to edit (from --model, in --dtype, on --device)."""
        from headcount.models.options import load_model

        return load_model(run.opts.model, run.opts.dtype, run.opts.device)

    def check_model(self, model, run: EditRun) -> None:
        """Checks that need the model, before any measurement or change."""

    def teacher(self, model, run: EditRun):
        """The unedited model --heal-steps distils from (None without healing), taken before the edit."""
        from headcount.surgery.healing.heal_steps import teacher_for

        return teacher_for(model, run.opts.heal_steps, run.opts.dtype, deep=self.deep_teacher)

    def meter(self, run: EditRun):
        from headcount.surgery.cli_common import quality_meter

        return quality_meter(run.held_out, run.opts.eval_windows, run.specs)

    def before(self, model, meter, run: EditRun):
        """The unedited model's Quality when the edit must measure it itself (None: run_edit measures it)."""
        return None

    def apply(self, model, run: EditRun):
        """The edit: changes `model` in place; returns its result (anything with to_json(), or a dict)."""
        raise NotImplementedError

    def healer(self, run: EditRun):
        """run_edit's heal step (--heal-steps: distil from the teacher); None: no healing."""
        from headcount.surgery.healing.heal_steps import healer

        return healer(run.teacher, run.opts.heal_steps, progress=run.main, eval_windows=run.opts.eval_windows,
                      group=run.group, calibration=run.calibration, held_out=run.held_out,
                      name=run.opts.heal_calibration, cache=True)

    def legacy(self, report, run: EditRun) -> dict:
        """The command's older top-level keys (legacy_keys), kept beside the schema's for the scripts that read
        them (EditReport.extra)."""
        return {}

    def table(self, data: dict, run: EditRun) -> None:
        """The before/after table (without --json)."""
        from headcount.surgery.cli_common import before_after_table, task_rows

        before_after_table(account_rows(data) + quality_rows(data, run.source), f"{run.opts.model}: {self.name}")
        if data.get("tasks"):
            before_after_table(task_rows(data["tasks"]), f"{run.opts.model}: task scores")


# ------------------------------------------------------------------------------------------- the skeleton
def run_command(edit: Edit, opts: EditOptions) -> dict | None:
    """Run an edit command: one line and exit 2 on bad input (nothing written), else the JSON or the table.
    Returns the JSON's dict (None on a rank other than 0)."""
    from headcount.cli_errors import rank_errors

    with rank_errors(edit.name, flags=edit.flags):
        data, run = run_edit_command(edit, opts)
    if data is None:
        return None
    if opts.json_out:
        typer.echo(json.dumps(data, indent=2))
    else:
        edit.table(data, run)
        if run.out is not None:
            typer.echo(f"saved to {run.out} (headcount.models.load / --model {run.out})")
    return data


def run_edit_command(edit: Edit, opts: EditOptions):
    """(the JSON's dict or None on a rank other than 0, the run): the work of run_command without printing."""
    run = prepare(edit, opts)
    model = load_checked(edit, run)
    report = measure_edit(edit, model, run)
    if not run.main:  # another rank under torchrun: rank 0 writes and prints
        return None, run
    if run.out is not None:
        from headcount.surgery import save

        save(model, run.out, force=opts.force)
    from headcount.surgery.cli_common import command_line

    report.seconds = time.perf_counter() - run.start
    report.out = str(run.out) if run.out is not None else None
    report.command = command_line()  # what produced this result (a saved --json is keyed and quoted by it)
    report.extra = edit.legacy(report, run)
    report.heads_counted = edit.heads_counted
    return report.to_json(), run


def check_shared(opts: EditOptions) -> list:
    """The shared flags' checks, before the command's own: --heal-steps, --heal-calibration, --eval-windows,
    --dtype, --device; the --eval specs (read and checked before any work)."""
    from headcount.models.options import parse_device, parse_dtype
    from headcount.surgery.cli_common import task_specs
    from headcount.surgery.healing.heal_steps import check_heal_calibration, check_heal_steps

    check_heal_steps(opts.heal_steps)
    check_heal_calibration(opts.heal_calibration, opts.heal_steps, opts.text)
    if opts.eval_windows < 1:
        raise ValueError(f"--eval-windows: expected a positive number, got {opts.eval_windows}")
    parse_dtype(opts.dtype), parse_device(opts.device)
    return task_specs(list(opts.evals) or None)


def prepare(edit: Edit, opts: EditOptions) -> EditRun:
    """Every check that needs nothing loaded, in order, then the torchrun group: the run's state."""
    from headcount.surgery.cli_common import calibration_and_held_out, check_out_dir
    from headcount.surgery.healing.calibrations import check_stubs_not_evaluated
    from headcount.surgery.task_scores import check_not_calibrated_on

    specs = check_shared(opts)
    edit.check(opts)
    out = check_out_dir(opts.out, opts.force) if opts.out is not None or edit.out_required else None
    calibration, held_out, source = calibration_and_held_out(opts.text)
    check_not_calibrated_on(specs, calibration)
    check_stubs_not_evaluated(specs, opts.heal_calibration, "--heal-calibration")  # what the teacher is asked
    edit.check_calibration(specs)
    group, main = edit.distributed(opts)
    return EditRun(opts, specs, calibration, held_out, source, out, group, main)


def torchrun_group(timeout_s: float | None = None):
    """(group, main) under torchrun (WORLD_SIZE set): the calibration is split over the ranks, rank 0 prints and
    saves; (None, True) without it."""
    if "WORLD_SIZE" not in os.environ:
        return None, True
    from headcount import distributed

    group = distributed.init() if timeout_s is None else distributed.init(timeout_s=timeout_s)
    return group, distributed.is_main(group)


def load_checked(edit: Edit, run: EditRun):
    """Load, the --eval model check, the command's own model checks, then the teacher: the model to edit."""
    from headcount.surgery.cli_common import check_eval_model

    model = edit.load(run)
    check_eval_model(run.specs, model)
    edit.check_model(model, run)
    run.teacher = edit.teacher(model, run)
    return model


def measure_edit(edit: Edit, model, run: EditRun):
    """run_edit with the command's edit, meter and heal step; the --eval scores back onto the model (saved with
    it, headcount.json "tasks"). The EditReport."""
    from headcount.surgery.editing import run_edit

    meter = edit.meter(run)
    before = edit.before(model, meter, run)
    apply = None if run.unedited is not None else (lambda m: edit.apply(m, run))
    report = run_edit(model, apply, meter=meter, before=before, unedited=run.unedited,
                      check_dtype=model.embed.weight.dtype, what=edit.what, heal=edit.healer(run))
    if run.specs:
        model.task_scores = report.tasks()
    return report


# ------------------------------------------------------------------------------------------- the table
def account_rows(data: dict, heads: str = "query heads") -> list:
    """Before/after rows of the accounts: heads, KV heads, parameters, KV-cache bytes per token."""
    return [(heads, data["heads_before"], data["heads_after"]),
            ("KV heads", data["kv_heads_before"], data["kv_heads_after"]),
            ("parameters", data["params_before"], data["params_after"]),
            ("KV cache bytes / token", data["kv_bytes_per_token_before"], data["kv_bytes_per_token_after"])]


def quality_rows(data: dict, source: str) -> list:
    """Before/after rows of the held-out quality: every domain, or the one perplexity, or an encoder's cosine."""
    from headcount.surgery.cli_common import domain_rows

    if data.get("ppl_by_domain_before"):
        return domain_rows(data["ppl_by_domain_before"], data["ppl_by_domain_after"])
    if data.get("ppl_before") is not None:
        return [(f"held-out perplexity ({source})", data["ppl_before"], data["ppl_after"])]
    return [("held-out embedding cosine", 1.0, data["fidelity_after"]["cosine"])]


def heal_table(data: dict, title: str) -> None:
    """The healing block's table when the edit was healed (--heal-steps)."""
    if data.get("heal"):
        from headcount.surgery.healing.heal_steps import print_heal_table

        print_heal_table(data["heal"], title)
