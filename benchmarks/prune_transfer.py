"""Which pruning defaults hold on text nobody calibrated on?

smollm2, 20% of query heads, several (order, calibration, compensation, ridge) candidates. Each candidate is
CHOSEN by validation perplexity on calibration-part windows it was not fitted on (prose and code, the
cross-domain validation), and REPORTED on three held-out texts: prose, code and standard-library source
(a domain no calibration and no choice sees). One JSON line per candidate on stdout.

    python benchmarks/prune_transfer.py [--windows 8] [--eval 4] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

from headcount.analysis.batches import mixed_token_windows, token_windows
from headcount.data import code_corpus, default_corpus, held_out_domains
from headcount.models import load
from headcount.models.evaluation import evaluate_perplexity
from headcount.surgery import prune_to

CANDIDATES = {
    "recon-prose-lstsq": dict(order="reconstruction", calibration="prose", compensate="lstsq", ridge=0.05),
    "recon-mixed-lstsq": dict(order="reconstruction", calibration="mixed", compensate="lstsq", ridge=0.05),
    "grad-mixed-lstsq": dict(order="gradient", calibration="mixed", compensate="lstsq", ridge=0.05),
    "grad-mixed-none": dict(order="gradient", calibration="mixed", compensate="none"),
    "recon-mixed-ridge0.5": dict(order="reconstruction", calibration="mixed", compensate="lstsq", ridge=0.5),
    "grad-mixed-ridge0.5": dict(order="gradient", calibration="mixed", compensate="lstsq", ridge=0.5),
    "recon-mixed-local": dict(order="reconstruction", calibration="mixed", compensate="lstsq", ridge=0.05,
                              target="local"),
    "recon-mixed-mean": dict(order="reconstruction", calibration="mixed", compensate="mean"),
    # the calibration size (its cost in prune's time budget): the then default 16 windows against 8 and 4
    "recon-prose-lstsq-16": dict(order="reconstruction", calibration="prose", compensate="lstsq", ridge=0.05,
                                 windows=16),
    "recon-mixed-lstsq-16": dict(order="reconstruction", calibration="mixed", compensate="lstsq", ridge=0.05,
                                 windows=16),
    "recon-mixed-lstsq-4": dict(order="reconstruction", calibration="mixed", compensate="lstsq", ridge=0.05,
                                windows=4),
}
MAX_WINDOWS = 16


def ppl(model, windows) -> float:
    return evaluate_perplexity(model, windows.reshape(-1).tolist(), windows.shape[1], batch_size=4).perplexity


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=8, help="calibration windows of 512")
    ap.add_argument("--eval", type=int, default=4, help="windows of 512 per held-out / validation text")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    base = load("smollm2")
    w, n = 512, args.windows
    top = max(n, MAX_WINDOWS)
    prose_cal = token_windows(base, default_corpus().texts("calibration"), window=w, max_windows=top + args.eval)
    code_cal = token_windows(base, code_corpus().texts("calibration"), window=w, max_windows=top + args.eval)

    def calib(kind: str, k: int):
        return prose_cal[:k] if kind == "prose" else mixed_token_windows(base, k, window=w)

    # validation: calibration-part windows past those any candidate fits on (mixed uses the first k/2 of each)
    valid = {"prose": prose_cal[top:], "code": code_cal[top:]}
    held = {k: token_windows(base, v, window=w, max_windows=args.eval) for k, v in held_out_domains().items()}
    base_v = {k: ppl(base, v) for k, v in valid.items()}
    base_h = {k: ppl(base, v) for k, v in held.items()}
    print(json.dumps({"name": "base", "valid": base_v, "held_out": base_h}), flush=True)
    names = args.only.split(",") if args.only else list(CANDIDATES)
    for name in names:
        cfg = dict(CANDIDATES[name])
        cal = calib(cfg.pop("calibration"), cfg.pop("windows", n))
        model = copy.deepcopy(base)
        t0 = time.perf_counter()
        res = prune_to(model, args.fraction, calibration=cal, progress=False, **cfg)
        secs = time.perf_counter() - t0
        v = {k: ppl(model, x) for k, x in valid.items()}
        h = {k: ppl(model, x) for k, x in held.items()}
        row = {"name": name, "windows": cal.shape[0], "seconds": round(secs, 1), "forward_equivalents": res.forward_equivalents,
               "valid": v, "held_out": h,
               "valid_rel": {k: round(v[k] / base_v[k] - 1, 4) for k in v},
               "held_out_rel": {k: round(h[k] / base_h[k] - 1, 4) for k in h}}
        print(json.dumps(row), flush=True)
        print(f"{name}: valid {row['valid_rel']} held-out {row['held_out_rel']} ({secs:.0f} s)", file=sys.stderr,
              flush=True)


if __name__ == "__main__":
    main()
