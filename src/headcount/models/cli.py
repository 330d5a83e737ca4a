"""`headcount perplexity`, `headcount generate`, `headcount bench decode`, `headcount bench exactness`.

torch and the models are imported inside the commands: the CLI itself must start fast.
Bad input (unknown model, missing package, unreadable file, a prompt past the context...) prints one
line to stderr and exits with status 2, no traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from headcount.arguments import one_of, positive_int
from headcount.models.options import DEVICE_HELP, DTYPE_HELP, MODEL_HELP

# the one-line error handler every room's CLI uses (headcount/cli_errors.py), under its old name too
from headcount.cli_errors import EXIT_BAD_INPUT, one_line_errors as _one_line_errors  # noqa: E402,F401


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


def register(app, bench_app, *, tp_setup=None) -> None:
    """Add the commands. tp_setup: what `generate --tp` calls, (model, *, seed, sample, log) -> (is rank 0,
    the seed every rank shares); the switchboard passes the parallel room's, which sits above models, so this
    room never imports it. None: `--tp` says tensor parallelism is not available."""
    from headcount.models.formats import cli as formats_cli

    formats_cli.register(app)

    @app.command("perplexity")
    def perplexity_cmd(
        model: str = typer.Option("smollm2", "--model", "-m", help=MODEL_HELP),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        text: Optional[Path] = typer.Option(None, "--text", help="a UTF-8 text file to measure on, whole "
                                            "(default: the held-out part of the default corpus)"),
        window: int = typer.Option(1024, "--window", help="tokens per non-overlapping window"),
        part: str = typer.Option("held_out", "--part", help="default corpus part: held_out or calibration"),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="use only the first N tokens"),
        batch_size: int = typer.Option(1, "--batch-size", help="full windows evaluated together"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
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

    @app.command("generate")
    def generate_cmd(
        prompt: Optional[str] = typer.Argument(None, help="the text to continue (or --chat)"),
        model: str = typer.Option("smollm2", "--model", "-m", help=MODEL_HELP),
        chat: Optional[str] = typer.Option(None, "--chat", help="a user message, through the model's own chat "
                                           "template (GGUF tokenizer.chat_template or the checkpoint's)"),
        system: Optional[str] = typer.Option(None, "--system", help="a system message before --chat's"),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", help="tokens to generate"),
        temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 samples"),
        top_k: Optional[int] = typer.Option(None, "--top-k", help="sample among the k most likely tokens"),
        seed: Optional[int] = typer.Option(None, "--seed", help="random seed for sampling"),
        no_stop: bool = typer.Option(False, "--no-stop", help="keep going past the end-of-sequence token"),
        tp: bool = typer.Option(False, "--tp", help="shard the heads over the ranks of torchrun "
                                "(torchrun --nproc-per-node N -m headcount generate --tp ...); only rank 0 prints"),
    ) -> None:
        """Stream a continuation of PROMPT, token by token, using the KV cache."""
        main = True
        with _one_line_errors("generate"):
            from headcount.models.generation import TextStreamer, stream_tokens

            if (prompt is None) == (chat is None):
                raise ValueError("generate: give either a PROMPT to continue or --chat MESSAGE (not both)")
            if system is not None and chat is None:
                raise ValueError("--system: goes with --chat MESSAGE")
            lm = _decoder(model, dtype, device)
            if chat is not None:
                messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                    [{"role": "user", "content": chat}]
                prompt = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            if tp:  # tensor parallel by heads; every rank generates the same tokens, only rank 0 prints them
                if tp_setup is None:
                    raise ValueError("--tp: tensor parallelism is not available (headcount.parallel is not registered)")
                main, seed = tp_setup(lm, seed=seed, sample=temperature > 0, log=_log)
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

    @bench_app.command("exactness")
    def bench_exactness(
        window: int = typer.Option(1024, "--window", help="smollm2's perplexity window"),
        models: Optional[str] = typer.Option(None, "--models", help="comma-separated rows: minilm, smollm2, "
                                             "qwen2.5-coder-0.5b, gemma3-270m, families (default: all)"),
        gguf_window: int = typer.Option(512, "--gguf-window", help="qwen2.5-coder-0.5b / gemma3-270m "
                                        "perplexity window"),
        gguf_windows: int = typer.Option(4, "--gguf-windows", help="their held-out windows (0 = the whole "
                                         "held-out corpus)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
        families_only: bool = typer.Option(False, "--families", help="only the random small model of every "
                                           "family (no model packages needed; the same as --models families)"),
    ) -> None:
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

    @bench_app.command("decode")
    def bench_decode(
        prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="prompt length (512; 128 with "
                                                    "--batch)"),
        new_tokens: Optional[int] = typer.Option(None, "--new-tokens", help="decode steps timed (64; 32 with --batch)"),
        repeats: int = typer.Option(3, "--repeats", help="paired repeats (medians)"),
        batch: Optional[str] = typer.Option(None, "--batch", help="comma-separated batch sizes, e.g. 1,8,32: "
                                            "batched generation's new tokens/s against transformers'"),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="smollm2 (default); with --batch "
                                            "qwen2.5-coder-0.5b"),
        json_out: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    ) -> None:
        """Prefill time and decode tokens/s, headcount vs transformers on the same weights (one prompt); with
        --batch, new tokens/s of batched generation at each batch size."""
        with _one_line_errors("bench decode"):
            if batch is not None:
                from headcount.models import bench_batch as bench

                try:
                    sizes = tuple(int(b) for b in batch.split(","))
                except ValueError:
                    raise ValueError(f"--batch: expected comma-separated whole numbers, got {batch!r}") from None
                result = bench.run(model or "qwen2.5-coder-0.5b", sizes, prompt_tokens=prompt_tokens or 128,
                                   new_tokens=new_tokens or 32, repeats=repeats, log=_log)
            else:
                from headcount.models import bench

                result = bench.run(prompt_tokens or 512, new_tokens or 64, repeats, model_name=model or "smollm2",
                                   log=_log)
        if json_out:
            typer.echo(json.dumps(result, indent=2))
        else:
            bench.render(result)
