"""`headcount importance` and `headcount bench importance`. Registered through headcount.analysis.cli.

    headcount importance --model smollm2 --method gradient [--text FILE] [--json] [--png FILE]
                         [--windows N] [--window T] [--normalize]

A rich table of the least and most important heads, a [layers x heads] heatmap PNG (matplotlib, Agg),
or the HeadScores JSON. Bad input (unknown method, empty or non-UTF-8 --text, unwritable --png) exits 2
with one line. torch is imported inside the commands only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from headcount.cli_options import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, PngOpt, TextFileOpt
from headcount.paths import check_png

METHOD_NAMES = ("gradient", "ablation", "confidence", "reconstruction")  # = importance.METHODS (no torch here)

MethodOpt = Annotated[str, typer.Option("--method", help="gradient | ablation | confidence | reconstruction")]
WindowsOpt = Annotated[int, typer.Option("--windows", help="decoder: windows of --window tokens (encoder: N x 16 "
                                                           "sentences)")]
AgreementWindowsOpt = Annotated[int, typer.Option("--windows", help="calibration windows for the agreement "
                                                                    "(encoder: x16 sentences)")]
WindowOpt = Annotated[int, typer.Option("--window", help="tokens per window")]
NormalizeOpt = Annotated[bool, typer.Option("--normalize", help="divide each layer's scores by their L2 norm")]
TopOpt = Annotated[int, typer.Option("--top", help="rows of the table at each end")]


def heatmap(scores, path: str | Path) -> None:
    """Save a [layers x heads] heatmap of HeadScores (padding of pruned layers left blank)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.ma.masked_invalid(scores.scores.numpy())
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * scores.n_heads, 1.2 + 0.22 * scores.n_layers))
    im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(scores.n_heads))
    step = max(1, scores.n_layers // 15)
    ax.set_yticks(range(0, scores.n_layers, step))
    name = scores.model or "model"
    ax.set_title(f"{name}: {scores.method}{' (normalised)' if scores.normalized else ''}", fontsize=10)
    fig.colorbar(im, ax=ax, label="importance")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(scores, top: int):
    from rich.table import Table

    order = scores.order()
    table = Table(title=f"{scores.model or 'model'}: {scores.method} importance on {scores.source} "
                        f"({scores.n_tokens:,} tokens{', normalised per layer' if scores.normalized else ''})",
                  title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("layer", justify="right")
    table.add_column("head", justify="right")
    table.add_column("score", justify="right")
    n = len(order)
    shown = order[:top] + ([None] if n > 2 * top else []) + order[max(top, n - top):]
    for pos, item in enumerate(shown):
        if item is None:
            table.add_row("...", "", "", "")
            continue
        rank = pos + 1 if pos < top else n - len(shown) + pos + 1
        layer, head = item
        original = scores.kept_heads[layer][head]
        label = str(head) if original == head else f"{head} (was {original})"
        table.add_row(str(rank), str(layer), label, f"{float(scores.scores[layer, head]):.4g}")
    return table


def importance_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
                   method: MethodOpt = "gradient", text: TextFileOpt = None, json_out: JsonOpt = False,
                   png: PngOpt = None, windows: WindowsOpt = 16, window: WindowOpt = 512,
                   normalize: NormalizeOpt = False, top: TopOpt = 10) -> None:
    """Score every attention head (higher = more important); least important first in the table."""
    from headcount.cli_errors import one_line_errors

    with one_line_errors("importance"):
        if method not in METHOD_NAMES:
            raise ValueError(f"--method: expected one of {', '.join(METHOD_NAMES)}, got {method!r}")
        if windows < 1:
            raise ValueError(f"--windows: expected a positive number, got {windows}")
        if window < 2:
            raise ValueError(f"--window: expected at least 2, got {window}")
        if png is not None:
            check_png(png)
        texts, source = None, "default corpus: calibration"
        if text is not None:
            from headcount.data import read_text
            texts, source = read_text(text), str(text)
        from headcount.analysis.head_importance import importance
        from headcount.models.options import load_model

        group, main = None, True
        if "WORLD_SIZE" in os.environ:  # under torchrun: each rank scores a shard of the text
            from headcount import distributed as runtime
            group = runtime.init()
            main = runtime.is_main(group)
        lm = load_model(model, dtype, device)
        scores = importance(lm, texts, method, window=window, max_windows=windows, max_sentences=16 * windows,
                            normalize=normalize, progress=main, source=source, group=group)
        if not main:  # every rank holds the same scores; rank 0 prints
            return
        if png is not None:
            heatmap(scores, png)
        if json_out:
            typer.echo(json.dumps(scores.to_json()))
        else:
            from rich.console import Console
            console = Console()
            console.print(_table(scores, top))
            if png is not None:
                console.print(f"heatmap: {png}")


def bench_importance_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
                         window: WindowOpt = 256, windows: AgreementWindowsOpt = 2, json_out: JsonOpt = False) -> None:
    """Cost of gradient / ablation scoring per batch over a plain forward, and Spearman of each method
    against ablation over all heads (calibration text)."""
    from headcount.cli_errors import one_line_errors

    with one_line_errors("bench importance"):
        import torch

        from headcount.analysis.head_importance import agreement, cost_ratio
        from headcount.models.options import load_model

        torch.set_num_threads(min(2, torch.get_num_threads()))
        lm = load_model(model, dtype, device)
        cost = cost_ratio(lm, window=window)
        agree = agreement(lm, window=window, max_windows=windows, max_sentences=16 * windows)
        out = {"cost": cost, "spearman_vs_ablation": agree["spearman"], "n_heads": agree["n_heads"],
               "n_tokens": agree["n_tokens"]}
        if json_out:
            typer.echo(json.dumps(out, indent=2))
            return
        typer.echo(f"{model}: one batch ({cost['tokens']} tokens): forward {cost['forward_s']:.3f} s; "
                   f"gradient {cost['gradient_s']:.3f} s = {cost['gradient_ratio']:.2f} forwards; "
                   f"ablation {cost['ablation_s']:.3f} s = {cost['ablation_ratio']:.1f} forwards "
                   f"({cost['n_heads']} heads)")
        for name, rho in agree["spearman"].items():
            typer.echo(f"  Spearman vs ablation over {agree['n_heads']} heads: {name:20s} {rho:+.3f}")


def register(app, bench_app) -> None:
    """Add `headcount importance` and `headcount bench importance`."""
    app.command("importance")(importance_cmd)
    bench_app.command("importance")(bench_importance_cmd)
