"""The chapter's experiments: small models trained from scratch on 2 cores.

    multi-relation, heads-sweep, low-rank, write-address     one file each; registry.py lists them
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {"run_experiment": "registry", "EXPERIMENTS": "registry"}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
