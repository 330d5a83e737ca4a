"""`headcount perplexity`, `headcount generate`, `headcount bench decode` (issue 4). Placeholder."""


def register(app, bench_app) -> None:
    return None
