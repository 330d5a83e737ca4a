"""Rendering the accounts: rich tables for people, one JSON object for programs."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

_BIN = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
_SI = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def _trim(x: float) -> str:
    s = f"{x:,.2f}".rstrip("0").rstrip(".")
    return s or "0"


def byte_unit(n: int) -> tuple[str, int]:
    for unit, size in _BIN:
        if n >= size:
            return unit, size
    return "B", 1


def human_bytes(n: int, unit: tuple[str, int] | None = None) -> str:
    """268435456 -> '0.25 GiB' when unit is GiB; otherwise the largest unit that gives >= 1."""
    name, size = unit or byte_unit(n)
    return f"{_trim(n / size)} {name}"


def row_unit(values) -> tuple[str, int]:
    """One binary unit for a row of byte counts (the one its largest value calls for)."""
    return byte_unit(max([v for v in values if v] or [0]))


def human_flops(n: int) -> str:
    for name, size in _SI:
        if n >= size:
            return f"{_trim(n / size)} {name}FLOP"
    return f"{n} FLOP"


def human_count(n: int) -> str:
    for name, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{_trim(n / size)}{name}"
    return str(n)


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=False)


# ------------------------------------------------------------------------------------ one model
class _Rows:
    """The report table's rows: a section title, or an exact number with its human form and how it is counted."""

    def __init__(self, table: Table):
        self.table = table

    def section(self, name: str) -> None:
        self.table.add_row(f"[bold]{name}[/bold]", "", "", "", end_section=False)

    def count(self, label, n, how=""):
        self.table.add_row(label, f"{n:,}", human_count(n), how)

    def flops(self, label, n, how=""):
        self.table.add_row(label, f"{n:,}", human_flops(n), how)

    def nbytes(self, label, n, how=""):
        self.table.add_row(label, f"{n:,}", human_bytes(n), how)


def render_report(rep: dict, console: Console, *, fit: dict | None = None, note: str = "", source: str = "") -> None:
    shape, kv = rep["shape"], rep["kv_cache"]
    title = (f"{rep['model']}: {shape['describe']}\nbatch {rep['batch']}, seq {rep['seq']:,}, {rep['dtype']} "
             f"({rep['bytes_per_element']} bytes)")
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("account", no_wrap=True)
    table.add_column("exact", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", style="dim")
    rows = _Rows(table)
    _param_rows(rows, rep)
    _flop_rows(rows, rep)
    _score_rows(rows, rep)
    _kv_rows(rows, rep)
    if fit is not None:
        _fit_rows(table, fit, rows.section)
    console.print(table)
    for line in (note, kv.get("note", ""), f"source: {source}" if source else ""):
        if line:
            console.print(f"[dim]note: {line}[/dim]" if not line.startswith("source") else f"[dim]{line}[/dim]")


def _param_rows(rows: _Rows, rep: dict) -> None:
    p, shape, count = rep["params"], rep["shape"], rows.count
    a = p["attention_per_layer_detail"]
    rows.section("parameters")
    qk = f" + q/k norm {a['qk_norm']:,}" if a.get("qk_norm") else ""
    count("  attention per layer", p["attention_per_layer"],
          f"Q {a['q']:,} + K {a['k']:,} + V {a['v']:,} + O {a['o']:,}{qk} + bias {a['bias']:,}")
    count("    without / with every bias", a["total_without_bias"], f"with: {a['total_with_bias']:,}")
    if "experts" in p:  # a mixture of experts: what one token reads is not what the model holds
        e = p["experts"]
        count("  experts per MoE layer", e["total"], f"{shape['n_experts']} experts x {e['expert']:,} + router "
              f"{e['router']:,}; {shape['moe_layers']} of {shape['n_layers']} layers")
        count("    active per token", e["active"], f"{shape['experts_per_token']} of {shape['n_experts']} experts "
              "+ router")
    count("  MLP per layer", p["mlp_per_layer"], shape["mlp"])
    count("  per layer", p["per_layer"], f"attention + MLP + norms ({p['norms_per_layer']:,})")
    tied = shape["tied_embeddings"] and shape["arch"] != "encoder" and shape["vocab_size"] > 0
    count("  embeddings", p["embeddings"], "tied to the LM head" if tied else "")
    if p["lm_head"]:
        count("  LM head", p["lm_head"], "untied")
    if p["positions"]:
        count("  position table", p["positions"], f"{shape['max_positions']:,} learned positions")
    if p["pooler"]:
        count("  pooler", p["pooler"])
    count("  total", p["total"], f"weights: {human_bytes(rep['weights_bytes'])} in {rep['dtype']}")
    if "experts" in p:
        count("  active per token", p["active_per_token"], "what one token's forward reads (MoE)")


def _flop_rows(rows: _Rows, rep: dict) -> None:
    f, flops = rep["flops"], rows.flops
    fa, fc = f["attention_per_layer"], f["attention_per_layer_causal"]
    rows.section("FLOPs (a multiply-add is 2 FLOPs; matmuls only)")
    flops("  projections X W_Q, X W_K, X W_V", fa["projections"], "2 B n d (n_heads + 2 n_kv) head_dim")
    flops("  scores Q K^T", fa["scores"], f"2 B n_heads n^2 head_dim; causal {fc['scores']:,}")
    flops("  read A V", fa["read"], f"2 B n_heads n^2 head_dim; causal {fc['read']:,}")
    flops("  output W_O", fa["output"], "2 B n n_heads head_dim d")
    flops("  attention per layer", fa["total"], f"causal {fc['total']:,}")
    flops("  attention, all layers", f["attention_total"],
          f"{f['attention_modules']} attention module{'s' if f['attention_modules'] > 1 else ''}")
    if "attention_per_local_layer_causal" in f:
        fl, w = f["attention_per_local_layer_causal"], f["window"]
        flops(f"  local layer (window {w:,}), causal", fl["total"],
              f"scores {fl['scores']:,} + read {fl['read']:,}: B n_heads head_dim (2 n w - w^2) each"
              if w < rep["seq"] else "the window covers the whole sequence: as a global layer")
        flops("  attention, all layers, causal", f["attention_total_causal"],
              f"{f['global_layers']} global + {f['local_layers']} local layers; without the window "
              f"{f['attention_total_causal_without_window']:,}")
    else:
        flops("  attention, all layers, causal", f["attention_total_causal"], "scores and read halved")
    flops("  MLP, all layers", f["mlp_total"], f"{f['mlp_per_layer']:,} per layer")
    if f["logits"]:
        flops("  logits", f["logits"], "every position")
    flops("  model forward", f["total"], f"causal {f['total_causal']:,}" + (
        f" (without the window {f['total_causal_without_window']:,})" if "total_causal_without_window" in f else ""))


def _score_rows(rows: _Rows, rep: dict) -> None:
    s, kv = rep["score_memory_bytes"], rep["kv_cache"]
    rows.section("score memory (one attention layer)")
    rows.nbytes("  eager: scores Q K^T", s["eager_per_layer"], "B x n_heads x n^2 x bytes")
    rows.nbytes("  eager: + softmax output (peak)", s["eager_peak_per_layer"], "scores and weights both alive")
    rows.nbytes("  fused (SDPA / FlashAttention)", s["fused_per_layer"], "no n x n tensor")
    if "banded_per_local_layer" in s:
        rows.nbytes("  local layer, banded kernel", s["banded_per_local_layer"],
                    f"B x n_heads x n x min(n, {kv['window']:,}) x bytes; a masked eager path holds the full n x n")


def _kv_rows(rows: _Rows, rep: dict) -> None:
    kv, shape, nbytes = rep["kv_cache"], rep["shape"], rows.nbytes
    rows.section("KV cache")
    nbytes("  per token", kv["bytes_per_token"],
           f"2 x {kv['layers']} layer{'s' if kv['layers'] > 1 else ''} x {shape['n_kv_heads']} KV heads x "
           f"{shape['head_dim']} x {rep['bytes_per_element']} B"
           + (f" (every layer, while n <= {kv['window']:,})" if kv.get("window") else ""))
    if kv.get("window") is None:
        nbytes(f"  {rep['batch']} x {rep['seq']:,} tokens", kv["bytes_for_context"],
               f"with {shape['n_heads']} KV heads (MHA): "
               f"{human_bytes(kv['mha_bytes_per_token'] * rep['seq'] * rep['batch'])}")
    else:
        w = kv["window"]
        nbytes(f"  {rep['batch']} x {rep['seq']:,} tokens, with the window", kv["bytes_for_context"],
               f"{kv['global_layers']} global layers x {rep['seq']:,} positions + {kv['local_layers']} local x "
               f"min(n, {w:,}) = {kv['positions_per_local_layer']:,}; with {shape['n_heads']} KV heads (MHA): "
               f"{human_bytes(kv['mha_bytes_for_context'])}")
        nbytes("    without the window", kv["bytes_for_context_without_window"],
               f"all {kv['layers']} layers x {rep['seq']:,} positions")
        nbytes("  per token past the window", kv["bytes_per_token_past_window"],
               f"only the {kv['global_layers']} global layers grow")


def _fit_rows(table: Table, fit: dict, section) -> None:
    what = "the KV cache alone" if fit.get("kv_only") else "weights + KV cache"
    section(f"fit in {human_bytes(fit['budget_bytes'])} ({fit['budget_bytes']:,} bytes): {what}")
    table.add_row("  weights", f"{fit['weights_bytes']:,}", human_bytes(fit["weights_bytes"]), "")
    longest = "unbounded" if fit["max_context"] is None else f"{fit['max_context']:,}"
    table.add_row(f"  longest context at batch {fit['batch']}", longest, "tokens", fit.get("note", ""))
    table.add_row(f"  largest batch at seq {fit['seq']:,}", f"{fit['max_batch']:,}", "sequences", "")


# ---------------------------------------------------------------------------------- side by side
def render_comparison(reports: list[dict], labels: list[str], console: Console, *, title: str,
                      fits: list[dict] | None = None) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("account", no_wrap=True)
    for label in labels:
        table.add_column(label, justify="right", no_wrap=True)

    def row(label, values, fmt):
        table.add_row(label, *[fmt(v) for v in values])

    def bytes_row(label, values):
        unit = row_unit(values)  # one unit per row (0.25 GiB, 1 GiB, 4 GiB), unless a value is tiny in it
        row(label, values, lambda v: f"{v:,} ({human_bytes(v, unit if v >= unit[1] / 10 else None)})")

    def get(path):
        out = []
        for rep in reports:
            node = rep
            for key in path.split("."):
                node = node[key]
            out.append(node)
        return out

    row("n_heads x head_dim", [f"{r['shape']['n_heads']} x {r['shape']['head_dim']}" for r in reports], str)
    row("n_kv_heads", [f"{r['shape']['n_kv_heads']} ({r['shape']['attention_kind']})" for r in reports], str)
    row("params: attention per layer", get("params.attention_per_layer"), lambda v: f"{v:,}")
    row("params: total", get("params.total"), lambda v: f"{v:,}")
    row("FLOPs: attention per layer", get("flops.attention_per_layer.total"), lambda v: f"{v:,}")
    row("  of which scores + read", [r["flops"]["attention_per_layer"]["scores"] + r["flops"]["attention_per_layer"]["read"]
                                     for r in reports], lambda v: f"{v:,}")
    row("FLOPs: attention, causal", get("flops.attention_per_layer_causal.total"), lambda v: f"{v:,}")
    row("FLOPs: model forward", get("flops.total"), lambda v: f"{v:,}")
    bytes_row("score memory, eager, per layer", get("score_memory_bytes.eager_per_layer"))
    bytes_row("  eager peak (+ softmax output)", get("score_memory_bytes.eager_peak_per_layer"))
    bytes_row("score memory, fused, per layer", get("score_memory_bytes.fused_per_layer"))
    bytes_row("KV cache per token", get("kv_cache.bytes_per_token"))
    bytes_row("KV cache for the context", get("kv_cache.bytes_for_context"))
    if any(r["kv_cache"].get("window") is not None for r in reports):
        bytes_row("  without the window", [r["kv_cache"]["bytes_for_context_without_window"] for r in reports])
        row("  global + local layers", [f"{r['kv_cache']['global_layers']} + {r['kv_cache']['local_layers']}"
                                         for r in reports], str)
    if fits:
        row("fit: longest context", [fi["max_context"] for fi in fits],
            lambda v: "unbounded" if v is None else f"{v:,} tokens")
        row("fit: largest batch", [fi["max_batch"] for fi in fits], lambda v: f"{v:,}")
    console.print(table)
    console.print("[dim]FLOPs: a multiply-add is 2 FLOPs; matmuls only. Score memory: the eager path holds "
                  "B x n_heads x n x n scores (and the softmax output of the same size); a fused kernel holds "
                  "none.[/dim]")


# ---------------------------------------------------------------------------------- measurements
def render_measure(rows: list[dict], console: Console, *, title: str) -> None:
    table = Table(title=title, title_justify="left")
    for name, justify in (("check", "left"), ("measured", "right"), ("formula", "right"), ("", "left"),
                          ("how", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "how")
    for r in rows:
        fmt = (lambda v: f"{v:,}") if isinstance(r["measured"], int) else (lambda v: f"{v:,.3f}")
        verdict = {True: "[green]ok[/green]", False: "[red]MISMATCH[/red]", None: "[dim]info[/dim]"}[r["ok"]]
        table.add_row(r["check"], fmt(r["measured"]), fmt(r["formula"]) if r["formula"] is not None else "-",
                      verdict, r.get("how", ""))
    console.print(table)


# ------------------------------------------------------------------------------- tensor parallel
def _heads(indices: list[int], replicated: list[int] = ()) -> str:
    """[0, 1, 2, 3, 4] -> '0-4'; replicated KV heads get a '*'."""
    if not indices:
        return "-"
    runs, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        run = [start] if start == prev else ([start, prev] if prev == start + 1 else None)
        text = ", ".join(f"{h}{'*' if h in replicated else ''}" for h in run) if run else \
            f"{start}{'*' if start in replicated else ''}-{prev}{'*' if prev in replicated else ''}"
        runs.append(text)
        if i is not None:
            start = prev = i
    return ", ".join(runs)


def render_per_rank(tp: dict, rep: dict, console: Console, *, title: str) -> None:
    """One row per rank: heads, parameters, KV cache, score memory, all-reduce bytes."""
    s = tp["summary"]
    table = Table(title=title, title_justify="left")
    for name in ("rank", "query heads", "KV heads", "attn params / layer", "params", "weights",
                 "KV cache / token", f"KV cache, {rep['batch']} x {rep['seq']:,}", "eager scores / layer",
                 "all-reduce / token / layer"):
        table.add_column(name, justify="left" if "heads" in name or name == "rank" else "right", no_wrap=True)
    for r in tp["per_rank"]:
        table.add_row(str(r["rank"]), _heads(r["query_heads"]), _heads(r["kv_heads"], r["replicated_kv_heads"]),
                      f"{r['params']['attention_per_layer']:,}", f"{r['params']['total']:,}",
                      human_bytes(r["weights_bytes"]), human_bytes(r["kv_cache"]["bytes_per_token"]),
                      human_bytes(r["kv_cache"]["bytes_for_context"]),
                      human_bytes(r["score_memory_bytes"]["eager_per_layer"]),
                      f"{r['allreduce_bytes_per_token_per_layer']:,} B")
    console.print(table)
    replicated = s["kv_heads_stored"] - s["kv_heads_model"]
    lines = [
        f"KV heads: {s['kv_heads_stored']} held over the ranks for the model's {s['kv_heads_model']}"
        + (f" (* = held on more than one rank: the KV cache of all ranks is {s['kv_cache_replication']:.2f}x one "
           f"process's, {human_bytes(s['kv_cache_bytes_per_token_all_ranks'])} vs "
           f"{human_bytes(s['kv_cache_bytes_per_token_one_process'])} per token)" if replicated else
           " (none replicated)"),
        f"replicated on every rank: embeddings, norms, LM head ({s['replicated_params_per_rank']:,} parameters); "
        f"all ranks together hold {s['params_all_ranks']:,} vs {s['params_one_process']:,} in one process",
    ]
    if s["world_size"] > 1:
        lines.append(f"all-reduce: {s['allreduces_per_layer']} per layer (after W_O, after the MLP) of d_model values "
                     f"per token = {human_bytes(s['allreduce_bytes_per_token'])} per token over all layers; a ring "
                     f"sends {human_bytes(s['ring_bytes_sent_per_rank_per_token'])} per token from every rank")
    else:
        lines.append("one rank: the whole model, no all-reduce (fine: --tp 1 is the single-process account)")
    for line in lines:
        console.print(f"[dim]{line}[/dim]")
