"""Model-level head surgery: WRITES a whole model. Sits above models and analysis.

    prune(model, heads, *, mode, compensate, calibration)   pruning/removal.py (plan.py, compensate.py)
    prune_to(model, fraction, *, order, mode, compensate)   pruning/removal.py
    pruning_curve(model, *, fractions, orders, ...)         pruning/curve.py
    train_gates(model, *, heads_to_keep | fraction, steps)  pruning/gates.py (hard-concrete L0 gates)
    prune_l0(model, *, fraction, steps, compensate)         pruning/gates.py (train_gates + apply_gates)
    merge_kv(model, n_kv_heads, *, layers, method)          merging/kv_merge.py (fit.py, refine.py, stream.py)
    merge_plan(model, budget)                               merging/planner.py
    uptrain(model, steps, *, lr, trainable)                 merging/uptraining.py
    heal(model, teacher, *, steps, tokens, params, lr)      healing/loop.py (distillation after any edit)
    save(model, dir) / export_transformers(model, dir)      models/formats/ (native.py, hf.py), re-exported
    export_gguf(model, path, *, dtype)                      models/formats/gguf_deci.py (llama.cpp `deci`)

Not to be confused with headcount.head_surgery (below attention): structural surgery on ONE
MultiHeadAttention module (prune_heads, merge_kv_heads), which this package builds on.
"""

from __future__ import annotations

from headcount import lazy

_P, _M, _H = "headcount.surgery.pruning.", "headcount.surgery.merging.", "headcount.surgery.healing."
_EXPORTS = {
    # module names differ from the function names: an imported submodule `prune` would shadow prune()
    "prune": _P + "removal", "prune_to": _P + "removal", "PruneResult": _P + "removal",
    "pruning_curve": _P + "curve", "PruningCurve": _P + "curve",
    "train_gates": _P + "gates", "apply_gates": _P + "gates", "prune_l0": _P + "gates", "GateResult": _P + "gates",
    "merge_kv": _M + "kv_merge", "MergeResult": _M + "kv_merge",
    "merge_plan": _M + "planner", "MergePlan": _M + "planner",
    "uptrain": _M + "uptraining", "UptrainResult": _M + "uptraining",
    "heal": _H + "loop", "HealResult": _H + "result",
    # writing a model is not surgery: these live with their formats (models/formats/), re-exported here
    "save": "headcount.models.formats.native", "export_transformers": "headcount.models.formats.hf",
    "export_gguf": "headcount.models.formats.gguf_deci",
}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
