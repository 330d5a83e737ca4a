"""`headcount cost`: the three accounts and the KV cache for a preset, a config.json or flags.

Light imports only (typer, rich, the pure-Python accounts): no torch unless --measure is given.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cost.accounts import report
from headcount.cost.fit import fit as fit_budget
from headcount.cost.fit import parse_budget, parse_seq
from headcount.cost.presets import ALIASES, PRESETS, get_preset
from headcount.cost.shape import CostError, ModelShape, describe, from_config, global_every, override, parse_dtype

HELP = """The three accounts of chapter 2.3.3 (parameters, FLOPs, score-matrix memory) and the KV cache (2.3.7).

\b
  headcount cost llama-3-8b --seq 8192 --batch 1 --dtype bf16
  headcount cost --d-model 4096 --heads 8,32,128 --seq 4096 --dtype fp16
  headcount cost llama-3-8b --kv-heads 32,8,1 --dtype fp16
  headcount cost llama-3-70b --fit 80GiB
  headcount cost smollm2 --fit 1GiB --kv-only --dtype fp32 --seq 4096   (the cache's own budget, as vLLM's)
  headcount cost path/to/edited-dir            (a prune / merge save: per-layer KV bytes and FLOPs, the saving)
  headcount cost --config path/to/config.json --json
  headcount cost path/to/checkpoint-dir          (a path in place of a preset: its config.json)
  headcount cost llama-3-70b --tp 8 --seq 8192 --dtype bf16   (per-rank accounts, heads split over 8 ranks)
  headcount cost gemma-3-270m --seq 32k        (sliding windows: KV cache with and without the window)
  headcount cost mistral-7b --sliding-window 4096 --seq 32k   (v0.1's window on every layer)
  headcount cost llama-3-8b --sliding-window 1024 --global-every 4   (3 local layers, then 1 global)
  headcount cost --measure

FLOPs count a multiply-add as 2 FLOPs (matrix multiplications only).
"""

# cost sits on the same layer as cli_options (pure Python, below the models), so it declares its own --json; its
# --dtype is the accounts' precision (fp8 and int8 too), not the loading --dtype of the model commands
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]

MEASURE_DEFAULT = dict(d_model=256, heads="8", kv_heads="2", seq="256")


def _whole(flag: str, text: str | None, *, minimum: int = 1) -> int | None:
    """A flag's whole number, or a one-line CostError naming the flag."""
    if text is None:
        return None
    try:
        value = int(str(text).strip().replace(",", "").replace("_", ""))
    except ValueError:
        raise CostError(f"{flag}: expected a whole number, got {text!r}") from None
    if value < minimum:
        raise CostError(f"{flag}: expected a {'positive' if minimum == 1 else 'non-negative'} whole number, "
                        f"got {value}")
    return value


def _int_list(flag: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise CostError(f"{flag}: expected whole numbers separated by commas, e.g. 8,32,128, got {text!r}") from None
    for v in values:
        if v <= 0:
            raise CostError(f"{flag}: expected positive head counts, got {v}")
    return list(dict.fromkeys(values))


def _as_path(name: str) -> Path | None:
    """The MODEL argument as a config path: an existing file or directory (a bare word that is also a
    preset stays the preset), or anything spelled like a path (a separator, or .json) even if missing."""
    spelled = "/" in name or os.sep in name or name.lower().endswith(".json")
    path = Path(name).expanduser()
    if spelled:
        return path
    if path.exists():
        try:
            get_preset(name)
        except CostError:
            return path
    return None


def _edited_dir(path: Path) -> bool:
    from headcount.cost.edited import is_edited_dir

    return path.is_dir() and is_edited_dir(path)


def _base_shape(model, config, d_model, heads, kv_heads, head_dim, family=None) -> tuple[ModelShape, str, str]:
    """(shape, note, source) from a preset, a config.json (--config or a path as MODEL), or --d-model/--heads."""
    if model is not None and config is not None:
        raise CostError("give a preset name or --config, not both")
    if model is not None and _as_path(model) is not None:
        config, model = _as_path(model), None
    if family is not None and config is None:
        raise CostError(f"--family: counts a config.json as a known model_type; give a config.json (a path or "
                        f"--config), got --family {family} with {'a preset' if model else 'no config.json'}")
    if model is not None:
        preset = get_preset(model)
        return preset.shape, preset.note, preset.source
    if config is not None:
        return from_config(config, family=family), "", str(config)
    if d_model is None:
        raise CostError(f"give a preset name, --config path/to/config.json, or --d-model with --heads; "
                        f"presets: {', '.join(PRESETS)}")
    if not heads:
        raise CostError("--d-model needs --heads (e.g. --heads 8,32,128)")
    shape = ModelShape(d_model=d_model, n_heads=heads[0], n_kv_heads=kv_heads[0] if kv_heads else None,
                       head_dim=head_dim)
    return shape, "a bare block: 1 layer unless --n-layers, no embeddings unless --vocab, no biases unless --bias", ""


def _window_flag(text: str | None) -> int | None | str:
    """--sliding-window: a positive number of keys, or off / none (no local layers); None = not given."""
    if text is None:
        return None
    if str(text).strip().lower() in ("off", "none", "no", "full"):
        return "off"
    value = _whole("--sliding-window", text, minimum=-10**18)
    if value <= 0:
        raise CostError(f"--sliding-window: expected a positive number of keys each query of a local layer sees "
                        f"(or off), got {value}")
    return value


def _with_window(shape: ModelShape, window, every: int | None) -> ModelShape:
    """The shape with --sliding-window / --global-every applied (after every other field, so the pattern
    fits the final number of layers)."""
    if window is None and every is None:
        return shape
    if window == "off":
        if every is not None:
            raise CostError("--global-every: no sliding window to alternate with (--sliding-window off)")
        return shape.replace(sliding_window=None, layer_types=None)
    w = shape.sliding_window if window is None else window
    if w is None:
        raise CostError("--global-every: needs a sliding window (--sliding-window N); "
                        f"{shape.name} has none")
    if every is not None:
        types = global_every(shape.n_layers, every)
    elif shape.sliding_window is not None:
        types = shape.layer_types  # a new window size, the model's own pattern
    else:
        types = None  # every layer local
    return shape.replace(sliding_window=w, layer_types=types)


def _variants(base: ModelShape, heads, kv_heads, fields: dict, window=None,
              every: int | None = None) -> tuple[list[ModelShape], list[str]]:
    shapes, labels = [], []
    for h in heads or [None]:
        for kv in kv_heads or [None]:
            shape = _with_window(override(base, n_heads=h, n_kv_heads=kv, **fields), window, every)
            shapes.append(shape)
            parts = []
            if heads and len(heads) > 1:
                parts.append(f"{shape.n_heads} heads x {shape.head_dim}")
            if kv_heads and len(kv_heads) > 1:
                parts.append(f"{shape.n_kv_heads} KV ({shape.attention_kind})")
            labels.append(", ".join(parts) or shape.name)
    return shapes, labels


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False, highlight=False)


def _list_presets(console) -> None:
    from rich.table import Table

    from headcount.cost.accounts import param_counts

    table = Table(title="headcount cost presets", title_justify="left")
    for col in ("name", "model", "shape", "params", "source"):
        table.add_column(col, no_wrap=col != "shape")
    for key, p in PRESETS.items():
        table.add_row(key, p.shape.name, describe(p.shape), f"{param_counts(p.shape)['total']:,}", p.source)
    console.print(table)
    console.print(f"[dim]aliases: {', '.join(f'{a} -> {k}' for a, k in ALIASES.items())}[/dim]")


def cost(
    model: Annotated[Optional[str], typer.Argument(help="A preset (see --list), e.g. llama-3-8b, gpt3-175b; or a path: a config.json, or a checkpoint directory holding one.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="A transformers config.json (or its folder).")] = None,
    family: Annotated[Optional[str], typer.Option("--family", help="Count the config.json as this model_type (llama, qwen2, gpt_neox, ...) when headcount does not know its own.")] = None,
    seq: Annotated[Optional[str], typer.Option("--seq", help="Sequence / context length n (8192, 8k, 128k). [default: 2048]")] = None,
    batch: Annotated[str, typer.Option("--batch", metavar="INT", help="Batch size B.")] = "1",
    dtype: Annotated[str, typer.Option("--dtype", help="fp32, fp16, bf16, fp8, int8.")] = "bf16",
    as_json: JsonOpt = False,
    fit: Annotated[Optional[str], typer.Option("--fit", help="A memory budget (80GiB, 80GB, 1.5TiB, 512MiB): the longest context and largest batch whose weights + KV cache fit.")] = None,
    kv_only: Annotated[bool, typer.Option("--kv-only", help="With --fit: the budget is the KV cache's alone (what vLLM gives its cache), weights not taken from it.")] = False,
    tp: Annotated[Optional[str], typer.Option("--tp", metavar="INT", help="Tensor parallel by heads over N ranks: per-rank parameters, KV cache (replicated KV heads counted), score memory and all-reduce bytes.")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="Check the formulas against a run of headcount.MultiHeadAttention (needs torch).")] = False,
    list_presets: Annotated[bool, typer.Option("--list", help="List the presets and exit.")] = False,
    d_model: Annotated[Optional[str], typer.Option("--d-model", metavar="INT", help="Model width.")] = None,
    heads: Annotated[Optional[str], typer.Option("--heads", help="Query heads; a list (8,32,128) compares side by side.")] = None,
    kv_heads: Annotated[Optional[str], typer.Option("--kv-heads", help="KV heads; a list (32,8,1) compares MHA, GQA, MQA.")] = None,
    head_dim: Annotated[Optional[str], typer.Option("--head-dim", metavar="INT", help="Head width (default d_model / heads).")] = None,
    n_layers: Annotated[Optional[str], typer.Option("--n-layers", metavar="INT", help="Layers (blocks per stack).")] = None,
    d_ff: Annotated[Optional[str], typer.Option("--d-ff", metavar="INT", help="MLP hidden width.")] = None,
    vocab: Annotated[Optional[str], typer.Option("--vocab", metavar="INT", help="Vocabulary size.")] = None,
    mlp: Annotated[Optional[str], typer.Option("--mlp", help="gelu (2 matrices) or gated (3, SwiGLU).")] = None,
    max_positions: Annotated[Optional[str], typer.Option("--max-positions", metavar="INT", help="Learned position rows / context window.")] = None,
    position: Annotated[Optional[str], typer.Option("--position", help="learned, rotary, sinusoidal, none.")] = None,
    norm: Annotated[Optional[str], typer.Option("--norm", help="layernorm or rmsnorm.")] = None,
    arch: Annotated[Optional[str], typer.Option("--arch", help="decoder, encoder, encoder-decoder.")] = None,
    bias: Annotated[Optional[bool], typer.Option("--bias/--no-bias", help="Biases on every linear layer.")] = None,
    tied: Annotated[Optional[bool], typer.Option("--tied/--untied", help="Tie the LM head to the embeddings.")] = None,
    sliding_window: Annotated[Optional[str], typer.Option("--sliding-window", metavar="INT|off", help="Keys a query of a local layer sees (itself included); its KV cache holds min(seq, window) positions. Every layer local unless the model has a pattern or --global-every is given; off: no window.")] = None,
    global_every: Annotated[Optional[str], typer.Option("--global-every", metavar="INT", help="With a sliding window: layer i is global when (i + 1) % K == 0 (Gemma 3: 6, Gemma 2: 2); the rest are local.")] = None,
) -> None:
    """The three accounts (parameters, FLOPs, score memory) and the KV cache, by head count."""
    given = locals()  # the parameters, each a field of CostFlags (list_presets aside)
    flags = CostFlags(**{f.name: given[f.name] for f in fields(CostFlags)})
    console = _console()
    if list_presets:
        _list_presets(console)
        return
    try:
        run = compute(flags, console)
    except CostError as err:
        typer.echo(f"headcount cost: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(2) from None
    if run is None:  # an edited directory, shown by edited_cli
        return
    if as_json:
        typer.echo(run_json(run))
        return
    print_tables(run, console)


@dataclass(frozen=True)
class CostFlags:
    """The command's flags as typed (strings: each is parsed once, in compute, into a one-line error naming it)."""
    model: str | None = None
    config: Path | None = None
    family: str | None = None
    seq: str | None = None
    batch: str = "1"
    dtype: str = "bf16"
    as_json: bool = False
    fit: str | None = None
    kv_only: bool = False
    tp: str | None = None
    measure: bool = False
    d_model: str | None = None
    heads: str | None = None
    kv_heads: str | None = None
    head_dim: str | None = None
    n_layers: str | None = None
    d_ff: str | None = None
    vocab: str | None = None
    mlp: str | None = None
    max_positions: str | None = None
    position: str | None = None
    norm: str | None = None
    arch: str | None = None
    bias: bool | None = None
    tied: bool | None = None
    sliding_window: str | None = None
    global_every: str | None = None


@dataclass
class CostRun:
    """What the command computed, before any formatting: one report per shape variant."""
    shapes: list
    labels: list
    reports: list
    batch: int
    seq: int
    dtype: str
    note: str = ""
    source: str = ""
    fits: list | None = None
    tp: int | None = None
    tps: list | None = None
    measured: list | None = None


def _measure_defaults(f: CostFlags) -> CostFlags:
    """--measure alone: a small block (MEASURE_DEFAULT) rather than no shape at all."""
    if f.measure and f.model is None and f.config is None and f.d_model is None:
        return dataclasses.replace(f, d_model=str(MEASURE_DEFAULT["d_model"]), heads=f.heads or MEASURE_DEFAULT["heads"],
                                   kv_heads=f.kv_heads or MEASURE_DEFAULT["kv_heads"],
                                   seq=f.seq or MEASURE_DEFAULT["seq"])
    return f


def compute(f: CostFlags, console) -> CostRun | None:
    """The accounts the flags ask for (None: an edited directory, already shown), or a CostError naming a flag."""
    f = _measure_defaults(f)
    n = parse_seq(f.seq) if f.seq is not None else 2048
    batch = _whole("--batch", f.batch)
    d_model, head_dim, n_layers, d_ff = (_whole("--d-model", f.d_model), _whole("--head-dim", f.head_dim),
                                         _whole("--n-layers", f.n_layers), _whole("--d-ff", f.d_ff))
    vocab, max_positions = _whole("--vocab", f.vocab, minimum=0), _whole("--max-positions", f.max_positions, minimum=0)
    dtype_name, _ = parse_dtype(f.dtype)
    budget = parse_budget(f.fit) if f.fit is not None else None
    if f.kv_only and budget is None:
        raise CostError("--kv-only: counts a --fit budget as the KV cache's alone; give --fit too (e.g. --fit 1GiB)")
    model = f.model
    if model is not None and _as_path(model) is not None and _edited_dir(_as_path(model)):
        from headcount.cost.edited_cli import show_edited

        show_edited(_as_path(model), console, seq=n, batch=batch, dtype=dtype_name, budget=budget,
                    kv_only=f.kv_only, as_json=f.as_json)
        return None
    tp = _whole("--tp", f.tp)
    heads_list, kv_list = _int_list("--heads", f.heads), _int_list("--kv-heads", f.kv_heads)
    base, note, source = _base_shape(model, f.config, d_model, heads_list, kv_list, head_dim, f.family)
    changes = dict(d_model=d_model, head_dim=head_dim, n_layers=n_layers, d_ff=d_ff, vocab_size=vocab, mlp=f.mlp,
                   max_positions=max_positions, position=f.position, norm=f.norm, arch=f.arch,
                   tied_embeddings=f.tied)
    if f.bias is not None:
        changes.update(attn_bias=f.bias, o_bias=f.bias, mlp_bias=f.bias)
    if model is None and f.config is None:  # already in the base shape
        changes.pop("d_model"), changes.pop("head_dim")
    window, every = _window_flag(f.sliding_window), _whole("--global-every", f.global_every)
    shapes, labels = _variants(base, heads_list, kv_list, changes, window, every)
    run = CostRun(shapes, labels, [report(s, batch=batch, seq=n, dtype=dtype_name) for s in shapes], batch, n,
                  dtype_name, note, source, tp=tp)
    if budget:
        run.fits = [fit_budget(s, budget, batch=batch, seq=n, dtype=dtype_name, kv_only=f.kv_only) for s in shapes]
    if tp is not None:
        from headcount.cost.parallel import per_rank

        run.tps = [per_rank(s, tp, batch=batch, seq=n, dtype=dtype_name) for s in shapes]
    run.measured = _measure(shapes, batch, n, dtype_name) if f.measure else None
    return run


def _variant_json(run: CostRun, i: int) -> dict:
    rep = dict(run.reports[i])
    if run.note:
        rep["note"] = run.note
    if run.source:
        rep["source"] = run.source
    if run.fits:
        rep["fit"] = run.fits[i]
    if run.measured:
        rep["measure"] = run.measured[i]
    if run.tps:
        rep["per_rank"] = run.tps[i]["per_rank"]
        rep["tensor_parallel"] = run.tps[i]["summary"]
    return rep


def run_json(run: CostRun) -> str:
    """--json: one report, or {"variants": [...], "labels": [...]} for a comparison."""
    from headcount.cost.format import to_json

    if len(run.reports) == 1:
        return to_json(_variant_json(run, 0))
    return to_json({"variants": [_variant_json(run, i) | {"label": run.labels[i]} for i in range(len(run.reports))],
                    "labels": run.labels})


def print_tables(run: CostRun, console) -> None:
    """The rich tables (exit 1 when a --measure row disagrees with its formula)."""
    from headcount.cost.format import render_comparison, render_measure, render_per_rank, render_report

    batch, n, dtype_name = run.batch, run.seq, run.dtype
    if len(run.reports) == 1:
        render_report(run.reports[0], console, fit=run.fits[0] if run.fits else None, note=run.note,
                      source=run.source)
    else:
        b = run.shapes[0]
        title = (f"{b.name}: d_model {b.d_model}, {b.n_layers} layer{'s' if b.n_layers > 1 else ''}; batch {batch}, "
                 f"seq {n:,}, {dtype_name}")
        render_comparison(run.reports, run.labels, console, title=title, fits=run.fits)
        if run.note:
            console.print(f"[dim]note: {run.note}[/dim]")
    if run.tps:
        for label, t, r in zip(run.labels, run.tps, run.reports):
            render_per_rank(t, r, console, title=f"{label}: tensor parallel by heads over {run.tp} rank"
                                                  f"{'s' if run.tp > 1 else ''}; batch {batch}, seq {n:,}, {dtype_name}")
    if run.measured:
        for shape, label, rows in zip(run.shapes, run.labels, run.measured):
            render_measure(rows, console, title=f"measured vs formula: {label} ({describe(shape)}), batch {batch}, "
                                                  f"seq {n:,}")
        if any(r["ok"] is False for rows in run.measured for r in rows):
            typer.echo("headcount cost: a measurement disagrees with its formula (see MISMATCH above)", err=True)
            raise typer.Exit(1)


def _measure(shapes, batch, seq, dtype) -> list[list[dict]]:
    try:
        from headcount.cost import measure as m
    except ImportError as err:  # pragma: no cover - torch is a dependency
        raise CostError(f"--measure needs torch and headcount.MultiHeadAttention ({err})") from None
    out = []
    for i, shape in enumerate(shapes):
        try:
            out.append(m.run_all(shape, batch, seq, dtype if dtype in ("fp32", "fp16", "bf16") else "fp32",
                                 memory=i == 0))
        except ImportError as err:
            raise CostError(f"--measure needs torch and headcount.MultiHeadAttention ({err})") from None
        except RuntimeError as err:
            raise CostError(f"--measure failed: {err}") from None
    return out


def register(app) -> None:
    app.command("cost", help=HELP, no_args_is_help=False)(cost)
