"""`--eval TASK[:N]` of every edit command: a task's pass@1 before the edit, after it and after healing.

    parse_eval(["humaneval:20", "mine.jsonl"])  -> [TaskSpec]   checked (and the problems read) before any work

The specs go to surgery.quality.QualityMeter(tasks=specs), which measures greedy pass@1 at every stage of an
edit and keeps each problem's verdict; EditReport.tasks() gives the JSON block {"humaneval:20": {"before_edit":
0.65, "after_edit": 0.6, "after_heal": 0.63, "pass_at_1_ci95": {stage: [lo, hi]}, "paired": {"after_edit": {wins,
losses, difference, ci95, p_value}, "after_heal": {...}}}}: whether the edit changed the task or only moved inside
the noise (stage_statistics).

The problems an edit is judged on are never what it chooses or heals on: `check_not_calibrated_on` refuses
a calibration text that contains any of them (a user's --text holding the eval problems), and the test
suite checks that the default calibration streams hold none of HumanEval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATISTICS = ("pass_at_1_ci95", "paired")  # the keys beside the stages in a task's block

@dataclass(frozen=True)
class TaskSpec:
    label: str  # as given: "humaneval:20"
    task: str  # "humaneval" or a JSONL path
    limit: int | None
    problems: tuple = field(compare=False, repr=False)


def parse_eval(values, flag: str = "--eval") -> list[TaskSpec]:
    """TASK or TASK:N (the first N problems); the problems are read now, so a bad file fails before any work."""
    from headcount.arguments import ArgumentError
    from headcount.tasks.problems import TaskError, load_problems

    specs = []
    for value in values or ():
        task, limit = value, None
        head, sep, tail = value.rpartition(":")
        if sep and tail.isdigit():
            task, limit = head, int(tail)
            if limit < 1:
                raise ValueError(f"{flag}: expected TASK or TASK:N with N >= 1, got {value!r}")
        try:
            problems = load_problems(task, limit=limit)
        except ArgumentError as e:  # --task / --limit: here both come from the one flag
            raise e.renamed(flag) from None
        except TaskError as e:  # the problems file's own fault (where and what), under the flag that named it
            raise ArgumentError(flag, str(e)) from None
        specs.append(TaskSpec(value, task, limit, tuple(problems)))
    if len({s.label for s in specs}) != len(specs):
        raise ValueError(f"{flag}: a task is given twice ({', '.join(s.label for s in specs)})")
    return specs


def _signature_lines(problem) -> list[str]:
    """The prompt's `def entry_point(...)` line: a line no unrelated text carries by accident."""
    return [line.strip() for line in problem.prompt.splitlines()
            if line.lstrip().startswith(f"def {problem.entry_point}(")]


def check_not_calibrated_on(specs: list[TaskSpec], calibration_texts, flag: str = "--text") -> None:
    """Refuse calibration text that contains an eval problem: an edit must not choose or heal on what it reports."""
    if not specs or calibration_texts is None:
        return
    joined = "\n".join(calibration_texts) if not isinstance(calibration_texts, str) else calibration_texts
    for spec in specs:
        for problem in spec.problems:
            if any(line in joined for line in _signature_lines(problem)):
                raise ValueError(f"{flag}: its calibration part contains {problem.task_id} of --eval {spec.label}; "
                                 "an edit is never chosen or healed on the problems it is judged on")


def stage_statistics(verdicts: dict) -> dict:
    """{stage: {task_id: passed}} (stages in order, "before_edit" first) -> {"pass_at_1_ci95": {stage: [lo, hi]},
    "paired": {stage: Paired.to_json() against before_edit}} (Wilson's interval; the paired bootstrap and the exact
    McNemar test of tasks/stats.py)."""
    from headcount.tasks.stats import paired, wilson_interval

    out: dict = {}
    if not verdicts:
        return out
    out["pass_at_1_ci95"] = {stage: [round(x, 4) for x in wilson_interval(sum(v.values()), len(v))]
                             for stage, v in verdicts.items() if v}
    base = verdicts.get("before_edit")
    if base:
        out["paired"] = {stage: paired(v, base).to_json() for stage, v in verdicts.items() if stage != "before_edit"}
    return out
