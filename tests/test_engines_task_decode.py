"""`headcount bench decode --task`: the eval's own generation timed in headcount (and vLLM where installed) on a tiny
random model with a byte-level tokenizer; its headcount row generates what `headcount eval` generates, an engine
that cannot run is one line in its row, and bad input is one line and exit 2."""

import json

import pytest
from typer.testing import CliRunner

from conftest import tiny_byte_decoder
from headcount.cli import app
from headcount.engines.task_decode import TaskDecodeResult, TaskDecodeRow
from headcount.models.formats.native import save

runner = CliRunner()
PROBLEMS = [{"task_id": f"mine/{i}", "prompt": f"def f{i}(x):\n    \"\"\"x plus {i}.\"\"\"\n", "entry_point": f"f{i}",
             "test": f"def check(f):\n    assert f(1) == {i + 1}\n"} for i in range(3)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("task-decode")
    save(tiny_byte_decoder(max_position=256), root / "model")
    problems = root / "problems.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return root


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_headcount_row_generates_what_eval_generates(tiny_dir, monkeypatch):
    from headcount.engines import task_decode
    from headcount.engines.rows import EngineUnavailable

    def unavailable(*args, **kwargs):
        raise EngineUnavailable("vllm: not installed (`make vllm` creates .venv-vllm)")

    monkeypatch.setattr(task_decode, "_vllm", unavailable)
    data = _json(runner.invoke(app, ["bench", "decode", "--model", str(tiny_dir / "model"), "--task",
                                     str(tiny_dir / "problems.jsonl"), "--batch", "2", "--new-tokens", "5", "--json"]))
    rows = {r["engine"]: r for r in data["rows"]}
    assert data["n_prompts"] == 3 and data["batch"] == 2 and data["max_new_tokens"] == 5
    assert data["prompt_format"] == "completion"  # no chat template: the raw prompt, as eval's auto chooses
    hc = rows["headcount"]
    assert hc["new_tokens_per_s"] == pytest.approx(hc["new_tokens"] / hc["seconds"], rel=1e-9)
    assert hc["same_answers"] == 3 and hc["threads"] >= 1
    assert rows["vllm"]["skipped"].startswith("vllm: not installed") and data["ratio"] is None
    # the same problems through eval's generation, one row at a time
    from headcount.models import load
    from headcount.tasks.harness import Settings, generate_completions
    from headcount.tasks.problems import load_problems
    from headcount.tasks.prompts import choose_format

    model = load(str(tiny_dir / "model"))
    problems = load_problems(str(tiny_dir / "problems.jsonl"))
    _, tokens, _ = generate_completions(model, problems, choose_format(model, "auto"),
                                        Settings(max_new_tokens=5, batch_size=1))
    assert hc["new_tokens"] == tokens  # batch 2 against one row at a time: the same greedy tokens


def test_ratio_is_headcount_over_vllm():
    result = TaskDecodeResult("m", "humaneval", "f", 4, 2, 8, "cpu",
                              [TaskDecodeRow("headcount", 100, 10.0, 10.0), TaskDecodeRow("vllm", 100, 20.0, 5.0)])
    assert result.ratio == 2.0 and result.to_json()["ratio"] == 2.0 and result.to_json()["target_ratio"] == 1.0
    assert TaskDecodeResult("m", "t", "f", 1, 1, 1, "cpu", [TaskDecodeRow("vllm", skipped="no")]).ratio is None


@pytest.mark.parametrize("args,words", [
    (["--task", "humaneval", "--engines", "headcount,sglang"], ["--engines", "headcount, vllm", "sglang"]),
    (["--task", "humaneval", "--batch", "8,32"], ["--batch", "one batch size"]),
    (["--task", "humaneval", "--prompt-tokens", "64"], ["--prompt-tokens", "task's own"]),
    (["--task", "humaneval", "--limit", "0"], ["--limit"]),
    (["--task", "nowhere.jsonl"], ["nowhere.jsonl"]),
    (["--limit", "3"], ["--limit", "only with --task"]),
])
def test_bad_input_exits_2_in_one_line(args, words):
    result = runner.invoke(app, ["bench", "decode", *args])
    assert result.exit_code == 2, result.output
    errors = [l for l in result.output.splitlines() if l.startswith("headcount bench decode:")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), result.output
