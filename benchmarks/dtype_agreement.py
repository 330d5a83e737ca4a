"""Does the dissection depend on the weights' dtype? (The targets: Spearman >= 0.99 against fp32, pruning
perplexity within 1% of fp32's.)

The same model loaded in fp32 and in bf16 (and fp16 with --dtypes): importance by gradient and by
reconstruction on the same calibration windows (Spearman of the head orders against fp32's), then
prune_to(0.2) with the defaults in each dtype (heads chosen: Jaccard against fp32's) and its held-out prose
perplexity (in the model's own dtype, and the bf16-pruned weights evaluated in fp32), plus the time of
one forward pass per dtype (CPU bf16 runs as bf16 matmuls: no upcast; the time says what that costs).

    python benchmarks/dtype_agreement.py [--model smollm2] [--windows 8] [--eval 4] [--dtypes bf16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from scipy.stats import spearmanr

from headcount.analysis import importance
from headcount.analysis.batches import token_windows
from headcount.models import load
from headcount.models.evaluation import evaluate_perplexity
from headcount.surgery import prune_to

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def ppl(model, windows) -> float:
    return evaluate_perplexity(model, windows.reshape(-1).tolist(), windows.shape[1], batch_size=2).perplexity


def flat(scores) -> list[float]:
    return [v for row, n in zip(scores.scores.tolist(), scores.heads_per_layer) for v in row[:n]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--eval", type=int, default=4)
    ap.add_argument("--dtypes", default="bf16")
    args = ap.parse_args()
    ref = load(args.model)
    cal = token_windows(ref, None, window=512, max_windows=args.windows)
    held = token_windows(ref, None, window=512, max_windows=args.eval, part="held_out")
    results: dict = {}
    for name in ["fp32"] + args.dtypes.split(","):
        model = ref if name == "fp32" else load(args.model, dtype=DTYPES[name])
        row: dict = {"dtype": name}
        with torch.no_grad():
            model(cal[:1], compute_logits=False)
            t0 = time.perf_counter()
            model(cal[:1], compute_logits=False)
            row["forward_s"] = round(time.perf_counter() - t0, 3)
        for method in ("gradient", "reconstruction"):
            s = importance(model, method=method, windows=cal, max_windows=None, progress=False)
            row[method] = flat(s)
        pruned = load(args.model, dtype=DTYPES[name])
        t0 = time.perf_counter()
        res = prune_to(pruned, 0.2, calibration=cal, progress=False)
        row["prune_s"] = round(time.perf_counter() - t0, 1)
        row["removed"] = sorted((int(l), h) for l, hs in res.removed.items() for h in hs)
        row["held_out_ppl"] = ppl(pruned, held)
        if name != "fp32":
            row["held_out_ppl_in_fp32"] = ppl(pruned.float(), held)
        results[name] = row
        base = results["fp32"]
        out = {"dtype": name, "forward_s": row["forward_s"], "prune_s": row["prune_s"],
               "held_out_ppl": round(row["held_out_ppl"], 4)}
        if name != "fp32":
            for method in ("gradient", "reconstruction"):
                out[f"spearman_{method}"] = round(float(spearmanr(base[method], row[method]).statistic), 4)
            a, b = set(map(tuple, base["removed"])), set(map(tuple, row["removed"]))
            out["jaccard_removed"] = round(len(a & b) / len(a | b), 4)
            out["ppl_rel_vs_fp32"] = round(row["held_out_ppl"] / base["held_out_ppl"] - 1, 5)
            out["ppl_in_fp32_rel_vs_fp32"] = round(row["held_out_ppl_in_fp32"] / base["held_out_ppl"] - 1, 5)
            out["forward_ratio_vs_fp32"] = round(row["forward_s"] / base["forward_s"], 2)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
