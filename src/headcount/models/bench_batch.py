"""`headcount bench decode --batch 1,8,32`: new tokens/s of batched generation, headcount against
transformers' generate() on the same weights and the same prompts, paired in one run.

For each batch size B: B different prompts of `prompt_tokens` tokens each (consecutive windows of the
default corpus's held-out part, so no row is padded and both engines see identical input), and

    decode throughput = B x new_tokens / (time of B x (new_tokens + 1) tokens - time of B x 1 token)

so prefill is not counted. Each repeat runs every contender once, in turn (bench/timing.py), and the
figures are medians over the repeats. Targets: headcount >= 1.5x transformers at every batch size, and
the largest batch's throughput >= 8x batch 1's.
"""

from __future__ import annotations

import statistics

from headcount.arguments import positive_int, positive_ints

TARGET_SPEEDUP = 1.5
TARGET_SCALING = 8.0


def run(model_name: str = "qwen2.5-coder-0.5b", batches=(1, 8, 32), *, prompt_tokens: int = 128,
        new_tokens: int = 32, repeats: int = 3, log=None) -> dict:
    import torch

    from headcount.bench.timing import paired_times
    from headcount.data import default_corpus
    from headcount.models import generate, load, packed
    from headcount.models.decoder import Decoder
    from headcount.models.formats.hf import to_transformers
    from headcount.models.packing import whole_when_memory_allows

    positive_ints("--batch", list(batches))
    for name, value in (("--prompt-tokens", prompt_tokens), ("--new-tokens", new_tokens), ("--repeats", repeats)):
        positive_int(name, value, expected="a positive number")
    say = log or (lambda msg: None)
    say(f"loading {model_name} (fp32) and building transformers' model on the same weights")
    model = load(model_name)
    if not isinstance(model, Decoder) or model.tokenizer is None:
        raise ValueError(f"--model: bench decode needs a decoder with a tokenizer, not {model_name!r}")
    hf = to_transformers(model, attn_implementation="sdpa")
    corpus = default_corpus()
    stream = model.tokenizer.encode(corpus.held_out_text + "\n\n" + corpus.calibration_text)
    largest = max(batches)
    if largest * prompt_tokens > len(stream):
        raise ValueError(f"--batch {largest} x --prompt-tokens {prompt_tokens} needs {largest * prompt_tokens} "
                         f"tokens of text; the corpus has {len(stream)}")
    pad = model.config.pad_token_id or 0
    rows = []
    with packed(model, max_bytes=whole_when_memory_allows(model)):  # packed once for the run, as a user holding packed(model) around many calls
        for batch in batches:
            prompts = [stream[i * prompt_tokens:(i + 1) * prompt_tokens] for i in range(batch)]
            ids = torch.tensor(prompts)
            outputs: dict[str, list] = {}

            def hf_gen(n, ids=ids, outputs=outputs):
                def fn():
                    with torch.inference_mode():
                        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                          min_new_tokens=n, do_sample=False, pad_token_id=pad)
                    outputs[f"transformers {n}"] = out[:, prompt_tokens:].tolist()
                return fn

            def hc_gen(n, prompts=prompts, outputs=outputs):
                def fn():
                    outputs[f"headcount {n}"] = [r.new_ids for r in generate(model, prompts, n, stop_at_eos=False)]
                return fn

            n_long = new_tokens + 1
            say(f"batch {batch}: {prompt_tokens}-token prompts, {n_long} new tokens, {repeats} paired repeats")
            times = paired_times({"transformers 1": hf_gen(1), "headcount 1": hc_gen(1),
                                  "transformers long": hf_gen(n_long), "headcount long": hc_gen(n_long)},
                                 repeats=repeats, warmup=1)
            med = {k: statistics.median(v) for k, v in times.items()}
            rate = {who: batch * new_tokens / (med[f"{who} long"] - med[f"{who} 1"])
                    for who in ("transformers", "headcount")}
            rows.append({"batch": batch, "transformers_tokens_per_s": rate["transformers"],
                         "headcount_tokens_per_s": rate["headcount"],
                         "speedup": rate["headcount"] / rate["transformers"],
                         "same_tokens": outputs[f"transformers {n_long}"] == outputs[f"headcount {n_long}"],
                         "times": times})
    first, last = rows[0], rows[-1]
    scaling = last["headcount_tokens_per_s"] / first["headcount_tokens_per_s"] if first["batch"] == 1 else None
    return {"model": model_name, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "repeats": repeats,
            "threads": torch.get_num_threads(), "rows": rows, "scaling": scaling,
            "targets": {"speedup": TARGET_SPEEDUP, "scaling": TARGET_SCALING}}


def render(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{result['model']} fp32 on CPU ({result['threads']} threads): {result['prompt_tokens']}-token "
                        f"prompts, {result['new_tokens']} new tokens each; medians of {result['repeats']} paired repeats")
    for col in ("batch", "transformers (new tokens/s)", "headcount (new tokens/s)", "ratio", "same tokens"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        good = r["speedup"] >= TARGET_SPEEDUP
        table.add_row(str(r["batch"]), f"{r['transformers_tokens_per_s']:.1f}", f"{r['headcount_tokens_per_s']:.1f}",
                      f"[{'green' if good else 'red'}]{r['speedup']:.2f}x[/]", "yes" if r["same_tokens"] else "[red]no[/]")
    console.print(table)
    if result["scaling"] is not None:
        console.print(f"batch {result['rows'][-1]['batch']} / batch 1 throughput: {result['scaling']:.1f}x "
                      f"(target >= {TARGET_SCALING:g}x)")
