"""Merging K/V heads: the model-level merge (kv_merge.py) on one layer's math (fit.py: the closed form;
refine.py: block-wise reconstruction), the walk through the residual stream (stream.py), the
budget planner (planner.py), uptraining (uptraining.py), its benchmark (bench.py); `headcount merge-kv`."""

from __future__ import annotations

from headcount import lazy

__getattr__, __dir__, __all__ = lazy.exports(__name__, {
    "merge_kv": "headcount.surgery.merging.kv_merge", "MergeResult": "headcount.surgery.merging.kv_merge",
    "merge_plan": "headcount.surgery.merging.planner", "MergePlan": "headcount.surgery.merging.planner",
    "uptrain": "headcount.surgery.merging.uptraining", "UptrainResult": "headcount.surgery.merging.uptraining",
})
