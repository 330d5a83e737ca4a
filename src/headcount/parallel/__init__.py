"""Heads sharded over processes with torch.distributed (issue 10): a plan applied to an unchanged model.

    shard_heads(attn, group=None)      this rank's shard of one MultiHeadAttention (shard.py)
    tensor_parallel(model, group=None) the same for a whole model (tensor_parallel.py)
    python -m headcount.parallel.check  max |diff| vs one process (check.py)
"""

from __future__ import annotations

import importlib

_EXPORTS = {"shard_heads": "shard", "tensor_parallel": "tensor_parallel"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
