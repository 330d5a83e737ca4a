"""The hard-concrete gate (Louizos et al. 2018, arXiv 1712.01312; Voita et al. 2019, arXiv 1905.09418): the
distribution gates.py trains, one log_alpha per gate. A sample is

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / beta),  beta = 2/3,
    z = clamp(s * (zeta - gamma) + gamma, 0, 1),  (gamma, zeta) = (-0.1, 1.1)

so z is exactly 0 or exactly 1 with positive probability, and P(z != 0) = sigmoid(log_alpha - beta *
log(-gamma / zeta)): the expected L0 is the sum of that over gates (`expected_l0`). The deterministic
(test-time) gate is the standard estimator clamp(sigmoid(log_alpha) * (zeta - gamma) + gamma, 0, 1)
(`deterministic_gates`).
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor

BETA = 2.0 / 3.0
GAMMA, ZETA = -0.1, 1.1
_LOG_RATIO = math.log(-GAMMA / ZETA)  # log(0.1 / 1.1)
_EPS = 1e-6  # u is kept this far from 0 and 1: log u and log(1 - u) stay finite


def sample_gates(log_alpha: Tensor, *, generator: torch.Generator | None = None, u: Tensor | None = None) -> Tensor:
    """One hard-concrete sample per entry of log_alpha (same shape; differentiable in log_alpha)."""
    if u is None:
        u = torch.rand(log_alpha.shape, generator=generator, device=log_alpha.device, dtype=log_alpha.dtype)
    u = u.clamp(_EPS, 1 - _EPS)
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def open_probability(log_alpha: Tensor) -> Tensor:
    """P(gate != 0) per entry: sigmoid(log_alpha - beta * log(-gamma / zeta))."""
    return torch.sigmoid(log_alpha - BETA * _LOG_RATIO)


def expected_l0(log_alpha: Tensor) -> Tensor:
    """The expected number of non-zero gates (a scalar, differentiable)."""
    return open_probability(log_alpha).sum()


def deterministic_gates(log_alpha: Tensor) -> Tensor:
    """The test-time gates: clamp(sigmoid(log_alpha) * (zeta - gamma) + gamma, 0, 1)."""
    return (torch.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)
