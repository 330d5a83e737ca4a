"""`headcount bench parallel`: SmolLM2 fp32, one process with 2 threads vs 2 ranks (gloo) with 1 thread
each, side by side in one run (interleaved repeat by repeat): prefill and decode time, the bytes all-reduced per token against the
formula, and what the formula predicts for Llama 3 70B on 8 GPUs over NVLink.

On two CPU cores no speed-up is expected: both sides use the same two cores, and the ranks add two
all-reduces per layer through gloo's TCP loopback. The point is the honest size of that overhead, and
that the measured bytes are the formula's: 2 x d_model x 4 bytes per token per layer.

The model is loaded once and handed to the ranks through shared memory (transfer.py). Each side runs
`headcount.models.generate` (KV cache, packed oneDNN weights) on the same prompt: a warm-up, then
`repeats` timed runs, alternating sides so both meet the same load; medians are reported, with the
machine's load average (this machine is shared).
"""

from __future__ import annotations

import os
import statistics

# Stated assumptions for the 8-GPU prediction (H100 SXM, one node, NVLink 4 through NVSwitch).
NVLINK = {
    "gpus": 8,
    "allreduce_bus_bandwidth_GBps": 360.0,  # NCCL all-reduce bus bandwidth for large messages (~80% of 450 GB/s)
    "allreduce_latency_us": 10.0,  # one small all-reduce (16 KiB) over NVLink, launch included
    "hbm_bandwidth_TBps": 3.35,  # H100 SXM HBM3: decode at batch 1 reads every weight once per token
    "bf16_tflops_achieved": 600.0,  # ~60% of the 989 TFLOPS dense bf16 peak, for prefill
    "seq": 8192,
}


def _paired(payload, ids: list[int], new_tokens: int, repeats: int) -> dict:
    """Both sides inside one group, interleaved so they meet the same load: per repeat, rank 0 runs the
    whole model with 2 threads while rank 1 waits at a barrier, then both ranks run their shards with
    1 thread each. The all-reduces of the sharded runs are counted."""
    import torch
    import torch.distributed as dist

    from headcount.models import generate
    from headcount.parallel import shard
    from headcount.parallel.model import tensor_parallel
    from headcount.parallel.transfer import rebuild

    rank = dist.get_rank()
    full = rebuild(payload) if rank == 0 else None  # the parent's weights, mapped, not copied
    model = tensor_parallel(rebuild(payload))

    def one_process(threads: int):
        torch.set_num_threads(threads)
        try:
            return generate(full, ids, new_tokens, stop_at_eos=False)
        finally:
            torch.set_num_threads(1)

    if rank == 0:
        torch.set_num_threads(2)
        generate(full, ids[:16], 4, stop_at_eos=False)
        torch.set_num_threads(1)
    generate(model, ids[:16], 4, stop_at_eos=False)
    single, single1, sharded = [], [], []
    for _ in range(repeats):
        dist.barrier()
        if rank == 0:
            r = one_process(2)
            single.append({"prefill_s": r.prefill_s, "decode_s": r.decode_s, "tokens": r.new_ids})
            r = one_process(1)
            single1.append({"prefill_s": r.prefill_s, "decode_s": r.decode_s, "tokens": r.new_ids})
        dist.barrier()
        shard.STATS.update(calls=0, bytes=0, seconds=0.0)
        r = generate(model, ids, new_tokens, stop_at_eos=False)
        sharded.append({"prefill_s": r.prefill_s, "decode_s": r.decode_s, "tokens": r.new_ids, **shard.STATS})
    return {"single": single, "single_1_thread": single1, "sharded": sharded,
            "kv_heads": len(model.layers[0].attn.shard_plan.kv_heads),
            "query_heads": len(model.layers[0].attn.shard_plan.query_heads)}


def nvlink_prediction() -> dict:
    """Llama 3 70B, bf16, 8 ranks: all-reduce time per token (decode) and per 8k prefill, from the formula."""
    from headcount.cost import flop_counts, get_preset
    from headcount.cost.parallel import per_rank

    a = NVLINK
    shape = get_preset("llama-3-70b").shape
    tp = per_rank(shape, a["gpus"], seq=a["seq"], dtype="bf16")
    rank0 = tp["per_rank"][0]
    n, layers = a["gpus"], shape.n_layers
    per_call = shape.d_model * 2  # one all-reduce: d_model bf16 values per token
    calls = tp["summary"]["allreduces_per_layer"] * layers
    ring = 2 * (n - 1) / n
    bw, lat = a["allreduce_bus_bandwidth_GBps"] * 1e9, a["allreduce_latency_us"] * 1e-6
    decode_comm = calls * (lat + ring * per_call / bw)
    decode_compute = rank0["weights_bytes"] / (a["hbm_bandwidth_TBps"] * 1e12)
    prefill_comm = calls * (lat + ring * per_call * a["seq"] / bw)
    prefill_flops = flop_counts(shape, 1, a["seq"])["total_causal"] / n
    prefill_compute = prefill_flops / (a["bf16_tflops_achieved"] * 1e12)
    return {
        "model": shape.name, "assumptions": a,
        "allreduce_bytes_per_token_per_layer": rank0["allreduce_bytes_per_token_per_layer"],
        "allreduce_bytes_per_token": tp["summary"]["allreduce_bytes_per_token"],
        "allreduces_per_token_step": calls,
        "decode_allreduce_ms_per_token": 1e3 * decode_comm,
        "decode_weight_read_ms_per_token": 1e3 * decode_compute,
        "decode_overhead": decode_comm / decode_compute,
        "prefill_allreduce_ms": 1e3 * prefill_comm,
        "prefill_compute_ms": 1e3 * prefill_compute,
        "prefill_overhead": prefill_comm / prefill_compute,
    }


def run(prompt_tokens: int = 256, new_tokens: int = 32, repeats: int = 3, *, log=None) -> dict:
    from headcount.cost import get_preset
    from headcount.cost.parallel import per_rank
    from headcount.data import default_corpus
    from headcount.models import load
    from headcount import distributed as runtime
    from headcount.parallel.transfer import share

    log = log or (lambda m: None)
    model = load("smollm2")
    corpus = default_corpus()
    ids = model.tokenizer.encode(corpus.calibration_text)[:prompt_tokens]
    if len(ids) < prompt_tokens:
        raise ValueError(f"--prompt-tokens: the corpus has only {len(ids)} tokens")
    if prompt_tokens + new_tokens > model.max_position:
        raise ValueError(f"--prompt-tokens + --new-tokens: {prompt_tokens + new_tokens} is past the model's "
                         f"context of {model.max_position}")

    log(f"{repeats} x (prefill {prompt_tokens} tokens, decode {new_tokens}), alternating: one process with "
        "2 threads, then 2 ranks (gloo, 127.0.0.1) with 1 thread each")
    load_before = os.getloadavg()[0]
    ranks = runtime.spawn(_paired, 2, share(model), ids, new_tokens, repeats, threads=1, timeout_s=600)
    load_after = os.getloadavg()[0]
    single = ranks[0]["single"]

    shape = get_preset("smollm2").shape
    formula = per_rank(shape, 2, dtype="fp32")["per_rank"][0]["allreduce_bytes_per_token_per_layer"]
    processed = prompt_tokens + new_tokens - 1  # tokens that went through the layers (the last is not fed back)

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    r0 = ranks[0]["sharded"]
    measured = med(r0, "bytes") / processed / shape.n_layers
    tp = {
        "prefill_s": med(r0, "prefill_s"),
        "decode_tokens_per_s": (new_tokens - 1) / med(r0, "decode_s"),
        "allreduce_calls": r0[0]["calls"],
        "allreduce_bytes_per_token_per_layer": measured,
        "allreduce_share_of_time": med(r0, "seconds") / (med(r0, "prefill_s") + med(r0, "decode_s")),
        "query_heads": [r["query_heads"] for r in ranks], "kv_heads": [r["kv_heads"] for r in ranks],
    }
    one = {"prefill_s": med(single, "prefill_s"), "decode_tokens_per_s": (new_tokens - 1) / med(single, "decode_s")}
    single1 = ranks[0]["single_1_thread"]
    one1 = {"prefill_s": med(single1, "prefill_s"),
            "decode_tokens_per_s": (new_tokens - 1) / med(single1, "decode_s")}
    return {
        "model": "smollm2", "dtype": "fp32", "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
        "repeats": repeats, "gpu": "none: this machine has no GPU; the gloo ranks share its CPU cores",
        "load_average": [load_before, load_after],  # other work on the machine while measuring
        "one_process_2_threads": one,
        "two_ranks_1_thread": tp,
        "one_process_1_thread": one1,  # the baseline that oversubscription cannot spoil (no thread barriers)
        "tokens_equal": all(r["tokens"] == single[0]["tokens"] for r in r0),
        "prefill_slowdown": tp["prefill_s"] / one["prefill_s"],
        "decode_slowdown": one["decode_tokens_per_s"] / tp["decode_tokens_per_s"],
        "formula_allreduce_bytes_per_token_per_layer": formula,
        "nvlink_8_gpus": nvlink_prediction(),
    }


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    import sys

    console = Console(width=None if sys.stdout.isatty() else 160)
    one, tp = result["one_process_2_threads"], result["two_ranks_1_thread"]
    table = Table(title=f"SmolLM2 fp32 on CPU: prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new "
                        f"(medians of {result['repeats']})", title_justify="left")
    for col in ("", "prefill s", "decode tokens/s", "all-reduce B / token / layer", "time in all-reduce"):
        table.add_column(col, justify="left" if not col else "right")
    table.add_row("1 process, 2 threads", f"{one['prefill_s']:.3f}", f"{one['decode_tokens_per_s']:.1f}", "-", "-")
    one1 = result["one_process_1_thread"]
    table.add_row("1 process, 1 thread", f"{one1['prefill_s']:.3f}", f"{one1['decode_tokens_per_s']:.1f}", "-", "-")
    table.add_row("2 ranks x 1 thread (gloo)", f"{tp['prefill_s']:.3f}", f"{tp['decode_tokens_per_s']:.1f}",
                  f"{tp['allreduce_bytes_per_token_per_layer']:,.0f} (formula "
                  f"{result['formula_allreduce_bytes_per_token_per_layer']:,})",
                  f"{100 * tp['allreduce_share_of_time']:.0f}%")
    console.print(table)
    console.print(f"2 ranks vs 1 process: prefill x{result['prefill_slowdown']:.2f} the time, decode "
                  f"x{result['decode_slowdown']:.2f} the time per token; tokens equal: "
                  f"{'yes' if result['tokens_equal'] else 'NO'}. {result['gpu']}; load average "
                  f"{result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f} while measuring.")
    p = result["nvlink_8_gpus"]
    a = p["assumptions"]
    console.print(f"[bold]formula, {p['model']} bf16 on {a['gpus']} GPUs over NVLink[/bold] (assumed: all-reduce bus "
                  f"bandwidth {a['allreduce_bus_bandwidth_GBps']:.0f} GB/s, {a['allreduce_latency_us']:.0f} us per "
                  f"small all-reduce, HBM {a['hbm_bandwidth_TBps']} TB/s, {a['bf16_tflops_achieved']:.0f} TFLOPS "
                  "achieved):")
    console.print(f"  {p['allreduces_per_token_step']} all-reduces per step, {p['allreduce_bytes_per_token_per_layer']:,} "
                  f"B per token per layer; decode: {p['decode_allreduce_ms_per_token']:.2f} ms of all-reduce per "
                  f"token vs {p['decode_weight_read_ms_per_token']:.2f} ms reading the rank's weights "
                  f"(+{100 * p['decode_overhead']:.0f}%, latency-bound); prefill of {a['seq']:,} tokens: "
                  f"{p['prefill_allreduce_ms']:.0f} ms vs {p['prefill_compute_ms']:.0f} ms of matmuls "
                  f"(+{100 * p['prefill_overhead']:.0f}% unless overlapped)")
