"""Lazy package exports: `from headcount.models import load` imports only the submodule it needs.

    __getattr__, __dir__, __all__ = lazy.exports(__name__, {"load": "zoo", "head_plan": "headcount.cost.head_split"})

A target without a dot is a submodule of the package; a dotted target is an absolute module. Names in
`modules` resolve to the module itself rather than to an attribute of it.
"""

from __future__ import annotations

import importlib


def exports(package: str, mapping: dict[str, str], *, modules: tuple[str, ...] = ()):
    """(__getattr__, __dir__, __all__) for a package whose names live in the submodules `mapping` names."""
    names = sorted(mapping)

    def __getattr__(name: str):
        if name in mapping:
            target = mapping[name]
            module = importlib.import_module(target if "." in target else f"{package}.{target}")
            return module if name in modules else getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return names

    return __getattr__, __dir__, names
