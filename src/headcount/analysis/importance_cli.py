"""`headcount importance` (issue 7). Registered through headcount.analysis.cli."""

from __future__ import annotations


def register(app, bench_app) -> None:
    """Add `headcount importance`."""
