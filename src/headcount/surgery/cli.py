"""Commands of headcount.surgery: prune, export (--to transformers | gguf | gguf-f16), bench surgery (here) and
merge-kv (merge_cli.py).

Registered by headcount.cli; no torch import at module level. Bad input: one line on stderr, exit 2,
nothing written (every check runs before the model is loaded or the output directory is touched).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

PRUNE_JSON_KEYS = ("heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
                   "kv_bytes_per_token_after", "ppl_before", "ppl_after")


def check_out_dir(out: Optional[Path], force: bool, flag: str = "--out") -> Path:
    if out is None:
        raise ValueError(f"{flag}: expected a directory to write the result to")
    if out.exists() and not force:
        raise ValueError(f"{flag}: {out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag}: {out} exists and is not a directory")
    return out


EXPORT_TARGETS = ("transformers", "gguf", "gguf-f16")


def calibration_and_held_out(text: Optional[Path]):
    """(calibration texts or None, held-out texts or None, source name) from --text FILE."""
    if text is None:
        return None, None, "default corpus"
    from headcount.data import corpus_from_text, read_text

    corpus = corpus_from_text(read_text(text), name=text.name)
    if not corpus.calibration or not corpus.held_out:
        raise ValueError(f"--text: {text} needs at least two paragraphs (blank-line separated): one to calibrate on, "
                         "one held out to measure on")
    return corpus.texts("calibration"), corpus.texts("held_out"), str(text)


def held_out_quality(model, held_out, eval_windows: int, window: int, reference=None):
    """Held-out perplexity (decoder) or (fidelity cosine, reference embeddings) for an encoder."""
    from headcount.surgery.curve import embed, evaluate, held_out_sets

    sets = held_out_sets(model, held_out, eval_windows, window, sentences=16 * eval_windows)
    if hasattr(model, "lm_head"):
        return next(iter(evaluate(model, sets).values())), None
    name = next(iter(sets))
    if reference is None:
        reference = embed(model, sets[name])
    return evaluate(model, sets, {name: reference})[name], reference


def before_after_table(rows: list[tuple[str, object, object]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("", "before", "after", "change"):
        table.add_column(col, justify="right" if col else "left")
    for name, before, after in rows:
        if isinstance(before, float) or isinstance(after, float):
            change = f"{(after / before - 1) * 100:+.1f}%" if before and after is not None else ""
            table.add_row(name, f"{before:.3f}", f"{after:.3f}", change)
        else:
            change = f"{(after / before - 1) * 100:+.1f}%" if before else ""
            table.add_row(name, f"{before:,}", f"{after:,}", change)
    Console().print(table)


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.models.cli import _one_line_errors
    from headcount.surgery import merge_cli

    merge_cli.register(app, bench_app)

    @app.command("prune")
    def prune_cmd(
        model: str = typer.Option("smollm2", "--model", "-m", help="zoo name or a saved / checkpoint directory"),
        fraction: Optional[float] = typer.Option(None, "--fraction", help="share of query heads to remove, in (0, 1)"),
        mode: str = typer.Option("query", "--mode", help="query (any heads) or group (whole GQA groups)"),
        compensate: str = typer.Option("lstsq", "--compensate", help="none, mean or lstsq"),
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
        calibration_windows: int = typer.Option(16, "--calibration-windows", help="calibration windows of 512 tokens"),
        eval_windows: int = typer.Option(8, "--eval-windows", help="held-out windows of 512 tokens measured "
                                         "(encoders: 16 sentences per window)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Remove attention heads (retraining-free, with compensation); print before/after and save."""
        with _one_line_errors("prune"):
            for name, value, allowed in (("--mode", mode, ("query", "group")),
                                         ("--compensate", compensate, ("none", "mean", "lstsq"))):
                if value not in allowed:
                    raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
            if calibration_windows < 1 or eval_windows < 1:
                raise ValueError("--calibration-windows, --eval-windows: expected positive numbers")
            if curve:
                if png is not None:
                    from headcount.paths import check_png
                    check_png(png)
                _curve(model, text, mode, uniform, png, json_out, calibration_windows, eval_windows)
                return
            if fraction is None or not 0 < fraction < 1:
                raise ValueError(f"--fraction: expected a number in (0, 1), got {fraction}")
            out = check_out_dir(out, force)
            cal, held, source = calibration_and_held_out(text)
            result = _prune_one(model, fraction, mode, compensate, order, uniform, out, force, cal, held, seed,
                                calibration_windows, eval_windows)
        if json_out:
            typer.echo(json.dumps(result, indent=2))
            return
        before, after = result["ppl_before"], result["ppl_after"]
        rows = [("query heads", result["heads_before"], result["heads_after"]),
                ("KV heads", result["kv_heads_before"], result["kv_heads_after"]),
                ("parameters", result["params_before"], result["params_after"]),
                ("KV cache bytes / token", result["kv_bytes_per_token_before"], result["kv_bytes_per_token_after"])]
        if before is not None:
            rows.append((f"held-out perplexity ({source})", before, after))
        else:
            rows.append(("held-out embedding cosine", 1.0, result["fidelity_after"]["cosine"]))
        before_after_table(rows, f"{model}: {result['prune']['heads_removed']} heads removed ({mode} mode, order "
                     f"{result['prune']['order']}, compensate {compensate})")
        typer.echo(f"saved to {out} (headcount.models.load / --model {out})")

    def _prune_one(model_name, fraction, mode, compensate, order, uniform, out, force, cal, held, seed,
                   calibration_windows, eval_windows) -> dict:
        from headcount.models import load
        from headcount.surgery import prune_to, save

        model = load(model_name)
        ppl_before, reference = held_out_quality(model, held, eval_windows, 512)
        result = prune_to(model, fraction, order=order, mode=mode, compensate=compensate, uniform=uniform,
                          calibration=cal, seed=seed, calibration_windows=calibration_windows)
        ppl_after, _ = held_out_quality(model, held, eval_windows, 512, reference)
        save(model, out, force=force)
        data = {k: getattr(result, k) for k in PRUNE_JSON_KEYS if k.startswith(("heads", "params", "kv_bytes"))}
        data["kv_heads_before"], data["kv_heads_after"] = result.kv_heads_before, result.kv_heads_after
        if isinstance(ppl_before, float):
            data["ppl_before"], data["ppl_after"] = ppl_before, ppl_after
        else:
            data["ppl_before"] = data["ppl_after"] = None
            data["fidelity_after"] = {"cosine": ppl_after[0], "spearman": ppl_after[1]}
        data["out"] = str(out)
        data["prune"] = result.to_json()
        return data

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
            from headcount.surgery.bench import plot_curve
            plot_curve(data, png)
        if json_out:
            typer.echo(json.dumps(data, indent=2))
        else:
            from headcount.surgery.bench import render_curve
            render_curve(data)

    @app.command("export")
    def export_cmd(
        model: str = typer.Option(..., "--model", "-m", help="a saved directory (or zoo name)"),
        to: str = typer.Option("transformers", "--to", help="target format: transformers (a checkpoint directory), "
                               "gguf or gguf-f16 (a llama.cpp `deci` file, per-layer head counts)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory (transformers) or FILE.gguf to write"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
    ) -> None:
        """Write a checkpoint that transformers loads with no headcount code (LlamaForCausalLM / BertModel), or a
        llama.cpp GGUF file (architecture deci) that keeps each layer's head counts."""
        with _one_line_errors("export"):
            if to not in EXPORT_TARGETS:
                raise ValueError(f"--to: expected one of {', '.join(EXPORT_TARGETS)}, got {to!r}")
            if to == "transformers":
                out = check_out_dir(out, force)
            else:
                from headcount.models.formats.gguf_deci import check_gguf_path
                out = check_gguf_path(out, force, "--out")
            from headcount.models import load

            if to == "transformers":
                from headcount.surgery import export_transformers

                export_transformers(load(model), out, force=force)
            else:
                from headcount.surgery import export_gguf

                export_gguf(load(model), out, dtype="f16" if to == "gguf-f16" else "f32", force=force)
        if to == "transformers":
            typer.echo(f"wrote {out} (transformers from_pretrained)")
        else:
            typer.echo(f"wrote {out} (llama.cpp deci GGUF; headcount.models.load reads it back)")

    @bench_app.command("surgery")
    def bench_surgery(
        part: str = typer.Option("all", "--part", help="prune, merge or all"),
        quick: bool = typer.Option(False, "--quick", help="fewer points (minutes, not an hour)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
        save_json: Optional[Path] = typer.Option(None, "--save", help="also write the JSON here (rewritten after "
                                                 "every finished section)"),
        orders: Optional[str] = typer.Option(None, "--orders", help="comma-separated orders of the smollm2 "
                                             "pruning curve (default all: reconstruction, random, gradient, "
                                             "ablation, confidence)"),
        curve_only: bool = typer.Option(False, "--curve-only", help="prune part: score --orders and run the "
                                        "smollm2 curve alone (split a long run over processes)"),
        from_json: Optional[Path] = typer.Option(None, "--from", help="print the tables of a JSON that --save "
                                                 "wrote, without measuring again"),
    ) -> None:
        """Every measured number of issue 7: pruning curves (smollm2 prose and code, minilm), costs, merging."""
        with _one_line_errors("bench surgery"):
            if part not in ("prune", "merge", "all"):
                raise ValueError(f"--part: expected prune, merge or all, got {part!r}")
            from headcount.surgery import bench

            if from_json is not None:
                try:
                    result = json.loads(from_json.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise ValueError(f"--from: expected a JSON file written by --save, got {from_json} ({e})") from None
                if not isinstance(result, dict) or not ({"prune", "merge"} & set(result)):
                    raise ValueError(f"--from: expected a JSON with 'prune' and/or 'merge' sections, got {from_json}")
                save_json = None
            else:
                order_list = [o.strip() for o in orders.split(",") if o.strip()] if orders else None
                if order_list is not None and not order_list:
                    raise ValueError(f"--orders: expected comma-separated order names, got {orders!r}")
                result = bench.run(part=part, quick=quick, checkpoint=save_json, orders=order_list,
                                   curve_only=curve_only)
        if save_json is not None:
            save_json.write_text(json.dumps(result, indent=1))
        if json_out:
            typer.echo(json.dumps(result, indent=1))
        else:
            from headcount.surgery import bench
            bench.render(result)
