"""`headcount frontier`: every edit placed by what it saves (KV bytes, attention FLOPs) against what the model
keeps (pass@1 on a task, else held-out perplexity), the points no other beats marked.

    spec.py     `prune:0.2+merge:0.75` -> Point (parse_point, DEFAULT_POINTS)
    run.py      run_frontier: each point an edit of the unedited model, measured; kept under --out and read back
    pareto.py   on_frontier: the points no other point beats on cost and score
    result.py   Row, Frontier (to_json / from_json)
    plot.py     the PNG: KV bytes saved against pass@1, intervals drawn, the frontier joined
    cli.py      the command
"""

from __future__ import annotations

from headcount import lazy

__getattr__, __dir__, __all__ = lazy.exports(__name__, {
    "run_frontier": "headcount.frontier.run", "Frontier": "headcount.frontier.result",
    "Row": "headcount.frontier.result", "parse_point": "headcount.frontier.spec", "Point": "headcount.frontier.spec",
    "on_frontier": "headcount.frontier.pareto",
})
