"""Commands of headcount.parallel (registered by headcount.cli; no torch import at module level)."""

from __future__ import annotations


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
