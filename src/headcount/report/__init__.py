"""The head report: one offline HTML page + report.json from analysis and surgery results.

    build_report(model, texts=None, out=None, ...)   build.py
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {"build_report": "build"}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
