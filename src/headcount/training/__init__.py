"""The one training toolkit: what every run that trains weights shares (surgery's heal, uptrain and gates, and the
experiments' models trained from scratch). It imports only torch, so every room above it may use it.

    schedule.py        warmup_cosine, WarmupCosine: linear warm-up, then cosine decay to a floor
    optimizer.py       Optimizer: AdamW, gradients clipped by norm, the schedule stepped; back_off
    budget.py          TimeBudget: a run's clock, and max_seconds: the plan cut to the steps that fit
    best.py            BestWeights: the best validation weights, back-off and early stopping
    checkpointing.py   layer_checkpointing: decoder layers recomputed in backward (their gradient_checkpointing flag)
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {"warmup_cosine": "schedule", "WarmupCosine": "schedule", "Optimizer": "optimizer",
            "clipped_step": "optimizer", "TimeBudget": "budget", "BestWeights": "best",
            "layer_checkpointing": "checkpointing"}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
