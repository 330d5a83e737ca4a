"""A task's verdicts, kept on disk for the weights they were measured on.

    run, where = cached_task_run(root, model, problems, settings, measure)   # measure() -> TaskRun on a miss
    remember(root, model, problems, settings, run)                           # what `headcount eval` measured

Every edit command with --eval (surgery's QualityMeter) judges the unedited model first: 12 minutes of a 0.5B model's HumanEval on 2
cores, the same answer for a prune, a merge and a drop of the same model. Greedy generation is deterministic
for the same weights, prompts and settings, so each stage's verdicts are kept as JSON under
$HEADCOUNT_CACHE/tasks/, keyed by the model's weights hash (models.fingerprint), the problems (their ids,
prompts, tests and entry points), the prompt format the model is asked in (its text, stops and budget) and the
settings (batch size, token budget, sandbox bounds). Change one weight, one problem or one setting and the key
changes. The log line says when a score was read back and from where (delete the file to measure again).
A damaged entry is measured again; an unwritable cache only costs time. `headcount eval` writes what it
measured in the format the commands ask in (auto), greedy, one sample a problem: a model evaluated once is then
not generated again by `prune --eval` or `frontier --eval`. It never reads back: its --samples need the answers,
which the entry does not keep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

CACHE_VERSION = 1  # bump when what a verdict means changes (the sanitizer, the sandbox's rules)


@dataclass(frozen=True)
class TaskRun:
    """One task measured on one model: what a stage keeps of it, and what the log line says."""
    pass_at_1: float
    verdicts: dict  # {task_id: passed}
    ci95: list  # [lo, hi], or [] when undefined
    prompt_format: str
    seconds: float

    def to_json(self) -> dict:
        return {"pass_at_1": self.pass_at_1, "verdicts": dict(self.verdicts), "ci95": list(self.ci95),
                "prompt_format": self.prompt_format, "seconds": self.seconds}

    @classmethod
    def of(cls, result) -> "TaskRun":
        """What a stage keeps of a tasks.harness.EvalResult."""
        return cls(result.pass_at_1, result.verdicts(), list(result.pass_at_1_ci95 or ()), result.prompt_format,
                   result.seconds)

    @classmethod
    def from_json(cls, data: dict) -> "TaskRun":
        verdicts = data["verdicts"]
        if not isinstance(verdicts, dict) or not all(isinstance(v, bool) for v in verdicts.values()):
            raise ValueError(f"verdicts: expected {{task_id: true|false}}, got {verdicts!r:.100}")
        return cls(float(data["pass_at_1"]), dict(verdicts), [float(x) for x in data["ci95"]],
                   str(data["prompt_format"]), float(data["seconds"]))


def cache_root() -> Path:
    """$HEADCOUNT_CACHE/tasks (default ~/.cache/headcount/tasks)."""
    from headcount.models.formats.gguf import cache_root as root
    return root() / "tasks"


def task_key(model, problems, settings) -> str:
    from headcount.models.fingerprint import weights_hash
    from headcount.disk_cache import cache_key, text_hash
    from headcount.tasks.prompts import choose_format

    problems = text_hash([f"{p.task_id}\0{p.prompt}\0{p.test}\0{p.entry_point}" for p in problems])
    return cache_key("task", weights=weights_hash(model), text=problems,
                     params={"format": repr(choose_format(model, "auto")), "settings": asdict(settings),
                             "version": CACHE_VERSION})


def _path(root, model, problems, settings) -> Path:
    return Path(root) / f"task-{task_key(model, problems, settings)}.json"


def cached_task_run(root, model, problems, settings, measure: Callable[[], TaskRun]):
    """(TaskRun, the file it was read from or None when measured now)."""
    from headcount.disk_cache import read_or_make

    path = _path(root, model, problems, settings)
    run, read_back = read_or_make(path, measure, decode=TaskRun.from_json, encode=TaskRun.to_json)
    return run, path if read_back else None


def remember(root, model, problems, settings, run: TaskRun) -> None:
    """Keep `run` (measured outside a meter: `headcount eval`) where cached_task_run looks for it, over what was
    there (an unwritable cache only costs time)."""
    import json

    from headcount.disk_cache import atomic_write_text

    try:
        atomic_write_text(_path(root, model, problems, settings), json.dumps(run.to_json(), sort_keys=True))
    except OSError:
        pass
