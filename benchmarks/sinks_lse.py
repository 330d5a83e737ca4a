"""Per-head sinks on the fused path (GPT-OSS): what keeping the sink costs on the CPU.

    python benchmarks/sinks_lse.py [T]

Times kernels.attend on one causal layer (8 query heads x 64, 2 KV heads): SDPA without a sink; with sinks
and no gradient (the CPU flash kernel's own logsumexp, one fused call); with sinks and a gradient (SDPA plus
the chunked, differentiable logsumexp: never [T, T] scores at once); and the eager path (explicit weights,
the sink as one more column). Prints the max |fused - eager| and the medians of 5 runs.
"""

import sys
import time

import torch

from headcount import kernels


def median_seconds(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2]


def main(tgt_len: int = 2048) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, n, tgt_len, 64) for n in (8, 2, 2))
    sinks = torch.randn(8)
    qg = q.clone().requires_grad_(True)  # a gradient wanted: the chunked logsumexp path
    with torch.no_grad():
        eager, _ = kernels.attend(q, k, v, is_causal=True, need_weights=True, sinks=sinks)
        fused, _ = kernels.attend(q, k, v, is_causal=True, sinks=sinks)
        plain = median_seconds(lambda: kernels.attend(q, k, v, is_causal=True))
        kernel = median_seconds(lambda: kernels.attend(q, k, v, is_causal=True, sinks=sinks))
        explicit = median_seconds(lambda: kernels.attend(q, k, v, is_causal=True, need_weights=True, sinks=sinks))
    chunked = median_seconds(lambda: kernels.attend(qg, k, v, is_causal=True, sinks=sinks))
    with_grad, _ = kernels.attend(qg, k, v, is_causal=True, sinks=sinks)
    print(f"max |fused - eager| = {float((fused - eager).abs().max()):.1e}, "
          f"with grad {float((with_grad.detach() - eager).abs().max()):.1e}")
    print(f"T={tgt_len}: SDPA, no sink {plain * 1e3:.0f} ms | sinks, CPU kernel's LSE {kernel * 1e3:.0f} ms | "
          f"sinks with grad, SDPA + chunked LSE {chunked * 1e3:.0f} ms (forward) | eager {explicit * 1e3:.0f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
