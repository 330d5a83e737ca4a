"""Model-level head surgery (issue 7): WRITES a whole model. Sits above models and analysis.

    prune(model, heads, *, mode, compensate, calibration)   pruning.py (plan.py, compensate.py)
    prune_to(model, fraction, *, order, mode, compensate)   pruning.py
    pruning_curve(model, *, fractions, orders, ...)         curve.py
    merge_kv(model, n_kv_heads, *, layers, method)          merge.py
    merge_plan(model, budget)                               merge.py
    uptrain(model, steps, *, lr, trainable)                 uptraining.py
    save(model, dir) / export_transformers(model, dir)      models/formats/ (native.py, hf.py), re-exported
    export_gguf(model, path, *, dtype)                      models/formats/gguf_deci.py (llama.cpp `deci`, per-layer heads)

Not to be confused with headcount.head_surgery (below attention): structural surgery on ONE
MultiHeadAttention module (prune_heads, merge_kv_heads), which this package builds on.
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {
    # module names differ from the function names: an imported submodule `prune` would shadow prune()
    "prune": "pruning", "prune_to": "pruning", "PruneResult": "pruning",
    "pruning_curve": "curve", "PruningCurve": "curve",
    "merge_kv": "merge", "merge_plan": "merge", "MergeResult": "merge",
    "uptrain": "uptraining", "UptrainResult": "uptraining",
    # writing a model is not surgery: these live with their formats (models/formats/), re-exported here
    "save": "headcount.models.formats.native", "export_transformers": "headcount.models.formats.hf",
    "export_gguf": "headcount.models.formats.gguf_deci",
}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
