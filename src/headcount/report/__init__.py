"""The head report (issue 8): one offline HTML page + report.json from analysis and surgery results.

    build_report(model, texts=None, out=None, ...)   build.py
"""

from __future__ import annotations

import importlib

_EXPORTS = {"build_report": "build"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
