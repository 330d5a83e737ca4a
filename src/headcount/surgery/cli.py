"""Commands of headcount.surgery: prune, export, bench surgery (here) and merge-kv (merge_cli.py).

Registered by headcount.cli; no torch import at module level.
"""

from __future__ import annotations


def register(app, bench_app) -> None:
    """Add this room's commands to the `headcount` app and its `bench` sub-app."""
    from headcount.surgery import merge_cli
    merge_cli.register(app, bench_app)
