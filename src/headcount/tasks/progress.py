"""A progress bar for a task's run: programs scored out of the problems, with the pass rate so far (stderr; off
when stderr is not a terminal, as tqdm's disable=None decides)."""

from __future__ import annotations

import sys
from typing import Callable


def scoring_bar(desc: str) -> Callable[[int, int, int], None]:
    """A progress(done, passed, total) callback for tasks.harness.evaluate: one bar, opened at the first program
    scored and closed at the last."""
    from tqdm.auto import tqdm

    state = {"bar": None}

    def progress(done: int, passed: int, total: int) -> None:
        if state["bar"] is None:
            state["bar"] = tqdm(total=total, desc=desc, unit="program", file=sys.stderr, disable=None, leave=False)
        bar = state["bar"]
        bar.update(done - bar.n)
        bar.set_postfix_str(f"pass {passed}/{done} = {passed / done:.1%}")
        if done == total:
            bar.close()

    return progress
