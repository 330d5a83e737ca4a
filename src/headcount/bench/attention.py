"""`headcount bench attention`: headcount's fused and eager paths against the inline-SDPA floor and
torch.nn.MultiheadAttention, CPU fp32, B=1, d_model=512, n_heads=8; then the peak memory of each path
at T=4096, n_heads=32, each in its own process (the same measurement `headcount cost --measure` uses)."""

from __future__ import annotations

import json
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from headcount import MultiHeadAttention
from headcount.bench.timing import paired_medians

CONTENDERS = ("inline SDPA (floor)", "headcount fused", "torch.nn.MultiheadAttention", "headcount eager")


def _inline_sdpa(x, w_qkv, b_qkv, w_o, b_o, n_heads):
    """The same projections written inline around F.scaled_dot_product_attention."""
    B, T, D = x.shape
    qkv = F.linear(x, w_qkv, b_qkv).view(B, T, 3, n_heads, D // n_heads)  # (B, T, 3, nh, dh)
    q, k, v = qkv.unbind(2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, nh, T, dh)
    return F.linear(o.transpose(1, 2).reshape(B, T, D), w_o, b_o)


def time_table(seq_lens=(256, 1024, 4096), *, d_model=512, n_heads=8, repeats=7, progress=None) -> list[dict]:
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model, n_heads).eval()
    torch_mha = attn.to_torch().eval()
    w = (attn.qkv_proj.weight, attn.qkv_proj.bias, attn.o_proj.weight, attn.o_proj.bias)
    rows = []
    for T in seq_lens:
        x = torch.randn(1, T, d_model)
        with torch.inference_mode():
            want = _inline_sdpa(x, *w, n_heads)
            for name, got in (("fused", attn(x).output), ("eager", attn(x, need_weights=True).output),
                              ("torch", torch_mha(x, x, x, need_weights=False)[0])):
                err = (got - want).abs().max().item()
                if err > 1e-4:
                    raise RuntimeError(f"bench: {name} disagrees with inline SDPA by {err:.2e} at T={T}")
            fns = {
                CONTENDERS[0]: lambda: _inline_sdpa(x, *w, n_heads),
                CONTENDERS[1]: lambda: attn(x),
                CONTENDERS[2]: lambda: torch_mha(x, x, x, need_weights=False),
                CONTENDERS[3]: lambda: attn(x, need_weights=True),
            }
            res = paired_medians(fns, repeats=repeats, baseline=CONTENDERS[0])
        for name in CONTENDERS:
            rows.append({"T": T, "impl": name, **res[name]})
        if progress:
            progress(T)
    return rows


def memory_table(T=4096, d_model=512, n_heads=32) -> list[dict]:
    """Peak memory one forward adds, each path in its own process (headcount.cost.measure.peak_memory)."""
    from headcount.cost.measure import peak_memory

    score_bytes = n_heads * T * T * 4
    return [{"path": path, "peak_above_inputs_bytes": peak_memory(n_heads, T, head_dim=d_model // n_heads,
                                                                  eager=path == "eager")["peak_bytes"],
             "score_matrix_bytes_formula": score_bytes} for path in ("fused", "eager")]


def main(repeats: int = 7, seq_lens=(256, 1024, 4096), as_json: bool = False) -> dict:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"timing {len(seq_lens)} lengths x {repeats} paired repeats", total=len(seq_lens) + 1)
        rows = time_table(seq_lens, repeats=repeats, progress=lambda _: bar.advance(task))
        mem = memory_table()
        bar.advance(task)
    result = {"timing": rows, "memory": mem, "torch": torch.__version__, "threads": torch.get_num_threads()}
    if as_json:
        print(json.dumps(result, indent=2))
        return result
    table = Table(title=f"MultiHeadAttention forward, CPU fp32, B=1, d_model=512, n_heads=8 "
                        f"(medians of {repeats} paired runs, {torch.get_num_threads()} threads)")
    for col in ("T", "implementation", "median ms", "x inline SDPA"):
        table.add_column(col, justify="right" if col != "implementation" else "left")
    for r in rows:
        table.add_row(str(r["T"]), r["impl"], f"{r['median_s'] * 1e3:.2f}", f"{r['ratio']:.3f}")
    console.print(table)
    by = {(r["T"], r["impl"]): r for r in rows}
    for T in seq_lens:
        speedup = statistics.median(a / b for a, b in zip(by[(T, CONTENDERS[2])]["times"],
                                                          by[(T, CONTENDERS[1])]["times"]))
        console.print(f"T={T}: headcount fused is {speedup:.2f}x faster than torch.nn.MultiheadAttention "
                      "(median of paired per-run ratios)")
    mt = Table(title="Peak memory above inputs, T=4096, n_heads=32, d_model=512, fp32 (own process each)")
    for col in ("path", "peak MiB", "score matrix (formula) MiB"):
        mt.add_column(col, justify="right")
    for r in mem:
        mt.add_row(r["path"], f"{r['peak_above_inputs_bytes'] / 2**20:.1f}",
                   f"{r['score_matrix_bytes_formula'] / 2**20:.0f}")
    console.print(mt)
    return result


if __name__ == "__main__":
    main()
