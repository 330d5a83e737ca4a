"""`headcount perplexity`, `headcount generate`, `headcount bench decode`, `headcount bench exactness`.

torch and the models are imported inside the commands: the CLI itself must start fast.
Bad input (unknown model, missing package, unreadable file, a prompt past the context...) prints one
line to stderr and exits with status 2, no traceback. Each command is a module-level function over the shared
options (headcount.cli_options) and this module's own; register() only adds them.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from headcount.arguments import one_of, positive_int
from headcount.cli_options import (DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, OptionalModelOpt, OptionalSeedOpt,
                                   TextFileOpt)

# the one-line error handler every room's CLI uses (headcount/cli_errors.py), under its old name too
from headcount.cli_errors import EXIT_BAD_INPUT, one_line_errors as _one_line_errors  # noqa: E402,F401

# this module's own options
WindowOpt = Annotated[int, typer.Option("--window", help="tokens per non-overlapping window")]
PartOpt = Annotated[str, typer.Option("--part", help="default corpus part: held_out or calibration")]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", help="use only the first N tokens")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="full windows evaluated together")]
PromptArg = Annotated[Optional[str], typer.Argument(help="the text to continue (or --chat)")]
ChatOpt = Annotated[Optional[str], typer.Option("--chat", help="a user message, through the model's own chat "
                                                              "template (GGUF tokenizer.chat_template or the "
                                                              "checkpoint's)")]
SystemOpt = Annotated[Optional[str], typer.Option("--system", help="a system message before --chat's")]
NewTokensOpt = Annotated[int, typer.Option("--max-new-tokens", "-n", help="tokens to generate")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy; > 0 samples")]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="sample among the k most likely tokens")]
NoStopOpt = Annotated[bool, typer.Option("--no-stop", help="keep going past the end-of-sequence token")]
TpOpt = Annotated[bool, typer.Option("--tp", help="shard the heads over the ranks of torchrun (torchrun "
                                                  "--nproc-per-node N -m headcount generate --tp ...); only rank 0 "
                                                  "prints")]
ExactWindowOpt = Annotated[int, typer.Option("--window", help="smollm2's perplexity window")]
ModelsOpt = Annotated[Optional[str], typer.Option("--models", help="comma-separated rows: minilm, smollm2, "
                                                                   "qwen2.5-coder-0.5b, gemma3-270m, families "
                                                                   "(default: all)")]
GGUFWindowOpt = Annotated[int, typer.Option("--gguf-window", help="qwen2.5-coder-0.5b / gemma3-270m perplexity "
                                                                  "window")]
GGUFWindowsOpt = Annotated[int, typer.Option("--gguf-windows", help="their held-out windows (0 = the whole held-out "
                                                                    "corpus)")]
FamiliesOpt = Annotated[bool, typer.Option("--families", help="only the random small model of every family (no "
                                                              "model packages needed; the same as --models "
                                                              "families)")]
PromptTokensOpt = Annotated[Optional[int], typer.Option("--prompt-tokens", help="prompt length (512; 128 with "
                                                                               "--batch)")]
DecodeTokensOpt = Annotated[Optional[int], typer.Option("--new-tokens", help="decode steps timed (64; 32 with "
                                                                            "--batch)")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="paired repeats (medians)")]
BatchesOpt = Annotated[Optional[str], typer.Option("--batch", help="comma-separated batch sizes, e.g. 1,8,32: "
                                                                   "batched generation's new tokens/s against "
                                                                   "transformers'")]


def _log(msg: str) -> None:
    typer.echo(f"headcount: {msg}", err=True)


def _decoder(name: str, dtype: str = "fp32", device: str = "cpu"):
    from headcount.models.decoder import Decoder
    from headcount.models.options import load_model

    model = load_model(name, dtype, device)
    if not isinstance(model, Decoder):
        raise ValueError(f"model {name!r} is an encoder; this command needs a decoder (causal LM) such as smollm2")
    if model.tokenizer is None:
        raise ValueError(f"model {name!r} has no tokenizer.json")
    return model


# ------------------------------------------------------------------------------------- perplexity
def perplexity_cmd(model: ModelOpt = "smollm2", dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
                   text: TextFileOpt = None, window: WindowOpt = 1024, part: PartOpt = "held_out",
                   max_tokens: MaxTokensOpt = None, batch_size: BatchSizeOpt = 1, json_out: JsonOpt = False) -> None:
    """Perplexity: exp(mean NLL per token) over non-overlapping windows; each window's first token
    is not scored (it has no context in its window)."""
    with _one_line_errors("perplexity"):
        from headcount.data import default_corpus, read_text
        from headcount.models.evaluation import evaluate_perplexity

        one_of("--part", part, ("held_out", "calibration"), expected="held_out or calibration")
        positive_int("--max-tokens", max_tokens, 2, none=True, expected="at least 2")
        positive_int("--batch-size", batch_size, expected="a positive number")
        if text is not None:
            source, texts = str(text), read_text(text)
        else:
            source, texts = f"default corpus, {part.replace('_', '-')} part", default_corpus().texts(part)
        lm = _decoder(model, dtype, device)
        progress = None
        if sys.stderr.isatty() and not json_out:
            progress = lambda done, total: typer.echo(f"\r  window {done}/{total}", nl=done == total, err=True)  # noqa: E731
        result = evaluate_perplexity(lm, texts, window, batch_size=batch_size, max_tokens=max_tokens,
                                     progress=progress)
    if json_out:
        typer.echo(json.dumps({"model": model, "source": source, "params": sum(p.numel() for p in lm.parameters()),
                               **result.__dict__}))
    else:
        typer.echo(f"{model} on {source}: {result}")


# --------------------------------------------------------------------------------------- generate
def chat_prompt(lm, chat: str, system: str | None) -> str:
    """--chat (and --system) through the model's own chat template, ready to continue."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": chat}]
    return lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def stream_text(lm, prompt, *, max_new_tokens: int, temperature: float, top_k, seed, no_stop: bool,
                main: bool = True) -> None:
    """Write the continuation to stdout token by token (rank 0 only), then the speeds to stderr."""
    from headcount.models.generation import TextStreamer, stream_tokens

    timings: dict = {}
    tokens = stream_tokens(lm, prompt, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                           stop_at_eos=not no_stop, timings=timings)
    streamer = TextStreamer(lm.tokenizer)
    n = 0
    for token in tokens:
        n += 1
        if token == lm.config.eos_token_id and not no_stop:
            break
        piece = streamer.push(token)
        if piece and main:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if not main:
        return
    sys.stdout.write("\n")
    rate = (n - 1) / timings["decode_s"] if n > 1 and timings.get("decode_s") else float("nan")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(lm.tokenizer.encode(prompt))
    _log(f"{n} tokens; prompt {prompt_tokens} tokens in {timings.get('prefill_s', 0):.2f} s, "
         f"then {rate:.1f} tokens/s")


def generate_command(tp_setup=None):
    """`headcount generate`, bound to what its --tp calls: tp_setup(model, *, seed, sample, log) -> (is rank 0,
    the seed every rank shares), or None (--tp then says tensor parallelism is not available)."""

    def generate_cmd(prompt: PromptArg = None, model: ModelOpt = "smollm2", chat: ChatOpt = None,
                     system: SystemOpt = None, dtype: DtypeOpt = "fp32", device: DeviceOpt = "cpu",
                     max_new_tokens: NewTokensOpt = 64, temperature: TemperatureOpt = 0.0, top_k: TopKOpt = None,
                     seed: OptionalSeedOpt = None, no_stop: NoStopOpt = False, tp: TpOpt = False) -> None:
        """Stream a continuation of PROMPT, token by token, using the KV cache."""
        with _one_line_errors("generate"):
            if (prompt is None) == (chat is None):
                raise ValueError("generate: give either a PROMPT to continue or --chat MESSAGE (not both)")
            if system is not None and chat is None:
                raise ValueError("--system: goes with --chat MESSAGE")
            lm = _decoder(model, dtype, device)
            if chat is not None:
                prompt = chat_prompt(lm, chat, system)
            main = True
            if tp:  # tensor parallel by heads; every rank generates the same tokens, only rank 0 prints them
                if tp_setup is None:
                    raise ValueError("--tp: tensor parallelism is not available (headcount.parallel is not registered)")
                main, seed = tp_setup(lm, seed=seed, sample=temperature > 0, log=_log)
            stream_text(lm, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                        no_stop=no_stop, main=main)

    return generate_cmd


# ---------------------------------------------------------------------------------------- benches
def bench_exactness(window: ExactWindowOpt = 1024, models: ModelsOpt = None, gguf_window: GGUFWindowOpt = 512,
                    gguf_windows: GGUFWindowsOpt = 4, json_out: JsonOpt = False,
                    families_only: FamiliesOpt = False) -> None:
    """Every embedded model (and a random small model of every family) against transformers on the same
    weights: logits, perplexity, greedy tokens, Gemma past its sliding window."""
    with _one_line_errors("bench exactness"):
        from headcount.models import exactness

        if families_only:
            if models is not None:
                raise ValueError("--families: give either it or --models, not both")
            models = exactness.FAMILIES

        positive_int("--gguf-windows", gguf_windows, 0, expected=">= 0")
        result = exactness.run(window, models=models, gguf_window=gguf_window,
                               gguf_windows=gguf_windows or None, log=_log)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    else:
        exactness.render(result)


def _batch_sizes(batch: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in batch.split(","))
    except ValueError:
        raise ValueError(f"--batch: expected comma-separated whole numbers, got {batch!r}") from None


TaskOpt = Annotated[Optional[str], typer.Option("--task", help="humaneval: the eval's own prompts, stops and budget "
                                                            "at --batch rows, headcount against vLLM (new tokens/s)")]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", help="with --task: the first N problems")]
TaskEnginesOpt = Annotated[str, typer.Option("--engines", help="with --task: comma-separated headcount, vllm")]


def bench_decode_command(task_decode=None):
    """`headcount bench decode`, bound to what its --task runs: task_decode(model, task, *, limit, batch, engines,
    max_new_tokens, log) -> a result with to_json() and render(), from the engines room (above this one: it runs
    vLLM out of process); None: --task says so."""

    def bench_decode(prompt_tokens: PromptTokensOpt = None, new_tokens: DecodeTokensOpt = None,
                     repeats: RepeatsOpt = 3, batch: BatchesOpt = None, model: OptionalModelOpt = None,
                     task: TaskOpt = None, limit: LimitOpt = None, engines: TaskEnginesOpt = "headcount,vllm",
                     json_out: JsonOpt = False) -> None:
        """Prefill time and decode tokens/s, headcount vs transformers on the same weights (one prompt); with
        --batch, new tokens/s of batched generation at each batch size. --model: smollm2 by default, with --batch
        qwen2.5-coder-0.5b. With --task humaneval: the eval's generation (its prompts, stops and token budget,
        --batch rows, default 32) in headcount and in vLLM on the same weights, new tokens/s and their ratio."""
        with _one_line_errors("bench decode"):
            if task is not None:
                if task_decode is None:
                    raise ValueError("--task: this build has no engines room to run vLLM from")
                if prompt_tokens is not None:
                    raise ValueError("--prompt-tokens: with --task the prompts are the task's own")
                sizes = _batch_sizes(batch) if batch is not None else (32,)
                if len(sizes) != 1:
                    raise ValueError(f"--batch: with --task give one batch size, got {batch!r}")
                result, render = task_decode(model or "qwen2.5-coder-0.5b", task, limit=limit, batch=sizes[0],
                                             engines=engines, max_new_tokens=new_tokens, log=_log)
                if json_out:
                    typer.echo(json.dumps(result.to_json(), indent=2))
                else:
                    render(result)
                return
            for flag, value in (("--limit", limit),):
                if value is not None:
                    raise ValueError(f"{flag}: only with --task")
            if batch is not None:
                from headcount.models import bench_batch as bench

                result = bench.run(model or "qwen2.5-coder-0.5b", _batch_sizes(batch),
                                   prompt_tokens=prompt_tokens or 128, new_tokens=new_tokens or 32, repeats=repeats,
                                   log=_log)
            else:
                from headcount.models import bench

                result = bench.run(prompt_tokens or 512, new_tokens or 64, repeats, model_name=model or "smollm2",
                                   log=_log)
        if json_out:
            typer.echo(json.dumps(result, indent=2))
        else:
            bench.render(result)

    return bench_decode


def register(app, bench_app, *, tp_setup=None, task_decode=None) -> None:
    """Add the commands. tp_setup: what `generate --tp` calls, (model, *, seed, sample, log) -> (is rank 0,
    the seed every rank shares); the switchboard passes the parallel room's, which sits above models, so this
    room never imports it. None: `--tp` says tensor parallelism is not available. task_decode: what `bench decode
    --task` runs (bench_decode_command), from the engines room."""
    from headcount.models.formats import cli as formats_cli

    formats_cli.register(app)
    app.command("perplexity")(perplexity_cmd)
    app.command("generate")(generate_command(tp_setup))
    bench_app.command("exactness")(bench_exactness)
    bench_app.command("decode")(bench_decode_command(task_decode))
