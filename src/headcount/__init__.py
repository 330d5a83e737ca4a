"""headcount: multi-head attention you can build, measure and dissect.

The torch-backed names load lazily, so `import headcount.cost` (pure Python) never imports torch.
"""

from __future__ import annotations

__all__ = ["AttentionOutput", "KVCache", "MultiHeadAttention"]
__version__ = "0.1.0"

_LAZY = {"MultiHeadAttention": "headcount.attention", "AttentionOutput": "headcount.attention",
         "KVCache": "headcount.cache"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headcount' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
