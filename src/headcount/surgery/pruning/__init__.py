"""Pruning heads: orders (analysis.importance), plans (plan.py), removal with compensation (removal.py,
compensate.py), trained hard-concrete gates (gates.py; their benchmark gates_bench.py), the quality curve
(curve.py) and its benchmark (bench.py); `headcount prune` (cli.py)."""

from __future__ import annotations

from headcount import lazy

_R = "headcount.surgery.pruning.removal"
__getattr__, __dir__, __all__ = lazy.exports(__name__, {
    "prune": _R, "prune_to": _R, "PruneResult": _R, "count_heads": _R, "n_params": _R, "kv_bytes_per_token": _R,
    "pruning_curve": "headcount.surgery.pruning.curve", "PruningCurve": "headcount.surgery.pruning.curve",
    **{name: "headcount.surgery.pruning.gates" for name in ("train_gates", "apply_gates", "prune_l0", "GateResult")},
})
