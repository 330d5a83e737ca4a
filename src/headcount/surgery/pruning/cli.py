"""`headcount prune` (one pruned model, or --curve). Registered through headcount.surgery.cli; shared helpers
in surgery/cli_common.py; no torch import at module level. Bad input: one line on stderr, exit 2,
nothing written (every check runs before the model is loaded or the output directory is touched; the
checks that need the model, such as --method l0's gate target and whether the gates reached it, run
before anything is saved).

--method retraining-free (the default): heads chosen by --order on the unpruned model. --method l0: heads
chosen by trained hard-concrete gates (headcount.surgery.train_gates, --steps, --lr); the JSON's
`method` key says which, and for l0 `prune.gates` holds the GateResult. --joint (with --method l0): the
model's weights (--joint-params) train with the gates (Voita's setup, pruning/gates_joint.py) and the closed
heads are removed from the trained model as it is (--compensate none, its default there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from headcount.models.options import DEVICE_HELP, DTYPE_HELP, MODEL_HELP
from headcount.surgery.pruning.gates_joint import JOINT_STEPS  # --joint's default steps

PRUNE_JSON_KEYS = ("heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
                   "kv_bytes_per_token_after", "ppl_before", "ppl_after")
METHODS = ("retraining-free", "l0")
L0_STEPS = 150  # --method l0's default: about 15 minutes for smollm2 on 2 cores (windows of 256, batches of 2)
L0_LR = 0.1


def register(app, bench_app) -> None:
    """Add `headcount prune`."""
    from headcount.cli_errors import rank_errors as _one_line_errors  # rank-prefixed under torchrun
    from headcount.surgery.cli_common import (EVAL_HELP, before_after_table, calibration_and_held_out, check_out_dir,
                                              domain_rows, task_rows)

    @app.command("prune")
    def prune_cmd(
        model: str = typer.Option("smollm2", "--model", "-m", help=MODEL_HELP),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        fraction: Optional[float] = typer.Option(None, "--fraction", help="share of query heads to remove, in (0, 1)"),
        mode: str = typer.Option("query", "--mode", help="query (any heads) or group (whole GQA groups)"),
        compensate: Optional[str] = typer.Option(None, "--compensate", help="none, mean or lstsq (default lstsq; "
                                                 "with --joint none, the only choice)"),
        order: str = typer.Option("reconstruction", "--order",
                                  help="importance method (gradient, ablation, confidence, reconstruction) or random"),
        uniform: bool = typer.Option(False, "--uniform", help="same number from every layer (and GQA group)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory to save the pruned model to"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
        text: Optional[Path] = typer.Option(None, "--text", help="UTF-8 text: its paragraphs are split into "
                                            "calibration and held-out parts (default: the default corpus)"),
        curve: bool = typer.Option(False, "--curve", help="the pruning curve instead of one pruned model"),
        png: Optional[Path] = typer.Option(None, "--png", help="with --curve: write a plot"),
        seed: int = typer.Option(0, "--seed", help="seed of --order random"),
        calibration_windows: int = typer.Option(8, "--calibration-windows", help="calibration windows of 512 tokens "
                                                 "(default corpus: half prose, half code-like text)"),
        eval_windows: int = typer.Option(4, "--eval-windows", help="held-out windows of 512 tokens measured per domain "
                                         "(encoders: 16 sentences per window)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
        method: str = typer.Option("retraining-free", "--method", help="retraining-free (heads chosen by --order) "
                                   "or l0 (trained hard-concrete gates choose them; --steps, --lr)"),
        steps: Optional[int] = typer.Option(None, "--steps", help=f"--method l0: gate training steps (default "
                                            f"{L0_STEPS}; with --joint {JOINT_STEPS})"),
        lr: Optional[float] = typer.Option(None, "--lr", help=f"--method l0: the gates' learning rate (default {L0_LR})"),
        joint: bool = typer.Option(False, "--joint", help="--method l0: train the model's weights WITH the gates "
                                   "(distillation from the unedited model), then remove the closed heads"),
        joint_params: Optional[str] = typer.Option(None, "--joint-params", help="with --joint: the weights that train "
                                                   "(attention, the default: q/k/v/o and their norms; or all)"),
        heal_steps: int = typer.Option(0, "--heal-steps", help="heal the pruned model: distillation steps from the "
                                       "unpruned one (headcount heal; 0 = none)"),
        evals: Optional[list[str]] = typer.Option(None, "--eval", help=EVAL_HELP),
    ) -> None:
        """Remove attention heads (retraining-free order, or trained L0 gates; with compensation); print
        before/after and save. --force also prunes when the L0 gates missed their target."""
        with _one_line_errors("prune"):
            compensate = _check_joint(method, joint, joint_params, compensate)
            for name, value, allowed in (("--mode", mode, ("query", "group")),
                                         ("--compensate", compensate, ("none", "mean", "lstsq")),
                                         ("--method", method, METHODS)):
                if value not in allowed:
                    raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
            if calibration_windows < 1 or eval_windows < 1:
                raise ValueError("--calibration-windows, --eval-windows: expected positive numbers")
            from headcount.surgery.healing.cli import check_heal_steps
            check_heal_steps(heal_steps)
            from headcount.surgery.cli_common import task_specs
            specs = task_specs(evals)
            if specs and curve:
                raise ValueError("--eval: judges one edit; --curve measures many (drop one of them)")
            if method == "l0":
                steps = (JOINT_STEPS if joint else L0_STEPS) if steps is None else steps
                if steps < 1:
                    raise ValueError(f"--steps: --method l0 trains gates for at least 1 step, got {steps}")
                lr = L0_LR if lr is None else lr
                if not lr > 0:
                    raise ValueError(f"--lr: expected a positive learning rate, got {lr}")
                if curve:
                    raise ValueError("--method: --curve compares retraining-free orders; use --method l0 without "
                                     "--curve (or `headcount bench surgery --part gates`)")
            elif steps is not None or lr is not None:
                raise ValueError(f"--{'steps' if steps is not None else 'lr'}: only with --method l0 (gate training)")
            if curve:
                if png is not None:
                    from headcount.paths import check_png
                    check_png(png)
                _curve(model, text, mode, uniform, png, json_out, calibration_windows, eval_windows)
                return
            if fraction is None or not 0 < fraction < 1:
                raise ValueError(f"--fraction: expected a number in (0, 1), got {fraction}")
            from headcount.models.options import parse_device, parse_dtype
            parse_dtype(dtype), parse_device(device)
            out = check_out_dir(out, force)
            cal, held, source = calibration_and_held_out(text)
            from headcount.surgery.task_scores import check_not_calibrated_on
            check_not_calibrated_on(specs, cal)
            result = _prune_one(model, fraction, mode, compensate, order, uniform, out, force, cal, held, seed,
                                calibration_windows, eval_windows, method, steps, lr, dtype, device,
                                (joint_params or "attention") if joint else None, heal_steps, specs)
        if result is None:  # a rank other than 0 under torchrun: rank 0 prints and writes
            return
        from headcount.surgery.cli_common import command_line
        result["command"] = command_line()  # what produced this result (a saved --json is keyed and quoted by it)
        scores = result.get("tasks") or {}
        if json_out:
            typer.echo(json.dumps(result, indent=2))
            return
        before, after = result["ppl_before"], result["ppl_after"]
        rows = [("query heads", result["heads_before"], result["heads_after"]),
                ("KV heads", result["kv_heads_before"], result["kv_heads_after"]),
                ("parameters", result["params_before"], result["params_after"]),
                ("KV cache bytes / token", result["kv_bytes_per_token_before"], result["kv_bytes_per_token_after"])]
        if result.get("ppl_by_domain_before"):
            rows += domain_rows(result["ppl_by_domain_before"], result["ppl_by_domain_after"])
        elif before is not None:
            rows.append((f"held-out perplexity ({source})", before, after))
        else:
            rows.append(("held-out embedding cosine", 1.0, result["fidelity_after"]["cosine"]))
        how = (f"L0 gates{' trained with the ' + joint_params_of(result) if joint else ''}, {steps} steps"
               if method == "l0" else f"order {result['prune']['order']}")
        before_after_table(rows, f"{model}: {result['prune']['heads_removed']} heads removed ({mode} mode, {how}, "
                                 f"compensate {compensate})")
        if scores:
            before_after_table(task_rows(scores), f"{model}: task scores")
        if method == "l0":
            g = result["prune"]["gates"]
            typer.echo(f"gates: expected L0 {g['final_expected_l0']:.1f} (target {g['heads_to_keep']}); removed "
                       f"{g['n_removed_closed']} closed + {g['n_removed_ranked']} by rank; "
                       f"{g['forward_equivalents']:.0f} forward-pass equivalents, {g['seconds']:.0f} s")
        if result.get("heal"):
            from headcount.surgery.healing.cli import print_heal_table
            print_heal_table(result["heal"], f"{model}: healed after pruning")
        typer.echo(f"saved to {out} (headcount.models.load / --model {out})")
        if mode == "query" and not uniform and result["kv_heads_before"] < result["heads_before"]:
            typer.echo("note: query mode leaves uneven GQA groups, which a GGUF export writes with copied KV heads "
                       "(a larger llama.cpp cache); --mode group or --uniform keep an export compact")

    def _prune_one(model_name, fraction, mode, compensate, order, uniform, out, force, cal, held, seed,
                   calibration_windows, eval_windows, method="retraining-free", steps=None, lr=None, dtype="fp32",
                   device="cpu", joint_params=None, heal_steps=0, evals=None) -> dict | None:
        import os
        import time

        from headcount.models.options import check_finite, load_model
        from headcount.surgery import prune_to, save

        group, main = None, True
        if "WORLD_SIZE" in os.environ:  # under torchrun: the calibration windows are split over the ranks
            if method == "l0":
                raise ValueError("--method: l0 trains gates in one process; run it without torchrun")
            from headcount import distributed
            group = distributed.init()
            main = distributed.is_main(group)
        start = time.perf_counter()
        model = load_model(model_name, dtype, device)
        from headcount.surgery.cli_common import check_eval_model, quality_meter
        check_eval_model(evals, model)
        from headcount.surgery.editing import run_edit
        from headcount.surgery.healing.cli import healer, teacher_for
        # the unpruned model, before any change (--joint trains norms too, in place: it needs a full copy)
        teacher = teacher_for(model, heal_steps, dtype, deep=bool(joint_params))
        meter = quality_meter(held, eval_windows, evals)
        before = None
        if joint_params:  # joint training changes the model: measure the unedited one first
            _l0_target(model, fraction, mode)
            before = meter.measure(model)

        def edit(model):
            gates = _train_l0(model, fraction, mode, cal, steps, lr, force, joint_params) if method == "l0" else None
            if gates is not None:  # the gates keep exactly their target (or refuse it, naming --fraction)
                from headcount.surgery import apply_gates
                return apply_gates(model, gates, compensate=compensate, calibration=cal, force=True,
                                   calibration_windows=calibration_windows)
            _say_plan(model, fraction, mode, uniform, main)
            return prune_to(model, fraction, order=order, mode=mode, compensate=compensate, uniform=uniform,
                            calibration=cal, seed=seed, calibration_windows=calibration_windows, group=group)

        report = run_edit(model, edit, meter=meter, before=before, check_dtype=model.embed.weight.dtype,
                          what="the pruned model's held-out quality",
                          heal=healer(teacher, heal_steps, eval_windows=eval_windows, group=group, calibration=cal,
                                      held_out=held))
        if evals:
            model.task_scores = report.tasks()  # saved with the model (headcount.json "tasks")
        if not main:
            return None
        save(model, out, force=force)
        result = report.edit
        data = report.to_json()
        data["fraction_removed"] = round((data["heads_before"] - data["heads_after"]) / data["heads_before"], 4)
        data["forward_equivalents"] = round(result["forward_equivalents"], 2)
        data["seconds"] = round(time.perf_counter() - start, 1)
        data["out"] = str(out)
        data["method"] = result.get("method") or method
        data["prune"] = result
        return data

    def _say_plan(model, fraction, mode, uniform, main) -> None:
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

    def _train_l0(model, fraction, mode, cal, steps, lr, force, joint_params=None):
        """Train the gates (every check first, naming the flag); refuse a missed target unless --force."""
        from headcount.surgery.pruning.gates import REACH_TOLERANCE, train_gates

        unit = _l0_target(model, fraction, mode)
        joint = {"joint": True, "params": joint_params} if joint_params else {}
        gates = train_gates(model, fraction=fraction, steps=steps, lr=lr, calibration=cal, mode=mode, **joint)
        if not gates.reached and not force:
            raise ValueError(f"--steps: the L0 target is unreachable in {steps} steps: the gates' expected L0 ended at "
                             f"{gates.final_expected_l0:.1f} open {unit}, target {gates.heads_to_keep} of "
                             f"{gates.n_gates} (more than {REACH_TOLERANCE:.0%} off); nothing written. Give more "
                             "--steps or a larger --lr, or --force to prune by the gates' ranking anyway")
        return gates

    def _l0_target(model, fraction, mode) -> str:
        """Check the gates' target (naming --fraction); the gates' unit."""
        from headcount.surgery.pruning.gates import gate_count, resolve_target

        unit = "query heads" if mode == "query" else "KV groups"
        try:
            resolve_target(*gate_count(model, mode), fraction=fraction, unit=unit)
        except ValueError as e:
            raise ValueError(f"--{e}") from None
        return unit

    def joint_params_of(result) -> str:
        return f"model's {result['prune']['gates'].get('params')} weights"

    def _check_joint(method, joint, joint_params, compensate) -> str:
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

    def _curve(model_name, text, mode, uniform, png, json_out, calibration_windows, eval_windows) -> None:
        from headcount.models import load
        from headcount.surgery import pruning_curve

        cal, held, _ = calibration_and_held_out(text)
        model = load(model_name)
        curve = pruning_curve(model, mode=mode, uniform=uniform, calibration=cal, held_out=held,
                              calibration_windows=calibration_windows, eval_windows=eval_windows,
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
