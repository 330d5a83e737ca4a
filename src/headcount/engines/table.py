"""`bench serve`'s table: each row with its ratios to the unedited model and the ratios the accounts predict."""

from __future__ import annotations

from headcount.engines.rows import ServeResult, ServeRow


def baseline(result: ServeResult, row: ServeRow) -> ServeRow | None:
    """The unedited model's row of the same engine, context and batch."""
    for r in result.rows:
        if r.edited is None and (r.engine, r.context, r.batch) == (row.engine, row.context, row.batch):
            return r
    return None


def ratios(result: ServeResult, row: ServeRow) -> dict:
    """Measured edit / unedited: kv (bytes), rss, prefill and decode (speed-ups); None where either is missing."""
    base = baseline(result, row)

    def div(a, b):
        return a / b if a is not None and b else None

    if row.edited is None or base is None:
        return {"kv": None, "rss": None, "prefill": None, "decode": None}
    return {"kv": div(row.kv_bytes, base.kv_bytes), "rss": div(row.peak_rss_bytes, base.peak_rss_bytes),
            "prefill": div(row.prefill_tokens_per_s, base.prefill_tokens_per_s),
            "decode": div(row.decode_tokens_per_s, base.decode_tokens_per_s)}


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


def _x(measured, predicted) -> str:
    if measured is None:
        return ""
    text = f"{measured:.2f}x"
    return text + (f" ({predicted:.2f}x)" if predicted is not None else "")


def render(result: ServeResult, console) -> None:
    from rich.table import Table

    table = Table(title=f"bench serve on {result.cpu}, {result.settings['threads']} threads: measured edit / unedited "
                        "(the accounts' prediction)", title_justify="left")
    for col in ("engine", "model", "context", "batch", "KV MiB", "KV ratio", "peak RSS MiB", "prefill tok/s",
                "prefill x", "decode tok/s", "decode x"):
        table.add_column(col, justify="left" if col in ("engine", "model") else "right")
    for r in result.rows:
        q = ratios(result, r)
        table.add_row(r.engine, r.edited or r.model, f"{r.context:,}", str(r.batch), _mib(r.kv_bytes),
                      _x(q["kv"], r.predicted_kv_ratio), _mib(r.peak_rss_bytes),
                      "-" if r.prefill_tokens_per_s is None else f"{r.prefill_tokens_per_s:,.1f}",
                      _x(q["prefill"], r.predicted_prefill_speedup),
                      "-" if r.decode_tokens_per_s is None else f"{r.decode_tokens_per_s:,.2f}",
                      _x(q["decode"], r.predicted_decode_speedup))
    console.print(table)
    for c in result.capacity:
        raw = c.get("kv_cache_tokens_in_blocks")
        agree = raw / c["accounts_kv_tokens"] if raw and c["accounts_kv_tokens"] else None
        console.print(f"vllm {c['edited'] or c['model']}: its {c['kv_cache_gib']} GiB KV cache holds {raw or 0:,} tokens "
                      f"in {c['num_blocks'] or 0:,} blocks ({c['max_concurrency_4096'] or 0:.2f} requests of 4,096 at "
                      f"once; vLLM's own figure at {c['max_model_len']:,}: {c['kv_cache_tokens'] or 0:,} tokens, "
                      f"{c['max_concurrency'] or 0:.2f}x); the accounts: {c['accounts_kv_tokens']:,} tokens"
                      + (f" ({agree:.3f}x)" if agree else "") + f"  [{c['command']}]")
    seen = set()
    for r in result.rows:
        for note in r.notes:
            if (r.engine, r.edited, note) not in seen:
                seen.add((r.engine, r.edited, note))
                console.print(f"[dim]{r.engine} {r.edited or r.model}: {note}[/dim]")
    for engine, why in result.skipped.items():
        console.print(f"[yellow]{engine} did not run: {why}[/yellow]")
    console.print("[dim]prefill tok/s: batch x context / time to every row's first new token; decode tok/s: "
                  f"batch x {result.settings['new_tokens'] - 1} / the time after it. Predicted: KV bytes, FLOPs "
                  "(prefill), bytes read per step (decode): headcount.cost.edited[/dim]")
