"""Retraining-free pruning that holds on GQA models: which per-layer limits on the reconstruction
order keep the curve monotone? One JSON line per (fraction, candidate) on stdout.

The order (reconstruction, on the default "mixed" calibration of 8 x 512 tokens) is scored ONCE; each
candidate only changes the plan (plan.plan_fraction's `protect` / `max_share`), so a plan already measured is
not pruned again. Each pruned copy is CHOSEN by validation perplexity on calibration-part windows no candidate
fits on (prose and code-like, past the first 16 windows of each), and REPORTED on the three held-out domains
(4 x 512 tokens each, what `headcount prune` measures).

    python benchmarks/prune_gqa.py --model qwen2.5-coder-0.5b --fractions 0.1,0.2,0.3 \
        --candidates none,protect,cap50,protect+cap50
    (a candidate's parts: none, protect, capNN = max_share NN%, bias / nobias = the refit's o_proj bias)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from headcount.analysis.batches import token_windows
from headcount.analysis.outliers import residual_outliers
from headcount.data import code_corpus, default_corpus, held_out_domains
from headcount.models import load
from headcount.models.copying import attention_copy
from headcount.models.evaluation import evaluate_perplexity
from headcount.surgery.pruning import plan as _plan
from headcount.surgery.pruning.removal import calibration_batches, prune, resolve_scores

TOP = 16  # calibration windows any fit may use (per kind); validation starts past them


def ppl(model, windows) -> float:
    return evaluate_perplexity(model, windows.reshape(-1).tolist(), windows.shape[1], batch_size=4).perplexity


def candidate(name: str, protected: list[int]) -> tuple[list[int], float | None, bool | None]:
    protect, share, bias = [], None, None
    for part in name.split("+"):
        if part == "protect":
            protect = protected
        elif part in ("bias", "nobias"):
            bias = part == "bias"
        elif part.startswith("cap"):
            share = int(part[3:]) / 100
        elif part != "none":
            raise SystemExit(f"--candidates: unknown part {part!r} (none, protect, capNN, bias, nobias)")
    return protect, share, bias


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--fractions", default="0.1,0.2,0.3")
    ap.add_argument("--candidates", default="none,protect,protect+cap50")
    ap.add_argument("--valid", type=int, default=2, help="validation windows of 512 per kind (prose, code)")
    ap.add_argument("--eval", type=int, default=4, help="held-out windows of 512 per domain")
    ap.add_argument("--bias", default="auto", choices=("auto", "yes", "no"), help="the refit's o_proj bias")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    base = load(args.model)
    w = 512
    cal = calibration_batches(base, None)  # the default: mixed, 8 windows
    valid = {"prose": token_windows(base, default_corpus().texts("calibration"), window=w,
                                    max_windows=TOP + args.valid)[TOP:],
             "code": token_windows(base, code_corpus().texts("calibration"), window=w, max_windows=TOP + args.valid)[TOP:]}
    held = {k: token_windows(base, v, window=w, max_windows=args.eval) for k, v in held_out_domains().items()}
    base_v = {k: ppl(base, v) for k, v in valid.items()}
    base_h = {k: ppl(base, v) for k, v in held.items()}
    profile = residual_outliers(base, cal[0][0])
    scores, _ = resolve_scores(base, "reconstruction", calibration=cal)
    print(json.dumps({"model": args.model, "base_valid": base_v, "base_held_out": base_h,
                      "outliers": profile.to_json(), "setup_seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    bias = None if args.bias == "auto" else args.bias == "yes"
    done: dict = {}
    for frac in [float(f) for f in args.fractions.split(",")]:
        for name in args.candidates.split(","):
            protect, share, bias_here = candidate(name, profile.protected)
            bias_here = bias if bias_here is None else bias_here
            plan = _plan.plan_fraction(base, frac, scores, protect=protect, max_share=share)
            key = json.dumps([plan, bias_here], sort_keys=True)
            if key in done:
                row = dict(done[key], candidate=name, same_plan_as=done[key]["candidate"])
                print(json.dumps(row), flush=True)
                continue
            t = time.perf_counter()
            model = attention_copy(base)
            prune(model, plan, calibration=cal, progress=False, bias=bias_here)
            v = {k: ppl(model, x) for k, x in valid.items()}
            h = {k: ppl(model, x) for k, x in held.items()}
            row = {"fraction": frac, "candidate": name, "protect": protect, "max_share": share,
                   "per_layer": {str(l): len(hs) for l, hs in plan.items()},
                   "valid_rel": {k: round(v[k] / base_v[k] - 1, 4) for k in v},
                   "valid_worst": round(max(v[k] / base_v[k] - 1 for k in v), 4),
                   "held_out_rel": {k: round(h[k] / base_h[k] - 1, 4) for k in h},
                   "held_out": h, "seconds": round(time.perf_counter() - t, 1)}
            done[key] = row
            print(json.dumps(row), flush=True)
            print(f"{args.model} {frac} {name}: valid {row['valid_rel']} held-out {row['held_out_rel']} "
                  f"({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
            del model


if __name__ == "__main__":
    main()
