"""Model-level head surgery (issue 7): WRITES a whole model. Sits above models and analysis.

    prune(model, heads, *, mode, compensate, calibration)   prune.py
    prune_to(model, fraction, *, order, mode, compensate)   prune.py
    merge_kv(model, n_kv_heads, *, layers, method)          merge.py
    merge_plan(model, budget)                               merge.py
    uptrain(model, steps, *, lr, trainable)                 uptrain.py
    save(model, dir) / export_transformers(model, dir)      save.py

Not to be confused with headcount.head_surgery (below attention): structural surgery on ONE
MultiHeadAttention module (prune_heads, merge_kv_heads), which this package builds on.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "prune": "prune", "prune_to": "prune", "PruneResult": "prune",
    "merge_kv": "merge", "merge_plan": "merge", "MergeResult": "merge",
    "uptrain": "uptrain",
    "save": "save", "export_transformers": "save",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
