"""`headcount bench decode --task humaneval`: new tokens/s of an eval's own generation, headcount against vLLM on the
same weights, the same prompts, the same stops and the same token budget, one after the other in one run.

    prompts   the task's problems in the format `headcount eval` uses by default (tasks/prompts.choose_format "auto":
              the makers' where known), token ids built once and handed to both engines
    headcount tasks.harness.generate_completions, exactly as `headcount eval` generates: continuous batching of
              `batch` rows, packed weights, in this process
    vllm      export --to vllm of the same loaded weights (fp32), served by vllm_worker.py in .venv-vllm: one
              llm.generate over every prompt with max_num_seqs = batch, the same stop strings and budget
    rate      new tokens / the wall time of generation (prefill and decode together, as an eval spends them)

Both engines get every core (vLLM's own binding keeps one for its scheduler; the worker binds them all). Greedy
fp32 answers are mostly the same text in both; the table says how many are, since a different answer can be a
different length. Transformers is not a contender here: its generate() has no continuous batching, so at batch 32
every static batch waits on its longest answer (up to the format's 2,048 tokens); `bench decode --batch` has it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TARGET_RATIO = 1.0  # headcount's new tokens/s over vLLM's
TASK_ENGINES = ("headcount", "vllm")


@dataclass
class TaskDecodeRow:
    engine: str
    new_tokens: int | None = None
    seconds: float | None = None
    new_tokens_per_s: float | None = None
    threads: int | None = None
    same_answers: int | None = None  # answers identical to headcount's (after the eval's own reading)
    skipped: str | None = None  # why the engine did not run


@dataclass
class TaskDecodeResult:
    model: str
    task: str
    prompt_format: str
    n_prompts: int
    batch: int
    max_new_tokens: int
    cpu: str
    rows: list[TaskDecodeRow] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """headcount's new tokens/s over vLLM's, when both ran."""
        rate = {r.engine: r.new_tokens_per_s for r in self.rows if r.new_tokens_per_s}
        return rate["headcount"] / rate["vllm"] if "headcount" in rate and "vllm" in rate else None

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "rows"}
        out.update(rows=[asdict(r) for r in self.rows], ratio=self.ratio, target_ratio=TARGET_RATIO)
        return out


def check_task_engines(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in TASK_ENGINES]
    if bad or not names:
        raise ValueError(f"--engines: with --task, expected a comma-separated list of {', '.join(TASK_ENGINES)}, "
                         f"got {text!r}")
    return list(dict.fromkeys(names))


def run_task_decode(model_name: str = "qwen2.5-coder-0.5b", task: str = "humaneval", *, limit: int | None = None,
                    batch: int = 32, engines=TASK_ENGINES, max_new_tokens: int | None = None,
                    workdir: Path = Path("out/serve"), log=None) -> TaskDecodeResult:
    from headcount.arguments import positive_int
    from headcount.engines.processes import cpu_name
    from headcount.engines.rows import EngineUnavailable
    from headcount.models import load
    from headcount.tasks.harness import Settings, check_model, generate_completions
    from headcount.tasks.problems import load_problems, task_label
    from headcount.tasks.prompts import choose_format, completion_of, prompt_ids

    positive_int("--batch", batch, expected="a whole number >= 1")
    positive_int("--new-tokens", max_new_tokens, expected="a whole number >= 1", none=True)
    say = log or (lambda msg: None)
    problems = load_problems(task, limit=limit)  # a bad task or limit fails before any loading
    say(f"loading {model_name} (fp32)")
    model = load(model_name)
    check_model(model)
    fmt = choose_format(model, "auto")
    ids = [prompt_ids(model, p, fmt) for p in problems]
    budget = min(max_new_tokens or fmt.max_new_tokens, model.config.max_position - max(len(i) for i in ids))
    result = TaskDecodeResult(model_name, task_label(task), fmt.label, len(problems), batch, budget, cpu_name())
    answers: dict[str, list[str]] = {}

    if "headcount" in engines:
        import torch

        say(f"headcount's engine: {len(problems)} prompts, {batch} rows, up to {budget} new tokens each")
        settings = Settings(max_new_tokens=budget, batch_size=batch)
        generate_completions(model, problems[:1], fmt, Settings(max_new_tokens=2, batch_size=1))  # warm-up, as vLLM's
        completions, tokens, seconds = generate_completions(model, problems, fmt, settings)
        answers["headcount"] = [c.completion for c in completions]
        result.rows.append(TaskDecodeRow("headcount", tokens, seconds, tokens / seconds,
                                         torch.get_num_threads()))
    if "vllm" in engines:
        say(f"vllm: the same {len(problems)} prompts, max_num_seqs {batch}")
        try:
            answers["vllm"], row = _vllm(model, ids, budget, batch, fmt.stops(model.tokenizer), workdir, say)
            answers["vllm"] = [completion_of(t, fmt, p.entry_point, p.prompt)
                               for t, p in zip(answers["vllm"], problems)]
            result.rows.append(row)
        except EngineUnavailable as e:
            result.rows.append(TaskDecodeRow("vllm", skipped=str(e)))
    if "headcount" in answers:
        for row in result.rows:
            if row.engine in answers:
                row.same_answers = sum(a == b for a, b in zip(answers[row.engine], answers["headcount"]))
    return result


def _vllm(model, ids: list[list[int]], budget: int, batch: int, stops: list[str], workdir: Path, say):
    """(vLLM's raw answer texts, its row): the model exported once under workdir, one worker run."""
    import os

    from headcount.engines.vllm_engine import export, run_worker, vllm_python
    from headcount.models.fingerprint import weights_hash

    vllm_python()  # EngineUnavailable (with the make target) before the export's minutes
    directory = Path(workdir) / f"vllm-{model.name.replace('/', '-')}-{weights_hash(model)[:12]}"
    say(f"vllm: exporting to {directory}" if not directory.is_dir() else f"vllm: reusing {directory}")
    export(model, directory)
    threads = len(os.sched_getaffinity(0))
    # room for the longest prompt and its whole budget; the cache holds `batch` rows of ~1k tokens with room to spare
    need = max(len(i) for i in ids) + budget
    kv_gib = max(1, -(-batch * 1024 * _kv_bytes_per_token(model) // 2**30))
    t0 = time.perf_counter()
    answer = run_worker({"model": str(directory), "max_model_len": need, "max_num_seqs": batch, "tokenizer": True,
                         "kv_cache_bytes": kv_gib * 2**30,
                         "jobs": [{"kind": "generate", "prompts": ids, "max_tokens": budget, "stop": stops}]},
                        threads=threads, timeout=7200)
    job = answer["jobs"][0]
    say(f"vllm: {time.perf_counter() - t0:.0f} s with loading, {job['generate_s']:.0f} s generating")
    tokens = sum(r["new_tokens"] for r in job["rows"])
    row = TaskDecodeRow("vllm", tokens, job["generate_s"], tokens / job["generate_s"],
                        answer.get("threads"))
    return [r["text"] for r in job["rows"]], row


def _kv_bytes_per_token(model) -> int:
    from headcount.models.dropped import attention_layers

    attn = [model.layers[i].attn for i in attention_layers(model)]
    return sum(2 * a.n_kv_heads * a.head_dim * 4 for a in attn)  # K and V, fp32


def render(result: TaskDecodeResult, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{result.model} fp32, {result.task}: {result.n_prompts} prompts ({result.prompt_format}), "
                        f"batch {result.batch}, up to {result.max_new_tokens} new tokens; {result.cpu}")
    for col in ("engine", "threads", "new tokens", "seconds", "new tokens/s", "same answers as headcount"):
        table.add_column(col, justify="right")
    for r in result.rows:
        if r.skipped:
            table.add_row(r.engine, "", "", "", f"[yellow]skipped[/]: {r.skipped}", "")
            continue
        table.add_row(r.engine, str(r.threads), str(r.new_tokens), f"{r.seconds:.1f}", f"{r.new_tokens_per_s:.1f}",
                      f"{r.same_answers}/{result.n_prompts}" if r.same_answers is not None else "")
    console.print(table)
    if result.ratio is not None:
        good = result.ratio >= TARGET_RATIO
        console.print(f"headcount / vLLM new tokens/s: [{'green' if good else 'red'}]{result.ratio:.2f}x[/] "
                      f"(target >= {TARGET_RATIO:g}x)")
