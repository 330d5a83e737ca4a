"""`headcount cost DIR` for an edited model (a headcount save of a prune or merge, or a Nemotron-NAS export): each
layer's heads, KV bytes and FLOPs, the totals, and the saving against the model it came from. Pure Python."""

from __future__ import annotations

from pathlib import Path

from headcount.cost.edited import edited_fit, read_edited, saving
from headcount.cost.format import human_bytes, to_json


def show_edited(path: Path, console, *, seq: int, batch: int, dtype: str, budget: int | None, kv_only: bool,
                as_json: bool) -> None:
    edited = read_edited(path)
    rep = saving(edited, batch=batch, seq=seq, dtype=dtype)
    if budget is not None:
        rep["fit"] = edited_fit(edited, budget, seq=seq, dtype=dtype, kv_only=kv_only)
    if as_json:
        import typer

        typer.echo(to_json(rep))
        return
    from rich.table import Table

    mine, orig, change = rep["edited"], rep["original"], rep["change"]
    table = Table(title=f"{path}: per layer, batch {batch}, context {seq:,}, {dtype}", title_justify="left")
    for col in ("layer", "query heads", "K/V heads", "KV bytes / token", "KV bytes", "prefill attention FLOPs",
                "decode attention FLOPs / step"):
        table.add_column(col, justify="right")
    base = edited.base
    for r in mine["layers"]:
        table.add_row(str(r["layer"]), f"{r['n_heads']} / {base.n_heads}", f"{r['n_kv_heads']} / {base.n_kv_heads}",
                      f"{r['kv_bytes_per_token']:,}", human_bytes(r["kv_bytes"]), f"{r['prefill_attention_flops']:,}",
                      f"{r['decode_attention_flops']:,}")
    console.print(table)
    totals = Table(title="the edit against the model it came from", title_justify="left")
    for col in ("", "original", "edited", "change"):
        totals.add_column(col, justify="right" if col else "left")
    rows = (("parameters", "params", lambda v: f"{v:,}"),
            ("KV bytes per token", "kv_bytes_per_token", lambda v: f"{v:,}"),
            (f"KV cache at {seq:,} x {batch}", "kv_bytes", human_bytes),
            ("prefill FLOPs", "prefill_flops", lambda v: f"{v:,}"),
            ("decode FLOPs per step", "decode_flops", lambda v: f"{v:,}"),
            ("decode bytes read per step", "decode_bytes_read", human_bytes))
    for label, key, fmt in rows:
        totals.add_row(label, fmt(orig[key]), fmt(mine[key]), f"{change[key] * 100:+.1f}%")
    console.print(totals)
    if "fit" in rep:
        f = rep["fit"]
        what = "the KV cache alone" if f["kv_only"] else "weights + KV cache"
        console.print(f"fit in {human_bytes(f['budget_bytes'])} ({what}): {f['kv_tokens']:,} tokens of KV cache, "
                      f"{f['max_batch']:,} sequences of {seq:,} at once ({f['max_concurrency']:.2f}x)")
    for note in rep["notes"]:
        console.print(f"[dim]note: {note}[/dim]")
    console.print(f"[dim]{mine['convention']}[/dim]")
