"""headcount frontier: point specs, the pareto marking against its brute-force definition, a frontier of a tiny
random decoder (its accounts against formulas, resume under --out counted in edits performed), bad input."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import tiny_byte_decoder
from headcount.cli import app
from headcount.frontier import pareto, run
from headcount.frontier.run import run_frontier
from headcount.frontier.spec import DEFAULT_POINTS, parse_point, parse_points

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
FAST = {"local_steps": 0, "uptrain_steps": 0}
CHEAP_PRUNE = {"order": "random", "compensate": "mean"}  # prune_to's defaults score heads: seconds, not the point here
HELD = ["The quick brown fox jumps over the lazy dog. " * 40, "Attention heads read keys and values. " * 40]
CALIBRATION = torch.randint(1, 260, (6, 64), generator=torch.Generator().manual_seed(3))
TEXT = "\n\n".join(f"Paragraph {i}: the heads of layer {i % 3} read the keys that the queries ask for. " * 6
                    for i in range(8))


# ------------------------------------------------------------------------------------------ specs
fractions = st.integers(1, 99).map(lambda k: k / 100)
steps = st.one_of(
    st.tuples(st.sampled_from(["prune", "drop"]), fractions).map(lambda t: (f"{t[0]}:{t[1]}", t[0], t[1])),
    fractions.map(lambda f: (f"merge:{f}", "merge", f)),
    st.integers(1, 64).map(lambda k: (f"merge:{k}KiB", "merge", 1024 * k)))


@given(st.lists(steps, min_size=1, max_size=3))
def test_a_point_parses_into_its_steps_in_order(parts):
    text = "+".join(p[0] for p in parts)
    point = parse_point(text)
    assert point.text == text
    assert [(s.edit, s.amount) for s in point.steps] == [(p[1], p[2]) for p in parts]
    assert "/" not in point.slug and ":" not in point.slug


@given(st.sampled_from(["prune", "drop", "merge"]), st.floats(allow_nan=False, allow_infinity=False))
def test_a_fraction_outside_0_1_is_refused_naming_point(edit, value):
    text = f"{edit}:{value!r}"
    if 0 < value < 1 and "e" not in repr(value):
        assert parse_point(text).steps[0].amount == pytest.approx(value)
    elif not 0 < value < 1:
        with pytest.raises(ValueError, match="--point"):
            parse_point(text)


@pytest.mark.parametrize("text", ["shrink:0.2", "prune", "prune:abc", "merge:12Kb", "merge:1.0", "drop:0",
                                  "prune:0.2+", "unedited", ""])
def test_bad_points(text):
    with pytest.raises(ValueError, match="--point"):
        parse_point(text)


def test_defaults_and_duplicates():
    assert [p.text for p in parse_points(None)] == list(DEFAULT_POINTS)
    with pytest.raises(ValueError, match="twice"):
        parse_points(["prune:0.2", "prune:0.2"])


# ------------------------------------------------------------------------------------------ pareto
def brute_force(costs, scores):
    n = len(costs)
    return [not any(costs[j] <= costs[i] and scores[j] >= scores[i] and (costs[j] < costs[i] or scores[j] > scores[i])
                    for j in range(n) if j != i) for i in range(n)]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=12))
def test_pareto_marks_exactly_the_points_nothing_beats(pairs):
    costs, scores = [c for c, _ in pairs], [s for _, s in pairs]
    assert pareto.on_frontier(costs, scores) == brute_force(costs, scores)


def _row(point, kv, flops, passed=None, ppl=None):
    from headcount.frontier.result import Row
    return Row(point, False, kv, flops, flops, 4096, 1000, perplexity={"prose": ppl} if ppl else {},
               pass_at_1=passed)


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(0, 10)), min_size=1, max_size=8),
       st.sampled_from([0.5, 0.8, 0.9, 1.0]))
def test_keeping_names_the_cheapest_point_that_keeps_the_share(points, fraction):
    """The cheapest point (fewer KV bytes; FLOPs the same) whose pass@1 is at least `fraction` of the unedited
    one's, against the definition read over every row; none where no cheaper point keeps that much."""
    from headcount.frontier.result import Frontier

    rows = [_row("unedited", 8, 8, 0.5)] + [_row(f"p{i}", kv, fl, k / 10) for i, (kv, fl, k) in enumerate(points)]
    frontier = Frontier("m", {}, rows, "pass_at_1")
    for cost, key in (("kv", "kv_bytes_per_token"), ("flops", "attention_flops_per_token")):
        ok = [r for r in rows[1:] if getattr(r, key) < 8 and r.pass_at_1 >= fraction * 0.5 - 1e-12]
        found = frontier.keeping(fraction)[cost]
        if not ok:
            assert found is None
            continue
        least = min(getattr(r, key) for r in ok)
        assert found[key] == least and found["saved"] == pytest.approx(1 - least / 8)
        assert found["kept"] == pytest.approx(max(r.pass_at_1 for r in ok if getattr(r, key) == least) / 0.5)


def test_kept_on_perplexity_is_the_unedited_perplexity_over_the_points():
    from headcount.frontier.result import Frontier

    frontier = Frontier("m", {}, [_row("unedited", 8, 8, ppl=10.0), _row("drop:0.5", 4, 4, ppl=12.5)], "perplexity")
    assert frontier.kept(frontier.rows[1]) == pytest.approx(0.8)
    assert frontier.keeping(0.8)["kv"]["label"] == "drop:0.5" and frontier.keeping(0.81)["kv"] is None


def test_unscored_rows_are_never_on_the_frontier():
    assert pareto.on_frontier([1, 2, 3], [None, 0.5, float("nan")]) == [False, True, False]


# ------------------------------------------------------------------------------------------ a frontier
def _kv(model):
    return sum(2 * layer.attn.n_kv_heads * layer.attn.head_dim * 4 for layer in model.layers)


def test_a_tiny_frontier_and_its_resume(tmp_path, monkeypatch):
    model = tiny_byte_decoder()
    performed = []
    real_step = run._Runner.step
    monkeypatch.setattr(run._Runner, "step", lambda self, m, step, *a: performed.append(step.text) or
                        real_step(self, m, step, *a))
    import headcount.surgery.merging.planner as planner
    tables = []
    real_sensitivity = planner.sensitivity
    monkeypatch.setattr(planner, "sensitivity", lambda *a, **k: tables.append(1) or real_sensitivity(*a, **k))
    points = parse_points(["prune:0.25", "merge:0.75", "merge:256"])
    kw = dict(model=model, eval_windows=1, calibration_windows=2, merge_options=FAST, prune_options=CHEAP_PRUNE,
              held_out=HELD, calibration=CALIBRATION, progress=False)
    first = run_frontier("tiny", points, out=tmp_path / "f", **kw)
    assert performed == ["prune:0.25", "merge:0.75", "merge:256"] and len(tables) == 1  # one table, two budgets
    rows = {r.label: r for r in first.rows}
    assert list(rows) == ["unedited", "prune:0.25", "merge:0.75", "merge:256"]
    base = rows["unedited"]
    assert base.kv_bytes_per_token == _kv(model) == 2 * 2 * 2 * 8 * 4
    # one decode token: projections 2 x d x (nh + 2 nkv) hd, scores and values 2 x 2 x nh x hd x n, output 2 x nh hd x d
    d, nh, nkv, hd, n = 32, 4, 2, 8, 128
    per_layer = 2 * d * (nh + 2 * nkv) * hd + 4 * nh * hd * n + 2 * nh * hd * d
    assert base.attention_flops_per_token == 2 * per_layer and base.context == n
    assert base.params == sum(p.numel() for p in model.parameters())
    assert rows["merge:0.75"].kv_bytes_per_token <= 0.75 * base.kv_bytes_per_token
    assert rows["merge:256"].kv_bytes_per_token <= 256 and rows["merge:0.75"].edit["merge:0.75"]["plan"]
    assert rows["prune:0.25"].params < base.params and rows["prune:0.25"].kv_bytes_per_token <= base.kv_bytes_per_token
    scores = [r.score("perplexity") for r in first.rows]
    assert [r.frontier for r in first.rows] == brute_force([r.kv_bytes_per_token for r in first.rows], scores)
    assert first.to_json()["frontier"] == [r.label for r in first.rows if r.frontier]
    assert json.loads((tmp_path / "f" / "frontier.json").read_text())["settings"]["model"] == "tiny"
    from headcount.models import load
    saved = load(str(tmp_path / "f" / "points" / "merge_0.75" / "model"))
    assert _kv(saved) == rows["merge:0.75"].kv_bytes_per_token

    # the same arguments again: every point read back, no edit performed, the same rows
    performed.clear()
    again = run_frontier("tiny", points, out=tmp_path / "f", **kw)
    assert performed == [] and again.reused == ["unedited", "prune:0.25", "merge:0.75", "merge:256"]
    assert [r.to_json() for r in again.rows] == [r.to_json() for r in first.rows]
    # an interrupted run: a point without its result.json is measured again, the others read back
    (tmp_path / "f" / "points" / "merge_0.75" / "result.json").unlink()
    resumed = run_frontier("tiny", points + parse_points(["prune:0.5"]), out=tmp_path / "f", **kw)
    assert performed == ["merge:0.75", "prune:0.5"] and len(tables) == 1  # the table read back from disk
    assert resumed.rows[2].kv_bytes_per_token == first.rows[2].kv_bytes_per_token

    # other settings in the same --out: refused before anything is written, unless force
    before = sorted(p.name for p in (tmp_path / "f" / "points").iterdir())
    with pytest.raises(ValueError, match="--out.*other settings.*calibration_windows"):
        run_frontier("tiny", points, out=tmp_path / "f", **{**kw, "calibration_windows": 3})
    assert sorted(p.name for p in (tmp_path / "f" / "points").iterdir()) == before
    performed.clear()
    run_frontier("tiny", points[:1], out=tmp_path / "f", force=True, **{**kw, "calibration_windows": 3})
    assert performed == ["prune:0.25"] and [p.name for p in (tmp_path / "f" / "points").iterdir()] == ["prune_0.25"]


def test_an_unreachable_merge_budget_is_refused_before_anything_is_written(tmp_path):
    model = tiny_byte_decoder()
    with pytest.raises(ValueError, match="--point merge:100.*below what every-layer MQA"):
        run_frontier("tiny", parse_points(["prune:0.2", "merge:100"]), model=model, out=tmp_path / "f",
                     progress=False)
    assert not (tmp_path / "f").exists()


# ------------------------------------------------------------------------------------------ the command
def _saved(tmp_path):
    from headcount.models.formats.native import save
    save(tiny_byte_decoder(), tmp_path / "tiny")
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "p.jsonl").write_text(json.dumps({"task_id": "t/0", "prompt": "def f():\n", "test": "pass",
                                                  "entry_point": "f"}) + "\n")
    return str(tmp_path / "tiny")


def test_the_command_prints_rows_and_the_frontier(tmp_path):
    model = _saved(tmp_path)
    args = ["frontier", "--model", model, "--point", "drop:0.5", "--calibration-windows", "2", "--eval-windows", "1",
            "--text", str(tmp_path / "text.txt"), "--out", str(tmp_path / "f")]
    result = runner.invoke(app, args + ["--json", "--png", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["point"] for r in data["rows"]] == ["unedited", "drop:0.5"]
    assert data["rows"][1]["kv_bytes_per_token"] == data["rows"][0]["kv_bytes_per_token"] // 2
    assert data["frontier"] and set(data["frontier"]) <= {"unedited", "drop:0.5"}
    for key in ("kv_bytes_per_token", "attention_flops_per_token", "attention_flops_per_token_4k", "params",
                "perplexity", "pass_at_1", "pass_at_1_ci95", "paired", "seconds"):
        assert key in data["rows"][1]
    assert (tmp_path / "f.png").stat().st_size > 1000
    assert data["keeping"]["fraction"] == 0.9 and set(data["kept"]) == {"unedited", "drop:0.5"}
    table = runner.invoke(app, args + ["--keep", "0.5"], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "drop:0.5" in table.stdout, table.output
    assert "keeping >= 50% of the unedited" in table.stdout


@pytest.mark.parametrize("args,match", [
    (["--point", "grow:0.2"], "--point"),
    (["--point", "prune:1.5"], "--point"),
    (["--point", "merge:1B"], "--point merge:1B.*below"),
    (["--eval", "PROBLEMS", "--eval", "PROBLEMS:1"], "--eval: a frontier is judged on one task"),
    (["--sensitivity", "vibes"], "--sensitivity"),
    (["--keep", "0"], "--keep: expected a share"),
    (["--keep", "1.5"], "--keep: expected a share"),
    (["--heal-calibration", "teacher-answers"], "--heal-calibration.*expected --heal-steps"),
    (["--heal-steps", "2", "--heal-calibration", "vibes"], "--heal-calibration: expected one of"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, match):
    model = _saved(tmp_path)
    args = [str(tmp_path / "p.jsonl") + a[len("PROBLEMS"):] if a.startswith("PROBLEMS") else a for a in args]
    result = runner.invoke(app, ["frontier", "--model", model, "--out", str(tmp_path / "f")] + args)
    assert result.exit_code == 2, result.output
    import re
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), result.output
    assert not (tmp_path / "f").exists()


def test_eval_on_an_encoder_exits_2(tmp_path):
    from headcount.models.encoder import Encoder, EncoderConfig
    from headcount.models.formats.native import save

    torch.manual_seed(0)
    save(Encoder(EncoderConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_position=64)),
         tmp_path / "enc")
    result = runner.invoke(app, ["frontier", "--model", str(tmp_path / "enc"), "--point", "prune:0.25", "--eval",
                                 "humaneval:1", "--out", str(tmp_path / "f")])
    assert result.exit_code == 2 and "--eval" in result.output and "decoder" in result.output, result.output
    assert not (tmp_path / "f").exists()


def test_a_chained_point_applies_its_edits_in_order():
    model = tiny_byte_decoder()
    frontier = run_frontier("tiny", parse_points(["drop:0.5", "drop:0.5+merge:0.75"]), model=model, eval_windows=1,
                            calibration_windows=2, merge_options=FAST, held_out=HELD, calibration=CALIBRATION,
                            progress=False)
    base, dropped, both = frontier.rows
    assert dropped.kv_bytes_per_token == base.kv_bytes_per_token // 2  # one of two layers keeps a K/V cache
    assert dropped.attention_flops_per_token == base.attention_flops_per_token // 2
    assert list(both.edit) == ["drop:0.5", "merge:0.75"]
    assert both.edit["merge:0.75"]["kv_bytes_per_token_before"] == dropped.kv_bytes_per_token
    assert both.kv_bytes_per_token <= 0.75 * dropped.kv_bytes_per_token


def test_judged_by_a_task_each_row_has_its_interval_and_the_paired_comparison(tmp_path, monkeypatch):
    """The task's verdicts come from a stand-in for the harness (a tiny random model passes nothing): problem i
    passes when the model keeps more than i x 32 KV bytes per token, so the rows differ in known ways."""
    from types import SimpleNamespace

    from headcount.surgery.task_scores import parse_eval
    from headcount.tasks import harness
    from headcount.tasks.stats import wilson_interval

    rows = [{"task_id": f"t/{i}", "prompt": f"def f{i}():\n", "test": "pass", "entry_point": f"f{i}"} for i in range(8)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec, = parse_eval([str(tmp_path / "p.jsonl")])

    def evaluate(model, task, problems, settings, progress=None):
        kv = run.kv_bytes_per_token(model)
        verdicts = {p.task_id: kv > 32 * i for i, p in enumerate(problems)}
        return SimpleNamespace(pass_at_1=sum(verdicts.values()) / len(verdicts), verdicts=lambda: verdicts,
                               pass_at_1_ci95=None, prompt_format="stand-in", seconds=0.0)

    monkeypatch.setattr(harness, "evaluate", evaluate)
    frontier = run_frontier("tiny", parse_points(["merge:0.75", "drop:0.5"]), model=tiny_byte_decoder(), spec=spec,
                            eval_windows=1, calibration_windows=2, merge_options=FAST, held_out=HELD,
                            calibration=CALIBRATION, progress=False)
    base, merged, dropped = frontier.rows
    assert frontier.score == "pass_at_1" and frontier.task == spec.label
    assert base.pass_at_1 == 1.0 and merged.pass_at_1 == 6 / 8 and dropped.pass_at_1 == 4 / 8  # 256, 192, 128 bytes
    assert merged.pass_at_1_ci95 == pytest.approx(list(wilson_interval(6, 8)), abs=1e-6)
    assert dropped.paired["wins"] == 0 and dropped.paired["losses"] == 4 and dropped.paired["difference"] == -0.5
    # every point saves KV bytes at a price in pass@1: none beats another, all on the frontier
    assert frontier.to_json()["frontier"] == ["unedited", "merge:0.75", "drop:0.5"]
    assert brute_force([r.kv_bytes_per_token for r in frontier.rows], [r.pass_at_1 for r in frontier.rows]) == \
        [True, True, True]


def test_a_frontier_written_before_a_setting_existed_is_still_read_back(tmp_path):
    settings = run.settings_of("tiny", heal_steps=0, spec=None, eval_windows=1, calibration_windows=2,
                               sensitivity="loss", dtype="fp32", merge_options=None, prune_options=None)
    older = {k: v for k, v in settings.items() if k != "prune_options"}
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / run.MANIFEST).write_text(json.dumps({"settings": older}))
    assert run.check_out(tmp_path / "f", settings, force=False)
    with pytest.raises(ValueError, match="prune_options"):
        run.check_out(tmp_path / "f", {**settings, "prune_options": {"order": "random"}}, force=False)


def test_healed_points_distil_on_the_calibration_asked_for(monkeypatch):
    """--heal-calibration reaches every healed point's heal (heal_steps.healer's name), the teacher's text cached
    when the command caches; the row says which calibration healed it. The heal itself is stood in for: its
    own tests are test_surgery_teacher_answers.py's."""
    from headcount.surgery.healing import cli as heal_cli

    seen = []

    def healer(teacher, steps, **kwargs):
        seen.append((steps, kwargs["name"], kwargs["cache"]))
        return lambda model, before, after: {"steps": steps, "tokens": 0, "params": 0, "seconds": 0.0,
                                             "calibration": kwargs["name"]}

    monkeypatch.setattr(heal_cli, "healer", healer)
    model = tiny_byte_decoder()
    model.tokenizer.chat_template = "{{ messages }}"
    frontier = run_frontier("tiny", parse_points(["drop:0.5"]), model=model, heal_steps=2, eval_windows=1,
                            calibration_windows=2, held_out=HELD, calibration=None, progress=False,
                            heal_calibration="teacher-answers", task_cache=None)
    assert seen == [(2, "teacher-answers", False)]
    assert [(r.point, r.healed) for r in frontier.rows][1:] == [("drop:0.5", False), ("drop:0.5", True)]
    assert frontier.rows[-1].edit["heal"]["calibration"] == "teacher-answers"
    model.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="--heal-calibration: teacher-answers asks .* chat template"):
        run_frontier("tiny", parse_points(["drop:0.5"]), model=model, heal_steps=2, eval_windows=1,
                     calibration_windows=2, held_out=HELD, progress=False, heal_calibration="teacher-answers")


def test_a_frontier_healed_on_another_calibration_is_not_read_back(tmp_path):
    settings = run.settings_of("tiny", heal_steps=2, spec=None, eval_windows=1, calibration_windows=2,
                               sensitivity="loss", dtype="fp32", merge_options=None)
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / run.MANIFEST).write_text(json.dumps({"settings": settings}))
    assert run.check_out(tmp_path / "f", settings, force=False)
    answers = run.settings_of("tiny", heal_steps=2, spec=None, eval_windows=1, calibration_windows=2,
                              sensitivity="loss", dtype="fp32", merge_options=None, heal_calibration="teacher-answers")
    with pytest.raises(ValueError, match="heal_calibration"):
        run.check_out(tmp_path / "f", answers, force=False)


def test_labels_of_rows_at_one_saving_do_not_print_over_each_other():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from headcount.frontier.plot import _labels

    class R:
        def __init__(self, label):
            self.label = label

    fig, ax = plt.subplots()
    ax.set_ylim(0.0, 1.0)
    points = [(0.25, 0.366, R("a")), (0.25, 0.372, R("b")), (0.25, 0.378, R("c")), (0.0, 0.37, R("d"))]
    _labels(ax, points)
    at = {t.get_text(): t.get_position() for t in ax.texts}
    plt.close(fig)
    ys = sorted(at[k][1] for k in "abc")
    assert all(b - a >= 0.03 - 1e-9 for a, b in zip(ys, ys[1:]))  # 3% of the axis apart
    assert abs(at["d"][1] - 0.37) < 0.01  # alone at its saving: beside its marker
