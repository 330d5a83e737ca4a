"""The numbers for the models people ship: the roles found on each model, and the pruning curve at
10 / 20 / 30% with the DEFAULT settings (prune_to's default order, compensation and calibration), held-out
perplexity on prose, code and standard-library source (4 windows of 512 each). One JSON line per result.

    python benchmarks/new_models.py [--models qwen2.5-coder-0.5b,gemma3-270m] [--parts roles,prune]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

from headcount.analysis import roles
from headcount.analysis.batches import token_windows
from headcount.data import held_out_domains
from headcount.models import load
from headcount.models.evaluation import evaluate_perplexity
from headcount.surgery import prune_to


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen2.5-coder-0.5b,gemma3-270m")
    ap.add_argument("--parts", default="roles,prune")
    ap.add_argument("--fractions", default="0.1,0.2,0.3")
    ap.add_argument("--eval", type=int, default=4)
    args = ap.parse_args()
    for name in args.models.split(","):
        base = load(name)
        if "roles" in args.parts:
            t0 = time.perf_counter()
            r = roles(base, progress=False).to_json()
            heads = {role: r[role].get("heads") for role in r}
            print(json.dumps({"model": name, "part": "roles", "seconds": round(time.perf_counter() - t0, 1),
                              "heads": heads}), flush=True)
        if "prune" in args.parts:
            held = {k: token_windows(base, v, window=512, max_windows=args.eval)
                    for k, v in held_out_domains().items()}

            def ppl(m):
                return {k: evaluate_perplexity(m, w.reshape(-1).tolist(), 512, batch_size=2).perplexity
                        for k, w in held.items()}

            before = ppl(base)
            print(json.dumps({"model": name, "part": "base", "ppl": before}), flush=True)
            for fraction in [float(f) for f in args.fractions.split(",")]:
                model = copy.deepcopy(base)
                t0 = time.perf_counter()
                res = prune_to(model, fraction, progress=False)
                secs = time.perf_counter() - t0
                after = ppl(model)
                row = {"model": name, "part": "prune", "fraction": fraction, "heads_removed": res.heads_removed,
                       "order": res.order, "compensate": res.compensate, "seconds": round(secs, 1),
                       "forward_equivalents": res.forward_equivalents, "ppl": after,
                       "rel": {k: round(after[k] / before[k] - 1, 4) for k in after}}
                print(json.dumps(row), flush=True)
                print(row, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
