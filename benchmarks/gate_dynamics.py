"""Does the L0 Lagrangian land on its target in a short run? The settings of train_gates (surgery/pruning/gates.py)
against Adam's defaults, on a simulated loss, then optionally on minilm.

    python benchmarks/gate_dynamics.py [--minilm]

The simulation: n gates with importances w ~ log-normal(0, sigma), normalised to mean 1, a distillation loss
scale * mean_i w_i (1 - z_i) over hard-concrete samples z (2 draws per step, as train_gates' batch of 2), and
train_gates' own Lagrangian on the expected L0 with its warm-up, half the gates to keep. Grid: sigma 0.1 / 0.5 /
1 / 2.5, scale 1e-3 / 0.1 / 3, 8 / 72 / 270 gates, 30 / 100 / 300 steps at lr max(0.1, 15 / steps) (lr x steps
>= 15, the module doc's rule). Two variants:
  defaults   train_gates' settings: gates Adam betas (0.5, 0.99) and log_alpha clamped to +-LOG_ALPHA_LIMIT,
             multipliers Adam ascent at LAMBDA_LR with betas (0, 0.99) (no momentum)
  adam       Adam's default betas (0.9, 0.999) on both, no clamp
Per variant, over the grid: |E[L0] - target| at the end and the largest overshoot below the target after the
warm-up, both in % of the gates (median and worst; the worst error per step count too), and the share of gates saturated at the end (a gate whose
log_alpha is past +-LOG_ALPHA_LIMIT, where its samples are all 0 or all 1 and no loss moves it back).
--minilm: train_gates on minilm (72 heads, 50% removed, 100 steps, lr 0.1) and its final expected L0.
One JSON line per variant (and for minilm) on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch

from headcount.surgery.pruning.gates import INIT_LOG_ALPHA, LAMBDA_LR, LOG_ALPHA_LIMIT, WARMUP
from headcount.surgery.pruning.hard_concrete import expected_l0, open_probability, sample_gates
from headcount.training.optimizer import Optimizer

VARIANTS = {
    "defaults": {"gate_betas": (0.5, 0.99), "lambda_betas": (0.0, 0.99), "clamp": True},
    "adam": {"gate_betas": (0.9, 0.999), "lambda_betas": (0.9, 0.999), "clamp": False},
}
GRID = {"sigma": (0.1, 0.5, 1.0, 2.5), "scale": (1e-3, 0.1, 3.0), "n_gates": (8, 72, 270), "steps": (30, 100, 300)}
ROWS = 2  # gate draws per step: train_gates' default batch of 2


def simulate(sigma: float, scale: float, n_gates: int, steps: int, variant: dict, seed: int = 0) -> dict:
    """One run of train_gates' Lagrangian on the simulated loss: final error, worst overshoot, saturated share."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.exp(sigma * torch.randn(n_gates, generator=gen))
    w = w / w.mean()
    lr = max(0.1, 15.0 / steps)
    log_alpha = torch.full((n_gates,), INIT_LOG_ALPHA, requires_grad=True)
    lambdas = torch.zeros(2, requires_grad=True)
    opt = Optimizer([log_alpha], lr=lr, betas=variant["gate_betas"], clip=None)
    opt_lambda = Optimizer([lambdas], lr=LAMBDA_LR, betas=variant["lambda_betas"], maximize=True, clip=None)
    keep = n_gates // 2
    density0 = float(open_probability(log_alpha.detach()).mean())
    target = keep / n_gates
    n_warm = round(WARMUP * steps)
    overshoot = 0.0
    for step in range(steps):
        z = sample_gates(log_alpha.expand(ROWS, n_gates), generator=gen)
        distill = scale * (w * (1 - z)).mean()
        t = target if step >= n_warm else density0 + (target - density0) * (step + 1) / n_warm
        gap = open_probability(log_alpha).mean() - t
        (distill + lambdas[0] * gap + lambdas[1] * gap * gap).backward()
        opt.step()
        opt_lambda.step()
        with torch.no_grad():
            if variant["clamp"]:
                log_alpha.clamp_(-LOG_ALPHA_LIMIT, LOG_ALPHA_LIMIT)
            if step >= n_warm:
                overshoot = max(overshoot, keep - float(expected_l0(log_alpha)))
    final = float(expected_l0(log_alpha.detach()))
    saturated = float((log_alpha.detach().abs() > LOG_ALPHA_LIMIT).float().mean())
    return {"error": abs(final - keep) / n_gates, "overshoot": overshoot / n_gates, "saturated": saturated}


def summary(name: str, points: list[tuple], runs: list[dict]) -> dict:
    pct = lambda key, f, rs=runs: round(100 * f([r[key] for r in rs]), 1)  # noqa: E731
    by_steps = {s: [r for p, r in zip(points, runs) if p[-1] == s] for s in GRID["steps"]}
    return {"variant": name, "runs": len(runs),
            "error_pct_median": pct("error", statistics.median), "error_pct_worst": pct("error", max),
            "error_pct_worst_by_steps": {s: pct("error", max, rs) for s, rs in by_steps.items()},
            "overshoot_pct_median": pct("overshoot", statistics.median), "overshoot_pct_worst": pct("overshoot", max),
            "saturated_pct_mean": pct("saturated", statistics.fmean)}


def minilm() -> dict:
    from headcount.models import load
    from headcount.surgery import train_gates

    torch.manual_seed(0)
    result = train_gates(load("minilm").eval(), fraction=0.5, steps=100, lr=0.1, progress=False)
    return {"model": "minilm", "gates": result.n_gates, "target": result.heads_to_keep, "steps": result.steps,
            "final_expected_l0": round(result.final_expected_l0, 2), "seconds": round(result.seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minilm", action="store_true", help="also train gates on minilm (a few minutes on 2 cores)")
    ns = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest
    for name, variant in VARIANTS.items():
        points = list(itertools.product(*GRID.values()))
        runs = [simulate(*point, variant) for point in points]
        print(json.dumps(summary(name, points, runs)), flush=True)
    if ns.minilm:
        print(json.dumps(minilm()), flush=True)


if __name__ == "__main__":
    main()
