"""`headcount merge-kv`. Registered through headcount.surgery.cli; no torch import at module level.

    headcount merge-kv --model smollm2 --kv-heads 1 [--method aware|mean] [--layers 0,5,7]
                       [--local-steps N] [--local-tokens N] [--uptrain-steps N] [--out DIR [--force]] [--json]

Prints a before/after table (KV and query heads, parameters, KV-cache bytes per token from
KVCache.nbytes, held-out perplexity, or embedding fidelity for an encoder) and, with --json, the keys
heads_before, heads_after (KV heads summed over layers), params_before, params_after,
kv_bytes_per_token_before, kv_bytes_per_token_after, ppl_before, ppl_after (null for an encoder).
Bad input (a KV-head count of 0, above the current count or one the method cannot reach, a layer out
of range, an existing --out without --force) is one line on stderr and exit status 2, before
anything is loaded or written where possible, and always before any weight changes.

Under torchrun (`torchrun --nproc-per-node N -m headcount merge-kv ...`) the calibration windows
are split over the ranks and the merge's sums all-reduced (merge_kv(group=)): every rank computes the same
merged model; rank 0 alone prints and writes --out, at the end. Errors are one line prefixed with the rank;
a rank that dies makes the others' next collective fail within --timeout, one line each, nothing written.
More ranks than calibration windows: exit 2 before loading. The uptrain is not split over the ranks: each runs
the same steps on the same windows (what one process does), so its seconds are not divided by the ranks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from headcount.models.options import DEVICE_HELP, DTYPE_HELP, MODEL_HELP
from headcount.surgery.cli_common import EVAL_HELP

JSON_KEYS = ("heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
             "kv_bytes_per_token_after", "ppl_before", "ppl_after")


# The defaults a user runs are merge_kv's own (one truth; surgery/merging/kv_merge.py has them and why):
# this command calls merge_kv with its flags and nothing else: `headcount merge-kv --kv-heads 1` is merge_kv(model, 1).
from headcount.surgery.merging.defaults import (CALIBRATION_WINDOWS, LOCAL_STEPS, UPTRAIN_LR,  # noqa: E402,F401
                                                UPTRAIN_STEPS, UPTRAIN_WINDOW, uptrain_windows)

# 0 = whole windows (merge_kv's None); 256 (the first half, refine.causal_prefix) is faster but lost on held-out prose
LOCAL_TOKENS = 0
EVAL_WINDOWS = 4


def parse_layers(text: Optional[str]) -> Optional[list[int]]:
    """'0,5,7' -> [0, 5, 7]; None -> None (every layer)."""
    if text is None:
        return None
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--layers: expected comma-separated layer indices such as 0,5,7, got {text!r}") from None
    if not layers:
        raise ValueError(f"--layers: expected at least one layer index, got {text!r}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"--layers: duplicate layer indices in {text!r}")
    if any(i < 0 for i in layers):
        raise ValueError(f"--layers: expected indices >= 0, got {text!r}")
    return layers


def _torchrun_world() -> int:
    """WORLD_SIZE under torchrun (1 without it), read without importing torch."""
    from headcount.distributed import env_world_size
    return env_world_size()


def run_merge(model_name: str, kv_heads: int, *, method: str = "aware", layers=None,
              uptrain_steps: Optional[int] = None, uptrain_lr: Optional[float] = None, out: Optional[Path] = None,
              force: bool = False, text: Optional[Path] = None,
              calibration_windows: int = CALIBRATION_WINDOWS, eval_windows: int = EVAL_WINDOWS,
              local_steps: int = LOCAL_STEPS, local_tokens: Optional[int] = LOCAL_TOKENS, dtype: str = "fp32",
              device: str = "cpu", group=None, main: bool = True, heal_steps: int = 0, evals=None) -> dict | None:
    """Load, validate, measure, merge, (uptrain), measure, save: the command's work, as data.

    uptrain_steps: None = UPTRAIN_STEPS for an aware merge of a decoder, 0 otherwise. The uptrain distils from
    the unmerged model on the merge's own calibration windows (decoders: cut into UPTRAIN_WINDOW-token pieces).

    group: a process group to split the calibration over (torchrun); only `main` (rank 0) saves, and the
    other ranks return None. The uptrain is not split: every rank runs the same one (one process's steps).
    evals: surgery.task_scores.TaskSpec list of --eval (pass@1 before the merge, after it and after healing)."""
    from headcount.models.options import load_model
    from headcount.surgery.cli_common import calibration_and_held_out, quality_meter
    from headcount.surgery.merging.kv_merge import _targets, merge_kv

    specs = list(evals or ())
    calibration, held_out, source = calibration_and_held_out(text)
    if specs:
        from headcount.surgery.task_scores import check_not_calibrated_on
        check_not_calibrated_on(specs, calibration)
    model = load_model(model_name, dtype, device)
    _targets(model, kv_heads, layers, method)  # every check before any measurement or change
    from headcount.surgery.cli_common import check_eval_model
    check_eval_model(specs, model)
    from headcount.surgery.editing import run_edit
    from headcount.surgery.healing.cli import healer, teacher_for

    teacher = teacher_for(model, heal_steps, dtype)

    def edit(model):
        # merge_kv's own defaults for everything not given as a flag (the uptrain included): one truth
        return merge_kv(model, kv_heads, layers=layers, method=method, calibration=calibration,
                        n_windows=calibration_windows, local_steps=local_steps, local_tokens=local_tokens or None,
                        uptrain_steps=uptrain_steps, uptrain_lr=uptrain_lr, group=group, progress=main)

    # every rank heals the same way (one process's steps), as the uptrain
    report = run_edit(model, edit, meter=quality_meter(held_out, eval_windows, specs),
                      check_dtype=model.embed.weight.dtype, what="the merged model's held-out quality",
                      heal=healer(teacher, heal_steps, progress=main, eval_windows=eval_windows,
                                  calibration=calibration, held_out=held_out))
    if specs:
        model.task_scores = report.tasks()  # saved with the model (headcount.json "tasks")
    if not main:  # another rank under torchrun: rank 0 writes and prints
        return None
    if out is not None:
        from headcount.surgery import save
        save(model, out, force=force)
    merged = report.edit
    data = report.to_json()
    # merge-kv's heads_* count KV heads (what the merge changes); the query heads stay as they were
    q_heads = data["heads_before"]
    data["heads_before"], data["heads_after"] = data["kv_heads_before"], data["kv_heads_after"]
    data |= {"forward_equivalents": round(merged["forward_equivalents"], 2), "seconds": round(merged["seconds"], 1),
             "method": method, "merge_options": merged.get("options"),
             "uptrain": ({k: merged["uptrain"].get(k) for k in ("steps", "lr", "tokens", "objective", "loss_first",
                                                                  "loss_last")} if merged.get("uptrain") else None)}
    extra = {"query_heads": q_heads, "source": source, "merge": merged, "uptrain": merged.get("uptrain"),
             "out": str(out) if out else None, "fidelity_after": data.get("fidelity_after")}
    return {"json": data, "extra": extra}


def register(app, bench_app) -> None:
    """Add `headcount merge-kv`."""
    from headcount.cli_errors import rank_errors as _one_line_errors  # rank-prefixed under torchrun

    @app.command("merge-kv")
    def merge_kv_cmd(
        model: str = typer.Option("smollm2", "--model", "-m", help=MODEL_HELP),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        kv_heads: int = typer.Option(..., "--kv-heads", help="KV heads per merged layer (1 = MQA)"),
        method: str = typer.Option("aware", "--method", help="aware (activation-aware, rotary-respecting) or mean "
                                   "(GQA paper mean-pooling; needs a divisor of the current count)"),
        layers: Optional[str] = typer.Option(None, "--layers", help="comma-separated layers to merge (default all)"),
        uptrain_steps: Optional[int] = typer.Option(None, "--uptrain-steps", help="fine-tune steps on the "
                                                    "calibration windows after merging, distilled from the "
                                                    f"unmerged model (default: {UPTRAIN_STEPS} for an aware merge "
                                                    "of a decoder, else 0)"),
        uptrain_lr: Optional[float] = typer.Option(None, "--uptrain-lr", help="peak learning rate of "
                                                   f"--uptrain-steps (default {UPTRAIN_LR:g}, scaled down like heal's "
                                                   "for a model with small attention weights)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory to save the merged model to"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
        text: Optional[Path] = typer.Option(None, "--text", help="UTF-8 text split into calibration and held-out "
                                            "paragraphs (default: the default corpus)"),
        local_steps: int = typer.Option(LOCAL_STEPS, "--local-steps", help="aware: Adam steps per merged layer "
                                        "reproducing its own output, one calibration window a step (block-wise "
                                        "reconstruction; 0 = the closed form alone)"),
        local_tokens: int = typer.Option(LOCAL_TOKENS, "--local-tokens", help="aware: tokens of its window each "
                                         "local step fits, the first ones (exact for a causal layer; 0 = the "
                                         "whole window)"),
        calibration_windows: int = typer.Option(CALIBRATION_WINDOWS, "--calibration-windows",
                                                help="calibration windows of 512 tokens (default corpus: half "
                                                "prose, half code-like text)"),
        eval_windows: int = typer.Option(EVAL_WINDOWS, "--eval-windows", help="held-out windows of 512 tokens "
                                         "measured per domain"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
        heal_steps: int = typer.Option(0, "--heal-steps", help="heal the merged model: distillation steps from the "
                                       "unmerged one (headcount heal; 0 = none)"),
        timeout: float = typer.Option(120.0, "--timeout", help="under torchrun: seconds a collective waits for "
                                      "the other ranks before this rank gives up"),
        evals: Optional[list[str]] = typer.Option(None, "--eval", help=EVAL_HELP),
    ) -> None:
        """Merge K/V heads (MHA -> GQA -> MQA); print before/after and optionally save.

        Under torchrun the calibration windows are split over the ranks (rank 0 prints and saves)."""
        with _one_line_errors("merge-kv"):
            if kv_heads < 1:
                raise ValueError(f"--kv-heads: expected a positive number of KV heads, got {kv_heads}")
            if method not in ("aware", "mean"):
                raise ValueError(f"--method: expected aware or mean, got {method!r}")
            if local_steps < 0:
                raise ValueError(f"--local-steps: expected a number >= 0, got {local_steps}")
            if local_tokens < 0:
                raise ValueError(f"--local-tokens: expected a number of tokens >= 0 (0 = the whole window), "
                                 f"got {local_tokens}")
            from headcount.surgery.healing.cli import check_heal_steps
            check_heal_steps(heal_steps)
            if uptrain_steps is not None and uptrain_steps < 0:
                raise ValueError(f"--uptrain-steps: expected a number >= 0, got {uptrain_steps}")
            if uptrain_lr is not None and not uptrain_lr > 0:
                raise ValueError(f"--uptrain-lr: expected a positive number, got {uptrain_lr}")
            if calibration_windows < 1 or eval_windows < 1:
                raise ValueError("--calibration-windows, --eval-windows: expected positive numbers")
            layer_list = parse_layers(layers)
            from headcount.surgery.cli_common import task_specs
            specs = task_specs(evals)
            if not timeout > 0:
                raise ValueError(f"--timeout: expected a positive number of seconds, got {timeout}")
            world = _torchrun_world()
            if world > 1:
                if method == "aware" and calibration_windows < world:
                    raise ValueError(f"--calibration-windows: torchrun started {world} ranks but only "
                                     f"{calibration_windows} calibration windows; expected at least one window per "
                                     f"rank (--calibration-windows >= {world})")
            if out is not None:
                from headcount.surgery.cli_common import check_out_dir
                out = check_out_dir(out, force)
            group, main = None, True
            if world > 1 or "WORLD_SIZE" in os.environ:
                from headcount import distributed
                group = distributed.init(timeout_s=timeout)
                main = distributed.is_main(group)
            result = run_merge(model, kv_heads, method=method, layers=layer_list, uptrain_steps=uptrain_steps,
                               uptrain_lr=uptrain_lr, out=out, force=force, text=text,
                               calibration_windows=calibration_windows, eval_windows=eval_windows,
                               local_steps=local_steps, local_tokens=local_tokens, dtype=dtype, device=device,
                               group=group, main=main, heal_steps=heal_steps, evals=specs)
        if result is None:  # a rank other than 0
            return
        data, extra = result["json"], result["extra"]
        from headcount.surgery.cli_common import command_line
        data["command"] = command_line()  # what produced this result (a saved --json is keyed and quoted by it)
        if json_out:
            typer.echo(json.dumps(data, indent=2))
            return
        from headcount.surgery.cli_common import before_after_table

        rows = [("KV heads (all layers)", data["heads_before"], data["heads_after"]),
                ("query heads (all layers)", extra["query_heads"], extra["query_heads"]),
                ("parameters", data["params_before"], data["params_after"]),
                ("KV cache bytes / token", data["kv_bytes_per_token_before"], data["kv_bytes_per_token_after"])]
        if data["ppl_by_domain_before"]:
            from headcount.surgery.cli_common import domain_rows
            rows += domain_rows(data["ppl_by_domain_before"], data["ppl_by_domain_after"])
        elif data["ppl_before"] is not None:
            rows.append((f"held-out perplexity ({extra['source']})", data["ppl_before"], data["ppl_after"]))
        else:
            rows.append(("held-out embedding cosine", 1.0, extra["fidelity_after"]["cosine"]))
        from headcount.surgery.cli_common import task_rows
        rows += task_rows(data.get("tasks") or {})
        merged = extra["merge"]
        before_after_table(rows, f"{model}: K/V heads merged to {kv_heads} ({method}) in "
                     f"{len(merged['layers'])} layer(s)")
        if extra["uptrain"] is not None:
            u = extra["uptrain"]
            typer.echo(f"uptrain: {u['steps']} steps, {u['objective']} {u['loss_first']:.4f} -> {u['loss_last']:.4f}")
        if data.get("heal"):
            from headcount.surgery.healing.cli import print_heal_table
            print_heal_table(data["heal"], f"{model}: healed after merging")
        if out is not None:
            typer.echo(f"saved to {out} (headcount.models.load / --model {out})")
