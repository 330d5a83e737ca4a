"""Where a KV budget goes: the plan merge_plan chooses with and without drops, at several budgets, from one
sensitivity table (measured once and kept under $HEADCOUNT_CACHE/merge-sensitivity, the same table
`headcount merge-kv --budget B --allow-drop` measures and reads back).

For every budget: the layers merged (to how many K/V heads), the layers whose attention is dropped, the KV bytes
per token and the plan's predicted cost (the summed single-layer costs: mean KL to the unedited model with
by="kl"). A budget only drops reach (below one K/V head in every layer) prints "unreachable" without them.

    python benchmarks/kv_plans.py --model qwen2.5-coder-0.5b --budgets 0.9,0.75,0.5,0.25
"""

from __future__ import annotations

import argparse
import json

from headcount.models import load
from headcount.surgery.merging.planner import merge_plan, parse_budget
from headcount.surgery.merging.sensitivity_cache import cache_root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--budgets", default="0.9,0.75,0.5,0.25")
    ap.add_argument("--sensitivity", default="auto")
    args = ap.parse_args()
    model = load(args.model)
    table = merge_plan(model, 1.0, by=args.sensitivity, cache=cache_root(), drops=True)
    for text in args.budgets.split(","):
        budget = parse_budget(text)
        for drops in (False, True):
            try:
                plan = merge_plan(model, budget, sensitivity_from=table, drops=drops)
            except ValueError as e:
                print(json.dumps({"budget": text, "drops": drops, "unreachable": str(e)}))
                continue
            print(json.dumps({"budget": text, "drops": drops, "by": plan.by,
                              "kv_bytes_per_token": [plan.kv_bytes_per_token_before, plan.kv_bytes_per_token_after],
                              "predicted": round(plan.predicted_loss_increase, 4),
                              "merged": {str(k): v for k, v in plan.merged.items()}, "dropped": plan.dropped}))


if __name__ == "__main__":
    main()
