"""Every edit's `tasks` block carries each stage's pass@1 interval and the paired comparison of after_edit and
after_heal against before_edit (surgery/task_scores.stage_statistics, EditReport.tasks), computed from the
per-problem verdicts Quality keeps; checked against scipy.stats; a Quality saved before verdicts were kept reads."""

from __future__ import annotations

import pytest

from headcount.surgery.editing import EditReport
from headcount.surgery.quality import Quality

scipy_stats = pytest.importorskip("scipy.stats")
IDS = [f"T/{i}" for i in range(20)]


def _verdicts(passing):
    return {t: i in passing for i, t in enumerate(IDS)}


def _report():
    before = _verdicts(set(range(12)))  # 12 / 20
    after = _verdicts(set(range(3, 12)) | {15})  # loses 0, 1, 2; wins 15: 10 / 20
    healed = _verdicts(set(range(14)))  # wins 12, 13: 14 / 20
    quality = {stage: Quality({"prose": 10.0}, tasks={"mine:20": sum(v.values()) / 20}, task_verdicts={"mine:20": v})
               for stage, v in (("before_edit", before), ("after_edit", after), ("after_heal", healed))}
    accounts = {"heads": 4, "kv_heads": 2, "params": 10, "kv_bytes_per_token": 8}
    return EditReport(quality, accounts, accounts, "a" * 64, "b" * 64)


def test_the_tasks_block_keeps_its_stages_and_adds_intervals_and_paired_comparisons():
    block = _report().tasks()["mine:20"]
    assert (block["before_edit"], block["after_edit"], block["after_heal"]) == (0.6, 0.5, 0.7)
    for stage, passed in (("before_edit", 12), ("after_edit", 10), ("after_heal", 14)):
        ci = scipy_stats.binomtest(passed, 20).proportion_ci(method="wilson")
        assert block["pass_at_1_ci95"][stage] == pytest.approx([ci.low, ci.high], abs=2e-4)
    edit, heal = block["paired"]["after_edit"], block["paired"]["after_heal"]
    assert (edit["wins"], edit["losses"], heal["wins"], heal["losses"]) == (1, 3, 2, 0)
    assert edit["difference"] == pytest.approx(-0.1) and heal["difference"] == pytest.approx(0.1)
    assert edit["p_value"] == pytest.approx(scipy_stats.binomtest(1, 4).pvalue)
    assert heal["p_value"] == pytest.approx(scipy_stats.binomtest(2, 2).pvalue)
    assert set(block["paired"]) == {"after_edit", "after_heal"}


def test_the_commands_task_rows_still_read_the_stages():
    from headcount.surgery.cli_common import task_rows

    assert task_rows(_report().tasks()) == [("pass@1: mine:20 (after heal)", 0.6, 0.7)]


def test_quality_round_trips_with_verdicts_and_reads_old_results():
    q = _report().quality["after_edit"]
    assert Quality.from_json(q.to_json()) == q and q.to_json()["task_verdicts"]["mine:20"]["T/15"] is True
    old = Quality.from_json({"perplexity": {"prose": 9.0}, "fidelity": {}, "tasks": {"mine:20": 0.5}})
    assert old.task_verdicts == {} and "task_verdicts" not in old.to_json()
    report = EditReport({"before_edit": old, "after_edit": old}, *[{"heads": 1, "kv_heads": 1, "params": 1,
                                                                    "kv_bytes_per_token": 1}] * 2, "a", "b")
    assert report.tasks() == {"mine:20": {"before_edit": 0.5, "after_edit": 0.5}}  # no verdicts: the stages alone
    with pytest.raises(ValueError, match="task_verdicts"):
        Quality.from_json({"tasks": {}, "task_verdicts": {"mine": {"T/0": "yes"}}})


def test_the_report_shows_the_paired_comparison_where_a_result_has_it():
    from types import SimpleNamespace

    from headcount.report.measures.edits import TaskScores
    from headcount.report.page import tasks

    def page(block):
        return tasks(SimpleNamespace(tasks={k: TaskScores.from_json(v) for k, v in block.items()}), "prune")

    shown = page(_report().tasks())
    assert "after edit: 1 / 3, p = 0.62" in shown and "after heal: 2 / 0, p = 0.5" in shown
    old = page({"mine:20": {"before_edit": 0.5, "after_edit": 0.5}})
    assert "paired" not in old and "<td>0.500</td><td>0.500</td></tr>" in old
