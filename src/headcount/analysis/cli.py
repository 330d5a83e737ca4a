"""Commands of headcount.analysis: roles, faithfulness, rank (here) and importance (importance_cli.py).

Registered by headcount.cli; no torch import at module level.
"""

from __future__ import annotations


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.analysis import importance_cli
    importance_cli.register(app, bench_app)
