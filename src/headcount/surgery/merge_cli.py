"""`headcount merge-kv` (issue 7). Registered through headcount.surgery.cli."""

from __future__ import annotations


def register(app, bench_app) -> None:
    """Add `headcount merge-kv`."""
