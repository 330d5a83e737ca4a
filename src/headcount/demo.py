"""`headcount demo` (what `make demo` runs: the head report on smollm2), `headcount tour` (attention on a
random input, the accounts, generation) and `headcount bench attention`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.arguments import one_of
from headcount.cli_options import JsonOpt
from headcount.report.cli import PageOutOpt, QuickOpt


def tour() -> None:
    """A short tour: MHA / GQA / MQA on a random input, the three accounts, a benchmark line."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from headcount import MultiHeadAttention
    from headcount.bench.attention import time_table

    console = Console(width=None if sys.stdout.isatty() else 160)
    torch.manual_seed(0)
    d_model, n_heads, T = 512, 8, 256
    x = torch.randn(1, T, d_model)
    table = Table(title=f"MultiHeadAttention on a random input [1, {T}, {d_model}]")
    for col in ("kind", "n_heads", "n_kv_heads", "params", "KV cache bytes/token (fp32)", "output", "weights"):
        table.add_column(col)
    for n_kv in (8, 2, 1):
        attn = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv).eval()
        with torch.inference_mode():
            out = attn(x, is_causal=True, need_weights=True)
        kind = "MHA" if n_kv == n_heads else ("MQA" if n_kv == 1 else "GQA")
        params = sum(p.numel() for p in attn.parameters())
        per_token = attn.new_cache(1, 1).nbytes
        table.add_row(kind, str(n_heads), str(n_kv), f"{params:,}", f"{per_token:,}", str(list(out.output.shape)),
                      str(list(out.weights.shape)))
    console.print(table)
    _accounts_tour(console)
    rows = time_table((1024,), repeats=3)
    by = {r["impl"]: r for r in rows}
    floor, ours, peer = (by[k]["median_s"] for k in ("inline SDPA (floor)", "headcount fused",
                                                   "torch.nn.MultiheadAttention"))
    console.print(f"[bold]bench[/] T=1024, d_model=512, 8 heads, fp32: headcount fused {ours * 1e3:.1f} ms = "
                  f"{ours / floor:.2f}x the inline SDPA floor; torch.nn.MultiheadAttention {peer / ours:.2f}x slower "
                  "(full table: headcount bench attention)")
    from headcount.models import demo_tour

    demo_tour(console)


def _accounts_tour(console) -> None:
    """Chapter 2.3.3: same parameters and FLOPs at 8, 32, 128 heads; score memory x16 (headcount cost)."""
    from headcount.cost import ModelShape, report
    from headcount.cost.format import render_comparison

    shapes = [ModelShape(d_model=4096, n_heads=h) for h in (8, 32, 128)]
    reports = [report(s, batch=1, seq=4096, dtype="fp16") for s in shapes]
    render_comparison(reports, [f"{s.n_heads} heads x {s.head_dim}" for s in shapes], console,
                      title="the three accounts of one attention layer, d_model 4096, seq 4,096, fp16 "
                            "(headcount cost --d-model 4096 --heads 8,32,128 --seq 4096 --dtype fp16)")


def demo_cmd(quick: QuickOpt = False, out: PageOutOpt = None) -> None:
    """What `make demo` runs: the head report on smollm2 with the default corpus, then a five-line summary."""
    from headcount.report.cli import run_report

    run_report("smollm2", out=out, force=out is None, quick=quick, command="demo")


def tour_cmd() -> None:
    """A tour: attention on a random input, its accounts, a benchmark line, the real models."""
    tour()


def bench_attention(repeats: Annotated[int, typer.Option("--repeats", help="paired repeats per length")] = 7,
                    json_out: JsonOpt = False) -> None:
    """headcount fused / eager vs inline SDPA vs torch.nn.MultiheadAttention, and peak memory per path."""
    from headcount.bench.attention import main
    main(repeats=repeats, as_json=json_out)


SCALE_MODELS = ",".join(("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"))
ModelsOpt = Annotated[str, typer.Option("--models", help="comma-separated zoo names or paths")]
StepsOpt = Annotated[str, typer.Option("--steps", help="some of perplexity, importance, prune, report")]
DtypesOpt = Annotated[str, typer.Option("--dtypes", help="comma-separated: fp32, bf16, fp16")]
WindowsOpt = Annotated[Optional[int], typer.Option("--windows", help="calibration windows for importance and prune "
                                                                     "(default: each command's own)")]
StepTimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", help="seconds per step")]
SaveOpt = Annotated[Optional[Path], typer.Option("--save", help="also write the JSON here")]


def bench_scale(models: ModelsOpt = SCALE_MODELS, steps: StepsOpt = "perplexity,importance,prune,report",
                dtypes: DtypesOpt = "fp32", windows: WindowsOpt = None, timeout: StepTimeoutOpt = None,
                json_out: JsonOpt = False, save: SaveOpt = None) -> None:
    """Time and peak memory of perplexity / importance / prune / report on models of growing size, each
    step a fresh process with the command's defaults, and the slope against parameters."""
    import json

    from rich.console import Console

    from headcount.bench import scale
    from headcount.cli_errors import one_line_errors

    with one_line_errors("bench scale"):
        for d in dtypes.split(","):
            one_of("--dtypes", d, ("fp32", "bf16", "fp16"), expected="fp32, bf16 or fp16")
        console = Console(stderr=json_out)

        def progress(s):
            console.print(f"{s.model} {s.dtype} {s.step}: {s.seconds:.1f} s, peak RSS "
                          f"{s.peak_rss_bytes / 2**30:.2f} GiB" + (f" ({s.error})" if s.error else ""))

        result = scale.run(models.split(","), steps.split(","), tuple(dtypes.split(",")), windows=windows,
                           timeout=timeout, progress=progress)
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(result.to_json(), indent=2))
        if json_out:
            typer.echo(json.dumps(result.to_json(), indent=2))
        else:
            scale.render(result, console)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
    app.command("tour")(tour_cmd)
    bench_app.command("attention")(bench_attention)
    bench_app.command("scale")(bench_scale)
