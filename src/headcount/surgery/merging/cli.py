"""`headcount merge-kv`, on the edit commands' skeleton (surgery/command.py): what this module adds is merge-kv's
options (MergeSettings), their checks and the edit (`MergeKV`: merge_kv with the flags given and nothing else).
Registered through headcount.surgery.cli; no torch import at module level.

    headcount merge-kv --model smollm2 --kv-heads 1 [--method aware|mean] [--layers 0,5,7]
                       [--local-steps N] [--local-tokens N] [--uptrain-steps N] [--out DIR [--force]] [--json]
    headcount merge-kv --model smollm2 --budget 0.75 | 12KiB [--sensitivity loss|kl] [--allow-drop]
                       (the layers merge_plan chooses for a KV budget; its sensitivity table measured once per
                       model and kept under $HEADCOUNT_CACHE/merge-sensitivity; --allow-drop: the plan may also
                       drop a layer's whole attention where that costs less than merging its heads)

Prints a before/after table (KV and query heads, parameters, KV-cache bytes per token from
KVCache.nbytes, held-out perplexity, or embedding fidelity for an encoder) and, with --json, the edit
commands' one schema (EditReport.to_json); here heads_before and heads_after count KV heads (summed over layers),
what the merge changes. Bad input (a KV-head count of 0, above the current count or one the method cannot reach,
a layer out of range, an existing --out without --force) is one line on stderr and exit status 2, before
anything is loaded or written where possible, and always before any weight changes.

Under torchrun (`torchrun --nproc-per-node N -m headcount merge-kv ...`) the calibration windows
are split over the ranks and the merge's sums all-reduced (merge_kv(group=)): every rank computes the same
merged model; rank 0 alone prints and writes --out, at the end. Errors are one line prefixed with the rank;
a rank that dies makes the others' next collective fail within --timeout, one line each, nothing written.
More ranks than calibration windows: exit 2 before loading. The uptrain is not split over the ranks: each runs
the same steps on the same windows (what one process does), so its seconds are not divided by the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from headcount.cli_options import (CalibrationWindowsOpt, DeviceOpt, DtypeOpt, EvalOpt, EvalWindowsOpt, ForceOpt,
                                   HealStepsOpt, JsonOpt, KVHeadsOpt, LayersOpt, LocalStepsOpt, LocalTokensOpt,
                                   MergeMethodOpt, ModelOpt, OutOpt, SensitivityOpt, TextOpt, TimeoutOpt)
from headcount.surgery.command import Edit, EditOptions, account_rows, heal_table, quality_rows, register_edit
from headcount.surgery.healing.heal_steps import HealCalibrationOpt
from headcount.surgery.merging import uptraining
# The defaults a user runs are merge_kv's own (one truth; surgery/merging/kv_merge.py has them and why):
# this command calls merge_kv with its flags and nothing else: `headcount merge-kv --kv-heads 1` is merge_kv(model, 1).
from headcount.surgery.merging.defaults import (CALIBRATION_WINDOWS, LOCAL_STEPS, UPTRAIN_LR,  # noqa: F401
                                                UPTRAIN_STEPS, UPTRAIN_WINDOW, uptrain_windows)

JSON_KEYS = ("heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
             "kv_bytes_per_token_after", "ppl_before", "ppl_after")

# 0 = whole windows (merge_kv's None); 256 (the first half, refine.causal_prefix) is faster but lost on held-out prose
LOCAL_TOKENS = 0
EVAL_WINDOWS = 4

UptrainStepsOpt = Annotated[Optional[int], typer.Option(
    "--uptrain-steps", help="fine-tune steps on the calibration windows after merging, distilled from the unmerged "
                            f"model (default: {UPTRAIN_STEPS} for an aware merge of a decoder, else 0)")]
BudgetOpt = Annotated[Optional[str], typer.Option(
    "--budget", help="instead of --kv-heads: the KV cache to keep, a fraction of the KV bytes per token (0.75) or "
                     "bytes per token (12KiB); merge_plan chooses the layers and their K/V heads")]
AllowDropOpt = Annotated[bool, typer.Option(
    "--allow-drop", help="with --budget: the plan may also drop a layer's whole attention (no K/V cache at all, as "
                         "drop-attention) where that costs less than merging its K/V heads")]
UptrainLrOpt = Annotated[Optional[float], typer.Option(
    "--uptrain-lr", help=f"peak learning rate of --uptrain-steps (default {UPTRAIN_LR:g}, scaled down like heal's for "
                         "a model with small attention weights)")]


from headcount.surgery.cli_common import parse_layers  # noqa: E402,F401 (merge-kv's --layers, shared)


@dataclass(frozen=True)
class MergeSettings:
    """merge-kv's own options, as given."""

    kv_heads: Optional[int]  # None with --budget
    method: str = "aware"
    layers: Optional[str] = None
    uptrain_steps: Optional[int] = None
    uptrain_lr: Optional[float] = None
    local_steps: int = LOCAL_STEPS
    local_tokens: int = LOCAL_TOKENS
    calibration_windows: int = CALIBRATION_WINDOWS
    timeout: float = 120.0
    budget: Optional[str] = None  # --budget as given (surgery.merging.planner.parse_budget reads it)
    sensitivity: str = "auto"  # --budget's plan: merge_plan's `by`
    allow_drop: bool = False  # --budget's plan may drop attention sublayers (merge_plan(drops=True))

    def check(self) -> Optional[list[int]]:
        """Every flag checked (naming it) before anything is loaded; the layers to merge (None: all)."""
        if self.budget is not None:
            from headcount.surgery.merging.planner import parse_budget

            if self.kv_heads is not None or self.layers is not None:
                raise ValueError(f"--budget: merge_plan chooses the layers and their K/V heads; give --budget or "
                                 f"--kv-heads / --layers, not both (got --budget {self.budget} with "
                                 f"{'--kv-heads' if self.kv_heads is not None else '--layers'})")
            parse_budget(self.budget)
        elif self.allow_drop:
            raise ValueError("--allow-drop: lets --budget's plan drop attention sublayers; give --budget beside it")
        elif self.sensitivity != "auto":
            raise ValueError(f"--sensitivity: chooses --budget's plan; give --budget beside --sensitivity "
                             f"{self.sensitivity}")
        elif self.kv_heads is None:
            raise ValueError("--kv-heads: expected a number of KV heads per merged layer (or --budget), got none")
        elif self.kv_heads < 1:
            raise ValueError(f"--kv-heads: expected a positive number of KV heads, got {self.kv_heads}")
        if self.method not in ("aware", "mean"):
            raise ValueError(f"--method: expected aware or mean, got {self.method!r}")
        from headcount.surgery.merging.planner import check_by

        check_by(self.sensitivity, "--sensitivity")
        if self.local_steps < 0:
            raise ValueError(f"--local-steps: expected a number >= 0, got {self.local_steps}")
        if self.local_tokens < 0:
            raise ValueError(f"--local-tokens: expected a number of tokens >= 0 (0 = the whole window), "
                             f"got {self.local_tokens}")
        if self.uptrain_steps is not None and self.uptrain_steps < 0:
            raise ValueError(f"--uptrain-steps: expected a number >= 0, got {self.uptrain_steps}")
        if self.uptrain_lr is not None and not self.uptrain_lr > 0:
            raise ValueError(f"--uptrain-lr: expected a positive number, got {self.uptrain_lr}")
        if self.calibration_windows < 1:
            raise ValueError("--calibration-windows, --eval-windows: expected positive numbers")
        layers = parse_layers(self.layers)
        if not self.timeout > 0:
            raise ValueError(f"--timeout: expected a positive number of seconds, got {self.timeout}")
        return layers


def torchrun_world() -> int:
    """WORLD_SIZE under torchrun (1 without it), read without importing torch."""
    from headcount.distributed import env_world_size
    return env_world_size()


@register_edit
class MergeKV(Edit):
    """Merge K/V heads (MHA -> GQA -> MQA)."""

    name = "merge-kv"
    example = ("--kv-heads", "1", "--calibration-windows", "1", "--local-steps", "0", "--uptrain-steps", "0")
    out_required = False
    what = "the merged model's held-out quality"
    heads_counted = "kv"  # heads_before / heads_after: the KV heads, what the merge changes
    legacy_keys = ("method", "merge_options", "uptrain")

    def __init__(self, settings: MergeSettings):
        self.settings = settings
        self.layers = None

    def check(self, opts: EditOptions) -> None:
        self.layers = self.settings.check()
        world = torchrun_world()
        if world > 1 and self.settings.method == "aware" and self.settings.calibration_windows < world:
            raise ValueError(f"--calibration-windows: torchrun started {world} ranks but only "
                             f"{self.settings.calibration_windows} calibration windows; expected at least one window "
                             f"per rank (--calibration-windows >= {world})")

    def distributed(self, opts: EditOptions):
        from headcount.surgery.command import torchrun_group

        return torchrun_group(timeout_s=self.settings.timeout)

    def check_model(self, model, run) -> None:
        from headcount.surgery.merging.kv_merge import _targets

        if self.settings.budget is not None:
            from headcount.surgery.merging.planner import check_budget, parse_budget

            check_budget(model, parse_budget(self.settings.budget), flag="--budget",
                         drops=self.settings.allow_drop)  # before any measurement
            if self.settings.allow_drop and not hasattr(model, "lm_head"):
                raise ValueError(f"--allow-drop: drops a decoder's attention sublayers; {run.opts.model} is an "
                                 "encoder")
            from headcount.models.chat import has_chat_template

            if self.settings.sensitivity == "kl" and run.calibration is None and not has_chat_template(model):
                raise ValueError("--sensitivity: kl measures on the model's own chat answers and needs a chat "
                                 f"template; {run.opts.model} has none (use loss, or give --text)")
            return
        _targets(model, self.settings.kv_heads, self.layers, self.settings.method)  # before any measurement

    def apply(self, model, run):
        from headcount.surgery.merging.kv_merge import merge_kv

        s = self.settings  # merge_kv's own defaults for everything not given as a flag (the uptrain included)
        options = {"method": s.method, "calibration": run.calibration, "n_windows": s.calibration_windows,
                   "local_steps": s.local_steps, "local_tokens": s.local_tokens or None,
                   "uptrain_steps": s.uptrain_steps, "uptrain_lr": s.uptrain_lr, "group": run.group,
                   "progress": run.main}
        self.plan = None
        if s.budget is None:
            return merge_kv(model, s.kv_heads, layers=self.layers, **options)
        # the plan's sensitivity on merge_kv's own default calibration ("mixed") or --text's
        from headcount.surgery.merging.planner import apply_plan, merge_plan, parse_budget, resolve_by
        from headcount.surgery.merging.sensitivity_cache import cache_root

        by = resolve_by(model, s.sensitivity)
        chat = by == "kl" and run.calibration is None  # kl's default: the model's own chat answers
        self.plan = merge_plan(model, parse_budget(s.budget), method=s.method, by=by, progress=run.main,
                               cache=cache_root(), drops=s.allow_drop,
                               calibration=run.calibration if run.calibration is not None or chat else "mixed")
        model.merge_plan = {"budget": s.budget, **self.plan_json()}  # saved in headcount.json
        return apply_plan(model, self.plan, **options)[1]  # its drops, then merge_kv of the rest

    def healer(self, run):
        from headcount.surgery.healing.heal_steps import healer

        # every rank heals the same way (one process's steps), as the uptrain: no group
        return healer(run.teacher, run.opts.heal_steps, progress=run.main, eval_windows=run.opts.eval_windows,
                      calibration=run.calibration, held_out=run.held_out, name=run.opts.heal_calibration,
                      cache=True)

    def plan_json(self) -> dict:
        """--budget's keys: the plan {layer: n_kv_heads} (the layers that change) and its predicted loss."""
        data = {"plan": {str(k): v for k, v in sorted(self.plan.kv_heads.items())},
                "predicted_loss_increase": self.plan.predicted_loss_increase, "sensitivity": self.plan.by}
        if self.plan.drops:  # 0 in the plan: the layer's attention dropped
            data["dropped"] = self.plan.dropped
        return data

    def legacy(self, report, run) -> dict:
        self.query_heads = report.accounts_before["heads"]  # the table's row: a merge keeps every query head
        merged = report.edit
        budget = {"budget": self.settings.budget, **self.plan_json()} if getattr(self, "plan", None) else {}
        return {"method": self.settings.method, "merge_options": merged.get("options"), **budget,
                "uptrain": uptraining.summary(merged.get("uptrain"))}

    def table(self, data: dict, run) -> None:
        print_merge(data, self.settings, run, self.query_heads)


def print_merge(data: dict, s: MergeSettings, run, queries: int) -> None:
    """merge-kv's before/after table, the uptrain's line, the healing table."""
    from headcount.surgery.cli_common import before_after_table, task_rows

    model, merged = run.opts.model, data["edit"]
    rows = account_rows(data, "KV heads (all layers)")
    rows[1] = ("query heads (all layers)", queries, queries)
    rows += quality_rows(data, run.source) + task_rows(data.get("tasks") or {})
    to = f"budget {s.budget}" if s.budget is not None else s.kv_heads
    dropped = f", attention dropped in {len(data['dropped'])}" if data.get("dropped") else ""
    before_after_table(rows, f"{model}: K/V heads merged to {to} ({s.method}) in {len(merged['layers'])} "
                             f"layer(s){dropped}")
    if merged.get("uptrain"):
        typer.echo(uptraining.describe(merged["uptrain"]))
    heal_table(data, f"{model}: healed after merging")


def merge_kv_cmd(
    model: ModelOpt = "smollm2",
    dtype: DtypeOpt = "fp32",
    device: DeviceOpt = "cpu",
    kv_heads: KVHeadsOpt = None,
    budget: BudgetOpt = None,
    sensitivity: SensitivityOpt = "auto",
    allow_drop: AllowDropOpt = False,
    method: MergeMethodOpt = "aware",
    layers: LayersOpt = None,
    uptrain_steps: UptrainStepsOpt = None,
    uptrain_lr: UptrainLrOpt = None,
    out: OutOpt = None,
    force: ForceOpt = False,
    text: TextOpt = None,
    local_steps: LocalStepsOpt = LOCAL_STEPS,
    local_tokens: LocalTokensOpt = LOCAL_TOKENS,
    calibration_windows: CalibrationWindowsOpt = CALIBRATION_WINDOWS,
    eval_windows: EvalWindowsOpt = EVAL_WINDOWS,
    json_out: JsonOpt = False,
    heal_steps: HealStepsOpt = 0,
    heal_calibration: HealCalibrationOpt = "mixed",
    timeout: TimeoutOpt = 120.0,
    evals: EvalOpt = None,
) -> None:
    """Merge K/V heads (MHA -> GQA -> MQA); print before/after and optionally save.

    Under torchrun the calibration windows are split over the ranks (rank 0 prints and saves)."""
    from headcount.surgery.command import run_command

    opts = EditOptions(model=model, dtype=dtype, device=device, out=out, force=force, text=text,
                       evals=tuple(evals or ()), eval_windows=eval_windows, heal_steps=heal_steps, json_out=json_out,
                       heal_calibration=heal_calibration)
    settings = MergeSettings(kv_heads=kv_heads, method=method, layers=layers, uptrain_steps=uptrain_steps,
                             uptrain_lr=uptrain_lr, local_steps=local_steps, local_tokens=local_tokens,
                             calibration_windows=calibration_windows, timeout=timeout, budget=budget,
                             sensitivity=sensitivity, allow_drop=allow_drop)
    run_command(MergeKV(settings), opts)


def register(app, bench_app) -> None:  # noqa: ARG001
    """Add `headcount merge-kv`."""
    app.command("merge-kv")(merge_kv_cmd)
