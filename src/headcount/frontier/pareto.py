"""The frontier: the points no other point beats on both cost (lower is better) and score (higher is better).

A point is beaten when another costs no more and scores no less, and is strictly better on one of the two.
Points with no score (None) are never on the frontier and beat nothing. Ties on both: neither beats the other.
"""

from __future__ import annotations

import math


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def on_frontier(costs, scores) -> list[bool]:
    """[bool] per point: True when no other point beats it. A sweep by cost, O(n log n)."""
    costs, scores = list(costs), list(scores)
    if len(costs) != len(scores):
        raise ValueError(f"on_frontier: {len(costs)} costs for {len(scores)} scores")
    scored = [i for i in range(len(costs)) if not _missing(costs[i]) and not _missing(scores[i])]
    out = [False] * len(costs)
    best = -math.inf  # the best score among strictly cheaper points
    scored.sort(key=lambda i: costs[i])
    k = 0
    while k < len(scored):
        group = [i for i in scored[k:] if costs[i] == costs[scored[k]]]
        top = max(scores[i] for i in group)
        if top > best:
            for i in group:
                out[i] = scores[i] == top
        best = max(best, top)
        k += len(group)
    return out
