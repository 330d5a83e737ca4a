"""Check the accounts against a run of headcount.MultiHeadAttention (`headcount cost --measure`).

torch is imported inside the functions only: `import headcount.cost` stays torch-free.

- parameters: sum(p.numel()) of the module == attention_params(shape)["total"], exactly.
- FLOPs: torch.utils.flop_counter.FlopCounterMode on the EAGER path (need_weights=True: explicit
  matmuls it can see) == attention_flops(shape, B, n), exactly. Its traps, shown rather than hidden:
  it never halves causal attention (the causal run counts the full formula), and on CPU it may count
  the fused SDPA kernel as 0 FLOPs.
- KV cache: attn.new_cache(B, n, dtype).nbytes == kv_cache(one layer), exactly, for MHA, GQA and MQA; for a
  model with sliding windows also on a local layer (a SlidingKVCache of min(n, window) positions).
- score memory: the eager path's peak resident memory, each point in its own Python process (Linux
  /proc/self/clear_refs resets the high-water mark after warm-up; VmHWM - VmRSS is the peak the
  forward added; elsewhere ru_maxrss deltas), against 2 x B x n_heads x n^2 x 4 bytes (fp32 scores
  and softmax output), within 10%. The fused path's peak must not quadruple when n doubles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from headcount.cost.accounts import attention_flops, attention_params, kv_cache, score_memory
from headcount.cost.shape import FULL, LOCAL, CostError, ModelShape, parse_dtype

MEMORY_TOLERANCE = 0.10
# The score-memory grid: (n_heads, n) for the eager path with head_dim 8 (d_model = 8 n_heads, so the
# O(n d) tensors are < 1% of the n^2 ones), and n, 2n for the fused path with head_dim 64.
EAGER_GRID = ((2, 2048), (8, 2048), (2, 4096))
FUSED_GRID = ((8, 2048), (8, 4096))
MEASURE_LIMIT_BYTES = 2 * 1024**3  # --measure refuses shapes whose one-layer run needs more than this


def _row(check: str, measured, formula, ok, how: str = "") -> dict:
    return {"check": check, "measured": measured, "formula": formula, "ok": ok, "how": how}


def _supports(keyword: str) -> bool:
    """Whether headcount.MultiHeadAttention takes `keyword` (q/k norm: qk_norm_eps; windows: sliding_window)."""
    import inspect

    from headcount import MultiHeadAttention

    return keyword in inspect.signature(MultiHeadAttention.__init__).parameters


def buildable(shape: ModelShape) -> tuple[ModelShape, list[str]]:
    """The shape as MultiHeadAttention can build it, and what had to be left out (counted by formula only)."""
    left_out = []
    if shape.qk_norm and not _supports("qk_norm_eps"):
        left_out.append(f"q/k norm ({2 * shape.head_dim:,} parameters)")
        shape = shape.replace(qk_norm=False)
    if shape.sliding_window is not None and not _supports("sliding_window"):
        left_out.append(f"the {shape.sliding_window}-token window of {shape.local_layers} local layers")
        shape = shape.replace(sliding_window=None, layer_types=None)
    return shape, left_out


def build_attention(shape: ModelShape, **overrides):
    """A headcount.MultiHeadAttention with the shape's heads, head_dim, biases and q/k norm (fp32, CPU); a
    local layer (its sliding window) when the shape is one layer and that layer is local."""
    from headcount import MultiHeadAttention

    kwargs = dict(n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, bias=shape.attn_bias, o_bias=shape.o_bias)
    if shape.qk_norm:
        kwargs["qk_norm_eps"] = 1e-6
    if shape.n_layers == 1 and shape.is_local(0):
        kwargs["sliding_window"] = shape.sliding_window
    kwargs.update(overrides)
    return MultiHeadAttention(shape.d_model, shape.n_heads, **kwargs)


def one_layer_bytes(shape: ModelShape, batch: int, seq: int) -> int:
    """What --measure allocates for one attention layer in fp32: weights and the eager peak."""
    weights = attention_params(shape)["total_with_bias"] * 4
    return weights + score_memory(shape, batch, seq, 4)["eager_peak_per_layer"] + 8 * batch * seq * (
        shape.d_model + (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim) * 4


# ----------------------------------------------------------------------------------------- params
def measure_params(shape: ModelShape) -> list[dict]:
    """sum(p.numel()) against the formula, for the shape's biases, none, and all of them."""
    rows = []
    for label, bias, o_bias, key in (("as configured", shape.attn_bias, shape.o_bias, "total"),
                                     ("no bias", False, False, "total_without_bias"),
                                     ("every bias", True, True, "total_with_bias")):
        attn = build_attention(shape, bias=bias, o_bias=o_bias)
        measured = sum(p.numel() for p in attn.parameters())
        formula = attention_params(shape)[key]
        rows.append(_row(f"params, attention ({label})", measured, formula, measured == formula,
                         "sum(p.numel()) of headcount.MultiHeadAttention"))
    return rows


# ------------------------------------------------------------------------------------------ FLOPs
def count_flops(shape: ModelShape, batch: int, seq: int, *, causal: bool = False, need_weights: bool = True,
                attn=None) -> dict[str, int]:
    """FlopCounterMode's count of one forward, split by module: projections (qkv_proj), output
    (o_proj), and the rest (Q K^T and A V), plus the total."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    attn = attn if attn is not None else build_attention(shape)
    x = torch.randn(batch, seq, shape.d_model)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        attn(x, is_causal=causal, need_weights=need_weights)
    by_module = counter.get_flop_counts()

    def module_total(suffix: str) -> int:
        return sum(sum(ops.values()) for name, ops in by_module.items() if name.endswith(suffix))

    total = counter.get_total_flops()
    proj, out = module_total(".qkv_proj"), module_total(".o_proj")
    return {"projections": proj, "scores_and_read": total - proj - out, "output": out, "total": total}


def check_flops(shape: ModelShape, batch: int, seq: int, *,
                formula: Callable[..., dict] = attention_flops) -> list[dict]:
    """Measured (eager path) against `formula` (attention_flops unless a test passes a wrong one)."""
    measured = count_flops(shape, batch, seq)
    f = formula(shape, batch, seq)
    expect = {"projections": f["projections"], "scores_and_read": f["scores"] + f["read"], "output": f["output"],
              "total": f["total"]}
    how = {"projections": "X W_Q, X W_K, X W_V (qkv_proj)", "scores_and_read": "Q K^T and A V (eager bmm)",
           "output": "concat(heads) W_O (o_proj)", "total": "FlopCounterMode, need_weights=True"}
    return [_row(f"FLOPs, {key.replace('_', ' ')}", measured[key], expect[key], measured[key] == expect[key], how[key])
            for key in expect]


def flop_traps(shape: ModelShape, batch: int, seq: int) -> list[dict]:
    """What FlopCounterMode does with causal attention and with the fused kernel (informational)."""
    full, causal = attention_flops(shape, batch, seq), attention_flops(shape, batch, seq, causal=True)
    rows = []
    c = count_flops(shape, batch, seq, causal=True)["total"]
    rows.append(_row("FLOPs, causal run (counter)", c, full["total"], c == full["total"],
                     f"FlopCounterMode never halves: the causal formula is {causal['total']:,}"))
    fused = count_flops(shape, batch, seq, need_weights=False)
    rows.append(_row("FLOPs, fused SDPA path (counter)", fused["total"], full["total"], None,
                     f"scores + read counted as {fused['scores_and_read']:,} (0 = kernel not seen by the counter)"))
    return rows


# --------------------------------------------------------------------------------------- KV cache
def check_kv(shape: ModelShape, batch: int, seq: int, dtype: str = "bf16", *,
             kv_heads: tuple[int, ...] | None = None) -> list[dict]:
    """KVCache.nbytes of one layer == the formula's bytes_for_context / n_layers, for each KV head count."""
    import torch

    name, nbytes = parse_dtype(dtype)
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
                   "fp8": getattr(torch, "float8_e4m3fn", None)}.get(name)
    if torch_dtype is None:
        raise CostError(f"--measure: the KV cache check needs a floating torch dtype, not {name}")
    if kv_heads is None:  # MHA, GQA (when the head count allows one), MQA
        gqa = [g for g in range(2, shape.n_heads) if shape.n_heads % g == 0]
        kv_heads = tuple(dict.fromkeys([shape.n_heads, shape.n_kv_heads] + gqa[:1] + [1]))
    rows = []
    kinds = [FULL] + ([LOCAL] if shape.local_layers else [])  # a global layer, and a local one if the model has them
    for kind in kinds:
        for n_kv in kv_heads:
            variant = shape.replace(n_kv_heads=n_kv, n_layers=1, layer_types=(kind,) if shape.layer_types else None)
            attn = build_attention(variant)
            cache = attn.new_cache(batch, seq, torch_dtype)
            measured = cache.nbytes
            formula = kv_cache(variant, batch, seq, nbytes)["bytes_for_context"]
            where = f", local layer (window {shape.sliding_window})" if kind == LOCAL else ""
            rows.append(_row(f"KV cache, {variant.attention_kind} ({n_kv} KV head{'s' if n_kv > 1 else ''}), one "
                             f"layer{where}", measured, formula, measured == formula,
                             f"{type(cache).__name__}.nbytes, B={batch}, max_len={seq}, {name}"))
    return rows


# ----------------------------------------------------------------------------------- score memory
def status_kib(field: str) -> int | None:
    """A /proc/self/status field in KiB (VmRSS, VmHWM, ...), or None where there is no /proc."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _peak_child(args: dict) -> dict:
    """In a fresh process: the resident memory one forward adds at its peak, in bytes."""
    import resource

    import torch

    from headcount import MultiHeadAttention

    torch.set_num_threads(1)
    torch.manual_seed(0)
    h, n, hd, b, eager = args["n_heads"], args["seq"], args["head_dim"], args["batch"], args["eager"]
    attn = MultiHeadAttention(h * hd, h, n_kv_heads=args.get("n_kv_heads"), head_dim=hd, bias=False)
    x = torch.randn(b, n, h * hd)
    with torch.no_grad():
        attn(x[:, :16], need_weights=eager)  # warm-up: kernels, thread pools, allocator
        method = "VmHWM - VmRSS"
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset the peak-RSS high-water mark (Linux >= 4.0)
            before = status_kib("VmRSS")
        except OSError:
            before = None
        if before is None:
            method = "ru_maxrss delta"
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out, weights = attn(x, need_weights=eager)
        after = status_kib("VmHWM") if method.startswith("VmHWM") else \
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        del out, weights
    return {"peak_bytes": (after - before) * 1024, "method": method}


def peak_memory(n_heads: int, seq: int, *, head_dim: int = 8, batch: int = 1, eager: bool = True,
                n_kv_heads: int | None = None, timeout: float = 120.0) -> dict:
    """Run one forward of MultiHeadAttention(n_heads * head_dim, n_heads) in its own process; return
    {"peak_bytes": resident bytes it added at its peak, "method": how that was read}."""
    args = {"n_heads": n_heads, "seq": seq, "head_dim": head_dim, "batch": batch, "eager": eager,
            "n_kv_heads": n_kv_heads}
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "headcount.cost.measure", json.dumps(args)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"peak-memory child failed ({proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_score_memory(eager_grid=EAGER_GRID, fused_grid=FUSED_GRID, *, batch: int = 1) -> list[dict]:
    """Eager peak vs 2 B n_heads n^2 x 4 bytes (within 10%); fused peak must not quadruple when n doubles."""
    rows = []
    for h, n in eager_grid:
        shape = ModelShape(d_model=8 * h, n_heads=h, head_dim=8)
        formula = score_memory(shape, batch, n, 4)["eager_peak_per_layer"]
        got = peak_memory(h, n, head_dim=8, batch=batch, eager=True)
        ok = abs(got["peak_bytes"] - formula) <= MEMORY_TOLERANCE * formula
        rows.append(_row(f"score memory, eager, n_heads={h}, n={n}", got["peak_bytes"], formula, ok,
                         f"peak RSS added ({got['method']}), own process; formula: scores + softmax, fp32"))
    fused = []
    for h, n in fused_grid:
        got = peak_memory(h, n, head_dim=64, batch=batch, eager=False)
        fused.append((h, n, got["peak_bytes"]))
        eager_formula = score_memory(ModelShape(d_model=64 * h, n_heads=h, head_dim=64), batch, n, 4)
        rows.append(_row(f"score memory, fused, n_heads={h}, n={n}", got["peak_bytes"], 0,
                         got["peak_bytes"] < eager_formula["eager_per_layer"] / 4,
                         f"all of it O(n d); the eager scores alone would be {eager_formula['eager_per_layer']:,}"))
    for (h0, n0, p0), (h1, n1, p1) in zip(fused, fused[1:]):
        if h0 == h1 and n1 == 2 * n0:
            ratio = p1 / p0 if p0 else float("inf")
            rows.append(_row(f"fused growth, n {n0} -> {n1}", ratio, 4.0, ratio < 3.0,
                             "peak ratio when n doubles (n^2 growth would be 4)"))
    return rows


def run_all(shape: ModelShape, batch: int, seq: int, dtype: str = "bf16", *, memory: bool = True) -> list[dict]:
    """Every check for one shape's attention layer, plus the score-memory grid."""
    need = one_layer_bytes(shape, batch, seq)
    if need > MEASURE_LIMIT_BYTES:
        raise CostError(f"--measure runs one attention layer here: {shape.name} at batch {batch}, seq {seq} needs "
                        f"~{need / 1024**3:.1f} GiB; use a smaller --seq or shape (e.g. --seq 256)")
    rows = []
    shape, left_out = buildable(shape)
    if left_out:
        rows.append(_row("left out of the measured module", 0, None, None,
                         f"{' and '.join(left_out)}: MultiHeadAttention cannot build it here; counted by formula only"))
    # FLOPs on a global layer: the eager path computes every pair (a window only masks), as the formula does
    one_global = shape.replace(n_layers=1, layer_types=(FULL,) if shape.layer_types else None)
    rows += measure_params(one_global) + check_flops(one_global, batch, seq) + flop_traps(one_global, batch, seq)
    rows += check_kv(shape, batch, seq, dtype)
    if memory:
        rows += check_score_memory(batch=1)
    return rows


if __name__ == "__main__":  # the child process of peak_memory()
    print(json.dumps(_peak_child(json.loads(sys.argv[1]))))
