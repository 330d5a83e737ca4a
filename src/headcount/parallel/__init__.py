"""Heads sharded over processes with torch.distributed: a plan applied to an unchanged model.

    shard_heads(attn, group=None)      this rank's shard of one MultiHeadAttention (shard.py)
    tensor_parallel(model, group=None) the same for a whole model (model.py: a module name that never
                                       shadows the function)
    head_plan(n_heads, world_size)     which heads each rank gets (headcount/cost/head_split.py, pure
                                       Python: it sits in cost/ so the accounts can use it without
                                       importing a room above them)
    init(), spawn(fn, world_size)      process groups from torchrun's environment; a launcher
                                       (headcount/distributed.py, low: analysis and surgery use it too)
    python -m headcount.parallel.check  max |diff| vs one process (check.py)
    headcount bench parallel           1 process x 2 threads vs 2 ranks x 1 thread (bench.py, cli.py)
    share(model) / rebuild(payload)    a loaded model to spawned ranks through shared memory (transfer.py)

The per-rank accounts (`headcount cost --tp N`) live in headcount/cost/parallel.py and use the same split.
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {"shard_heads": "shard", "tensor_parallel": "model", "head_plan": "headcount.cost.head_split",
            # process-group plumbing sits low (headcount/distributed.py), shared with analysis and surgery
            "runtime": "headcount.distributed", "init": "headcount.distributed",
            "check_same_weights": "headcount.distributed", "spawn": "headcount.distributed"}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS, modules=("runtime",))
