"""How much local reconstruction does every-layer MQA on smollm2 need? (The target: merge-kv within 3 minutes.)

Every layer merged to 1 KV head (aware, 16 calibration windows of 512), with `local_steps` in --steps;
held-out perplexity on prose, code and standard-library source (4 windows of 512 each), the merge's
seconds and forward-equivalents. One JSON line per setting.

    python benchmarks/merge_budget.py --steps 0,20,40
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

from headcount.analysis.batches import token_windows
from headcount.data import held_out_domains
from headcount.models import load
from headcount.models.evaluation import evaluate_perplexity
from headcount.surgery import merge_kv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="0,20,40")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--eval", type=int, default=4)
    args = ap.parse_args()
    base = load("smollm2")
    held = {k: token_windows(base, v, window=512, max_windows=args.eval) for k, v in held_out_domains().items()}

    def ppl(m, w):
        return evaluate_perplexity(m, w.reshape(-1).tolist(), 512, batch_size=4).perplexity

    print(json.dumps({"name": "base", "held_out": {k: ppl(base, w) for k, w in held.items()}}), flush=True)
    for steps in [int(s) for s in args.steps.split(",")]:
        model = copy.deepcopy(base)
        res = merge_kv(model, 1, uptrain_steps=0, n_windows=args.windows, local_steps=steps, progress=False)
        row = {"local_steps": steps, "seconds": round(res.seconds, 1),
               "forward_equivalents": getattr(res, "forward_equivalents", None),
               "held_out": {k: ppl(model, w) for k, w in held.items()}}
        print(json.dumps(row), flush=True)
        print(row, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
