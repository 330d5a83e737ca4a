"""Which defaults should `headcount merge-kv --model smollm2 --kv-heads 1` use? (Within its time budget, and
holding on text nobody calibrated on.)

Every layer of smollm2 merged to ONE K/V head (MQA) under several candidate settings (calibration windows and
their prose / code mixture, local-reconstruction steps, an end-to-end distillation after the merge). Each
candidate is CHOSEN by validation perplexity on calibration-part windows that no fit sees (the last
VALIDATION windows of the prose and of the code-like calibration text; every fit takes windows from the
front), ranked by its WORST validation domain relative to the base model (as benchmarks/prune_transfer.py
did for pruning). Held-out text (prose, code, standard-library source) is measured only for the candidates
named with --report, once the choice is made.

    python benchmarks/merge_defaults.py [--only NAME,...] [--report NAME] [--save FILE]
    python benchmarks/merge_defaults.py --from benchmarks/results/merge_defaults.json   (the table again)

One JSON line per candidate on stdout (name, settings, seconds of the merge and of the uptrain, the merge's
forward_equivalents, validation perplexities and their ratio to the base); a table on stderr at the end.
Candidates that share the merge settings share one merge (the uptrain variants start from a copy of it).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

from headcount.analysis.batches import token_windows
from headcount.data import code_corpus, default_corpus, held_out_domains
from headcount.models import load
from headcount.models.evaluation import evaluate_perplexity
from headcount.surgery.merging.kv_merge import merge_kv
from headcount.surgery.merging.uptraining import uptrain

WINDOW = 512
VALIDATION = 8  # windows per domain, the last ones of each calibration text
MERGE_KEYS = ("windows", "prose", "local_steps", "local_lr", "local_tokens", "target")
DEFAULTS = dict(windows=16, prose=0.5, local_steps=60, local_lr=2e-3, local_tokens=None, target="local",
                uptrain_steps=0, uptrain_lr=1e-4, uptrain_window=256)

CANDIDATES = {
    "current": {},  # the CLI's defaults before this benchmark: 16 mixed windows, 60 local steps, no uptrain
    "up20": dict(uptrain_steps=20, uptrain_lr=3e-4),  # chosen: headcount merge-kv's defaults (merging/cli.py)
    "up40": dict(uptrain_steps=40, uptrain_lr=3e-4),
    "up40-lr1e-4": dict(uptrain_steps=40, uptrain_lr=1e-4),
    "up40-lr1e-3": dict(uptrain_steps=40, uptrain_lr=1e-3),
    "ls20": dict(local_steps=20),
    "ls20-up40": dict(local_steps=20, uptrain_steps=40, uptrain_lr=3e-4),
    "ls20-up40-lr1e-3": dict(local_steps=20, uptrain_steps=40, uptrain_lr=1e-3),
    "ls30-up40": dict(local_steps=30, uptrain_steps=40, uptrain_lr=3e-4),
    "ls0-up60": dict(local_steps=0, uptrain_steps=60, uptrain_lr=3e-4),
    "prose0.75": dict(prose=0.75),
    "prose0.25": dict(prose=0.25),
    "w24-ls40": dict(windows=24, local_steps=40),
    "lr4e-3": dict(local_lr=4e-3),
    # each local step on the first 256 tokens of its window (refine.causal_prefix): less than half the cost
    "t256-up20": dict(local_tokens=256, uptrain_steps=20, uptrain_lr=3e-4),
    "t256-ls80-up20": dict(local_tokens=256, local_steps=80, uptrain_steps=20, uptrain_lr=3e-4),
    "t256-lr3e-3-up20": dict(local_tokens=256, local_lr=3e-3, uptrain_steps=20, uptrain_lr=3e-4),
}


def windows_of(model, corpus) -> torch.Tensor:
    return token_windows(model, corpus.texts("calibration"), window=WINDOW)


def mixture(prose: torch.Tensor, code: torch.Tensor, n: int, frac: float) -> torch.Tensor:
    """n windows: round(n * frac) from the front of the prose, the rest from the front of the code,
    interleaved as evenly as the counts allow (any prefix is mixed too)."""
    n_prose = int(round(n * frac))
    n_code = n - n_prose
    rows, i, j = [], 0, 0
    for k in range(n):
        # take prose while its share so far is below frac
        if j >= n_code or (i < n_prose and (i + 0.5) / (k + 1) <= frac + 1e-9):
            rows.append(prose[i])
            i += 1
        else:
            rows.append(code[j])
            j += 1
    return torch.stack(rows)


def ppl(model, windows: torch.Tensor) -> float:
    return evaluate_perplexity(model, windows.reshape(-1).tolist(), windows.shape[1], batch_size=4).perplexity


def run_uptrain(model, teacher, cal: torch.Tensor, cfg: dict):
    win = cfg["uptrain_window"]
    pool = cal.reshape(-1, win) if WINDOW % win == 0 else cal
    return uptrain(model, cfg["uptrain_steps"], lr=cfg["uptrain_lr"], calibration=pool, batch_size=1,
                   teacher=teacher, progress=False)


def print_table(base_v: dict, rows: list[dict]) -> None:
    """The candidates ranked by their worst validation domain relative to the base model (stderr)."""
    print(f"\nbase: valid prose {base_v['prose']:.2f} code {base_v['code']:.2f}", file=sys.stderr)
    for row in sorted(rows, key=lambda r: r["worst_x_base"]):
        print(f"{row['name']:>16}  worst x{row['worst_x_base']:.3f}  prose {row['valid']['prose']:7.2f}  "
              f"code {row['valid']['code']:7.2f}  {row['merge_seconds'] + row['uptrain_seconds']:6.0f} s  "
              f"fwd-eq {row['forward_equivalents']}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="source", default=None, help="print the table of a saved results file and stop")
    ap.add_argument("--only", default=None, help="comma-separated candidate names (default: all)")
    ap.add_argument("--report", default=None, help="comma-separated candidates to ALSO measure on held-out text")
    ap.add_argument("--eval", type=int, default=4, help="held-out windows of 512 per domain (--report)")
    ap.add_argument("--save", default=None, help="append the JSON lines to this file")
    args = ap.parse_args()
    if args.source:
        with open(args.source) as fh:
            saved = json.load(fh)
        print_table(saved["base"]["valid"], saved["candidates"])
        return
    torch.manual_seed(0)
    base = load("smollm2")
    base.eval()
    prose_all = windows_of(base, default_corpus())
    code_all = windows_of(base, code_corpus())
    top = prose_all.shape[0] - VALIDATION  # fits take prose windows [0, top) and code windows [0, top)
    valid = {"prose": prose_all[top:], "code": code_all[top:top + VALIDATION]}
    prose_fit, code_fit = prose_all[:top], code_all[:top]
    base_v = {k: ppl(base, v) for k, v in valid.items()}
    report = set(args.report.split(",")) if args.report else set()
    held = None
    if report:
        from headcount.surgery.held_out import held_out_sets
        texts = held_out_domains()
        texts["prose"] = None
        held = held_out_sets(base, texts, args.eval, WINDOW)
    line = {"name": "base", "valid": base_v}
    if held:
        line["held_out"] = {k: ppl(base, v) for k, v in held.items()}
    print(json.dumps(line), flush=True)
    names = args.only.split(",") if args.only else list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"--only: unknown candidates {unknown}; expected some of {list(CANDIDATES)}")
    cache: dict = {}
    rows = []
    for name in names:
        cfg = {**DEFAULTS, **CANDIDATES[name]}
        key = tuple(cfg[k] for k in MERGE_KEYS)
        cal = mixture(prose_fit, code_fit, cfg["windows"], cfg["prose"])
        if key not in cache:
            model = copy.deepcopy(base)
            t0 = time.perf_counter()
            res = merge_kv(model, 1, uptrain_steps=0, calibration=cal, n_windows=cal.shape[0], local_steps=cfg["local_steps"],
                           local_lr=cfg["local_lr"], local_tokens=cfg["local_tokens"], target=cfg["target"],
                           progress=False)
            cache = {key: (model, time.perf_counter() - t0, res.forward_equivalents)}  # keep one merge
        merged, merge_s, fe = cache[key]
        model = copy.deepcopy(merged)
        up_s, up_fe, up = 0.0, 0.0, None
        if cfg["uptrain_steps"]:
            up = run_uptrain(model, base, cal, cfg)
            up_s = up.seconds
            up_fe = 4.0 * up.tokens / cal.numel()  # student forward + backward (3) and the teacher's forward (1)
        v = {k: ppl(model, x) for k, x in valid.items()}
        rel = {k: round(v[k] / base_v[k], 3) for k in v}
        row = {"name": name, "settings": cfg, "merge_seconds": round(merge_s, 1), "uptrain_seconds": round(up_s, 1),
               "forward_equivalents": round(fe + up_fe, 2), "valid": v, "valid_x_base": rel,
               "worst_x_base": max(rel.values()),
               "uptrain_loss": [round(up.loss_first, 4), round(up.loss_last, 4)] if up else None}
        if name in report and held:
            row["held_out"] = {k: ppl(model, x) for k, x in held.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.save:
            with open(args.save, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        print(f"{name}: valid prose {v['prose']:.2f} code {v['code']:.2f} (worst x{row['worst_x_base']}) "
              f"merge {merge_s:.0f} s + uptrain {up_s:.0f} s", file=sys.stderr, flush=True)
    print_table(base_v, rows)


if __name__ == "__main__":
    main()
