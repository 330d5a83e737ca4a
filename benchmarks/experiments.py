"""The chapter's four experiments, full versions: tables on stdout, JSON and PNG files in --out.

    python benchmarks/experiments.py                      # all four
    python benchmarks/experiments.py heads-sweep --out benchmarks/results
    nice -n 15 python benchmarks/experiments.py ... --threads 1   # on a shared machine

A thin script over headcount.experiments.run_experiment (the same as `headcount experiment NAME`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headcount.experiments import EXPERIMENTS, run_experiment
from headcount.experiments.registry import format_text, save_plot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=list(EXPERIMENTS), help=f"any of {', '.join(EXPERIMENTS)}")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for JSON and PNG")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        result = run_experiment(name, quick=args.quick, seed=args.seed, threads=args.threads)
        (args.out / f"{name}.json").write_text(json.dumps(result.to_json(), indent=1))
        save_plot(result, args.out / f"{name}.png")
        print(format_text(result))
        print(f"({result.seconds:.0f} s wall, {result.config['torch_threads']} torch thread(s))\n", flush=True)


if __name__ == "__main__":
    main()
