"""The chapter's experiments (issue 9): small models trained from scratch on 2 cores.

    multi-relation, heads-sweep, low-rank, write-address     one file each; registry.py lists them
"""

from __future__ import annotations

import importlib

_EXPORTS = {"run_experiment": "registry", "EXPERIMENTS": "registry"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
