"""Commands of headcount.analysis: roles, faithfulness, rank, `bench capture` (here) and importance
(importance_cli.py).

    headcount roles --model M [--text FILE] [--json] [--png FILE]
    headcount faithfulness --model M [--text FILE] [--layers 0,5] [--json]
    headcount rank --model M [--text FILE] [--lengths 32,128] [--json] [--png FILE]
    headcount bench capture [--model smollm2] [--length 1024]

Registered by headcount.cli; no torch import at module level. Bad input exits 2 with one line. Each command is a
module-level function over the shared options (headcount.cli_options) and its own; its table is a function too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cli_options import (DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, PngOpt, SeedOpt, TextFileOpt,
                                   TimeoutOpt)

MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="tokens of windows for the pattern roles")]
MaxSentencesOpt = Annotated[int, typer.Option("--max-sentences", help="sentences parsed for syntactic/rare-word")]
FaithLayersOpt = Annotated[Optional[str], typer.Option("--layers", help="comma-separated layers (default: 3 spread)")]
ExamplesOpt = Annotated[int, typer.Option("--examples", help="examples (windows) to average over")]
LengthOpt = Annotated[int, typer.Option("--length", help="tokens of context per example")]
EpsilonOpt = Annotated[float, typer.Option("--epsilon", help="largest total variation of the output allowed")]
StepsOpt = Annotated[int, typer.Option("--steps", help="optimiser steps of the adversarial search")]
LengthsOpt = Annotated[Optional[str], typer.Option("--lengths", help="comma-separated lengths (default: head_dim / 2 "
                                                                     "and 2 x head_dim)")]
WindowsOpt = Annotated[int, typer.Option("--windows", help="windows per length (the smallest rank is kept)")]
CaptureLengthOpt = Annotated[int, typer.Option("--length", help="tokens in the window")]


def _errors(command: str):
    from headcount.cli_errors import one_line_errors as _one_line_errors
    return _one_line_errors(command)


def _console():
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 160, soft_wrap=False, highlight=False)


def _texts(text: Optional[Path]):
    if text is None:
        return None
    from headcount.data import read_text
    return read_text(text)


def _layers(spec: Optional[str]):
    if spec is None:
        return None
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers: expected comma-separated layer numbers such as 0,5, got {spec!r}") from None


def _ints(flag: str, spec: Optional[str]):
    if spec is None:
        return None
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {spec!r}") from None


def _load(name: str, dtype: str = "fp32", device: str = "cpu"):
    from headcount.models.options import load_model
    return load_model(name, dtype, device)


# ------------------------------------------------------------------------------------------ roles
def roles_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
              text: TextFileOpt = None, max_tokens: MaxTokensOpt = 2048, max_sentences: MaxSentencesOpt = 96,
              seed: SeedOpt = 0, json_out: JsonOpt = False, png: PngOpt = None, timeout: TimeoutOpt = 120.0) -> None:
    """What each head does: seven role scores per (layer, head), labelled past thresholds.

    previous-token, duplicate-token, induction, positional, syntactic, rare-word and sink.
    Under torchrun the windows, sequences and sentences are split over the ranks (rank 0 prints)."""
    import os

    from headcount.cli_errors import rank_errors

    with rank_errors("roles"):  # one line, prefixed with the rank under torchrun
        from headcount.analysis.plots import roles_png
        from headcount.analysis.role_scores import roles
        from headcount.paths import check_png

        if png is not None:
            check_png(png)
        if not timeout > 0:
            raise ValueError(f"--timeout: expected a positive number of seconds, got {timeout}")
        texts = _texts(text)
        group, main = None, True
        if "WORLD_SIZE" in os.environ:  # under torchrun: each rank takes a share, the sums all-reduced
            from headcount import distributed
            group = distributed.init(timeout_s=timeout)
            main = distributed.is_main(group)
        lm = _load(model, dtype, device)
        result = roles(lm, texts, max_tokens=max_tokens, max_sentences=max_sentences, seed=seed,
                       progress=main and sys.stderr.isatty(), group=group)
        if png is not None and main:
            roles_png(result.to_json(), png, title=f"{model}: head roles")
    if not main:  # rank 0 prints and writes
        return
    if json_out:
        typer.echo(json.dumps(result.to_json()))
        return
    console = _console()
    print_roles(result, model, console)
    if png is not None:
        console.print(f"wrote {png}")


def print_roles(result, model: str, console) -> None:
    """The roles table, the first-token sink, the sinks a model declares (GPT-OSS) and the syntactic rule."""
    from rich.table import Table
    table = Table(title=f"{model}: head roles", title_justify="left")
    for col in ("role", "threshold", "heads", "top heads (layer/head score)"):
        table.add_column(col)
    for role in result.roles:
        top = []
        for entry in result.heads[role][:6]:
            score = result.scores[role][entry[0]][entry[1]]
            extra = f" {entry[2]:+d}" if role == "positional" else (f" {entry[2]}" if len(entry) > 2 else "")
            top.append(f"{entry[0]}/{entry[1]}{extra} {score:.2f}")
        rule = ">" if result.meta.get("thresholds_rule", {}).get(role) == ">" else ">="
        table.add_row(role, f"{rule} {result.thresholds[role]:g}", str(len(result.heads[role])), ", ".join(top))
    console.print(table)
    meta = result.meta
    if meta.get("sink_mean") is not None:
        console.print(f"mean weight on the first token (positions >= {meta['sink_from_position']}): "
                      f"{meta['sink_mean']:.3f}")
    declared = meta.get("declared_sinks")
    if declared:  # GPT-OSS: the sinks the model declares, beside the measured first-token sink role
        share = declared["weight"]
        ranked = sorted(((share[i][h], i, h) for i in range(len(share)) for h in range(len(share[i]))),
                        reverse=True)[:6]
        sink_scores = result.scores.get("sink")
        console.print("declared sinks (learned logit per head): top heads layer/head logit, share of each row, "
                      "measured first-token sink score: " + ", ".join(
                          f"{i}/{h} {declared['logits'][i][h]:+.2f} {w:.2f} "
                          f"({sink_scores[i][h]:.2f})" if sink_scores else f"{i}/{h} {w:.2f}"
                          for w, i, h in ranked))
    if "syntactic" in meta:
        console.print(f"syntactic: {meta['syntactic']['causal_rule']}; words -> first subword")


# ----------------------------------------------------------------------------------- faithfulness
def faithfulness_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
                     text: TextFileOpt = None, layers: FaithLayersOpt = None, examples: ExamplesOpt = 3,
                     length: LengthOpt = 32, epsilon: EpsilonOpt = 0.01, steps: StepsOpt = 40, seed: SeedOpt = 0,
                     json_out: JsonOpt = False) -> None:
    """Is attention an explanation? Kendall tau vs importance, and adversarial attention (a decoder).

    Kendall tau against gradient x input and leave-one-out, a chance baseline, and the
    Jensen-Shannon divergence adversarial attention reaches within epsilon (Jain and Wallace)."""
    with _errors("faithfulness"):
        from headcount.analysis.faithful import faithfulness

        layer_list = _layers(layers)
        texts = _texts(text)
        lm = _load(model, dtype, device)
        result = faithfulness(lm, texts, layer_list, epsilon=epsilon, n_examples=examples, length=length,
                              steps=steps, seed=seed, progress=sys.stderr.isatty())
    if json_out:
        typer.echo(json.dumps(result.to_json()))
        return
    print_faithfulness(result, model, _console())


def print_faithfulness(result, model: str, console) -> None:
    from rich.table import Table
    table = Table(title=f"{model}: attention vs importance (epsilon = {result.epsilon:g})", title_justify="left")
    for col in ("layer", "head", "tau grad", "tau loo", "tau chance", "JSD", "TV"):
        table.add_column(col, justify="right")
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for h in result.heads:
        table.add_row(str(h["layer"]), str(h["head"]), fmt(h["tau_gradient"]), fmt(h["tau_loo"]),
                      fmt(h["tau_uniform"]), fmt(h["jsd"]), f"{h['tv']:.4f}")
    console.print(table)
    s = result.summary
    console.print(f"mean |tau|: gradient {fmt(s['abs_tau_gradient_mean'])}, leave-one-out "
                  f"{fmt(s['abs_tau_loo_mean'])}, chance {fmt(s['abs_tau_uniform_mean'])}; gradient vs "
                  f"leave-one-out {fmt(s['tau_gradient_vs_loo'])}")
    console.print(f"adversarial attention: JSD mean {fmt(s['jsd_mean'])}, max {fmt(s['jsd_max'])} (bits, of 1), "
                  f"{100 * s['share_jsd_at_least_half']:.0f}% of heads >= 0.5, output TV <= {s['tv_max']:.4f}")


# ------------------------------------------------------------------------------------------- rank
def rank_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
             text: TextFileOpt = None, lengths: LengthsOpt = None, windows: WindowsOpt = 2, json_out: JsonOpt = False,
             png: PngOpt = None) -> None:
    """Numerical rank of each head's Q K^T against min(head_dim, n), below and above head_dim."""
    with _errors("rank"):
        from headcount.analysis.plots import rank_png
        from headcount.analysis.score_rank import rank
        from headcount.paths import check_png

        if png is not None:
            check_png(png)
        length_list = _ints("--lengths", lengths)
        texts = _texts(text)
        lm = _load(model, dtype, device)
        result = rank(lm, texts, lengths=length_list, max_windows=windows, progress=sys.stderr.isatty())
        if png is not None:
            rank_png(result.to_json(), png, title=f"{model}: rank of Q K^T per head")
    if json_out:
        typer.echo(json.dumps(result.to_json()))
        return
    console = _console()
    print_rank(result, model, console)
    if png is not None:
        console.print(f"wrote {png}")


def print_rank(result, model: str, console) -> None:
    from rich.table import Table
    table = Table(title=f"{model}: numerical rank of Q K^T per head", title_justify="left")
    for col in ("length n", "bound min(head_dim, n)", "mean rank", "min", "max", "share at bound"):
        table.add_column(col, justify="right")
    for s in result.summary:
        table.add_row(str(s["length"]), str(s["bound"]), f"{s['mean_rank']:.2f}", str(s["min_rank"]),
                      str(s["max_rank"]), f"{100 * s['share_at_bound']:.0f}%")
    console.print(table)
    console.print(f"tolerance: {result.tolerance}")


# ---------------------------------------------------------------------------------- bench capture
def bench_capture_cmd(model: ModelOpt = "smollm2", length: CaptureLengthOpt = 1024, json_out: JsonOpt = False) -> None:
    """Peak memory of capture() (one layer's weights at a time) vs need_weights on every layer."""
    with _errors("bench capture"):
        from headcount.analysis.bench import run
        rows = run(model, length)
    if json_out:
        typer.echo(json.dumps(rows))
        return
    from rich.table import Table
    r0 = rows[0]
    table = Table(title=f"{model}: peak memory of attention weights, T = {length} "
                        f"({r0['n_layers']} layers x {r0['n_heads']} heads)", title_justify="left")
    for col in ("mode", "peak added (MiB)", "all weights formula (MiB)", "one layer (MiB)", "how"):
        table.add_column(col)
    mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
    for r in rows:
        table.add_row(r["mode"], mib(r["peak_bytes"]), mib(r["all_weights_bytes"]), mib(r["one_layer_bytes"]),
                      r["method"])
    _console().print(table)


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.analysis import importance_cli
    importance_cli.register(app, bench_app)
    app.command("roles")(roles_cmd)
    app.command("faithfulness")(faithfulness_cmd)
    app.command("rank")(rank_cmd)
    bench_app.command("capture")(bench_capture_cmd)
