"""`headcount cost` (issue 3). Placeholder until the cost room lands."""


def register(app) -> None:  # noqa: D401 - filled in by the cost work
    return None
