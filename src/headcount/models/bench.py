"""`headcount bench decode` (and benchmarks/decode.py): SmolLM2 fp32, headcount against transformers.

Both run in this process on the same fp32 weights (transformers' LlamaForCausalLM is built from
headcount's weights, attn_implementation="sdpa"), on the same prompt: the first 512 tokens of the
default corpus's held-out part. Measured with paired repeats (each repeat runs every contender once, in
turn, so drift hits them alike):

    prefill   = time of generating 1 token after the prompt (prefill + the first token)
    decode    = 64 / (time of generating 65 tokens - time of generating 1), in tokens per second

Medians over the repeats. Targets: decode >= 1.3x transformers' tokens/s, prefill <= 0.9x its time.
Each headcount call packs the weights for oneDNN itself (packing.py, ~0.15-0.3 s): the prefill time
includes it, the decode rate (a difference of two calls) does not need to.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from headcount.arguments import positive_int

TARGET_DECODE = 1.3
TARGET_PREFILL = 0.9


def run(prompt_tokens: int = 512, new_tokens: int = 64, repeats: int = 3, *, model_name: str = "smollm2",
        log=None) -> dict:
    import torch

    from headcount.bench.timing import paired_times
    from headcount.data import default_corpus
    from headcount.models import load
    from headcount.models.formats.hf import to_transformers
    from headcount.models.decoder import Decoder
    from headcount.models.generation import generate

    for name, value in (("--prompt-tokens", prompt_tokens), ("--new-tokens", new_tokens), ("--repeats", repeats)):
        positive_int(name, value, expected="a positive number")  # the same words as bench_batch.run's
    say = log or (lambda msg: None)
    say(f"loading {model_name} (fp32) and building transformers' model on the same weights")
    model = load(model_name)
    if not isinstance(model, Decoder) or model.config.family not in ("llama", "qwen2"):
        raise ValueError(f"bench decode needs a Llama/Qwen2 decoder, not {model_name!r}")
    hf = to_transformers(model, attn_implementation="sdpa")
    corpus = default_corpus()
    stream = model.tokenizer.encode(corpus.held_out_text + "\n\n" + corpus.calibration_text)
    if prompt_tokens + new_tokens + 1 > model.config.max_position:
        raise ValueError(f"{prompt_tokens} + {new_tokens + 1} tokens is past the model's context of "
                         f"{model.config.max_position}")
    prompt = stream[:prompt_tokens]
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    n_long = new_tokens + 1
    outputs: dict[str, list[int]] = {}

    def hf_gen(n):
        def fn():
            with torch.inference_mode():
                out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  pad_token_id=model.config.pad_token_id or 0)
            outputs[f"transformers {n}"] = out[0, len(prompt):].tolist()
        return fn

    def hc_gen(n):
        def fn():
            outputs[f"headcount {n}"] = generate(model, prompt, n, stop_at_eos=False).new_ids
        return fn

    contenders = {"transformers prefill": hf_gen(1), "headcount prefill": hc_gen(1),
                  "transformers generate": hf_gen(n_long), "headcount generate": hc_gen(n_long)}
    say(f"timing: prompt {prompt_tokens} tokens, {n_long} new tokens, {repeats} paired repeats "
        f"(+1 warm-up), torch threads {torch.get_num_threads()}")
    times = paired_times(contenders, repeats=repeats, warmup=1)
    med = {k: statistics.median(v) for k, v in times.items()}
    from headcount.models.packing import available, packed
    pack_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        with packed(model):
            pass
        pack_times.append(time.perf_counter() - t0)
    result = {
        "model": model_name, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "repeats": repeats,
        "threads": torch.get_num_threads(),
        "transformers": {"prefill_s": med["transformers prefill"],
                         "decode_tokens_per_s": new_tokens / (med["transformers generate"] - med["transformers prefill"])},
        "headcount": {"prefill_s": med["headcount prefill"],
                      "decode_tokens_per_s": new_tokens / (med["headcount generate"] - med["headcount prefill"]),
                      "packing_s": statistics.median(pack_times) if available() else None},
        "same_tokens": outputs[f"transformers {n_long}"] == outputs[f"headcount {n_long}"],
        "times": times,
    }
    result["prefill_ratio"] = result["headcount"]["prefill_s"] / result["transformers"]["prefill_s"]
    result["decode_ratio"] = (result["headcount"]["decode_tokens_per_s"]
                              / result["transformers"]["decode_tokens_per_s"])
    result["targets_met"] = result["prefill_ratio"] <= TARGET_PREFILL and result["decode_ratio"] >= TARGET_DECODE
    return result


def render(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t, h = result["transformers"], result["headcount"]
    table = Table(title=f"{result['model']} fp32 on CPU ({result['threads']} threads): {result['prompt_tokens']}-token "
                        f"prompt, then {result['new_tokens']} new tokens; medians of {result['repeats']} paired repeats")
    for col in ("", "transformers", "headcount", "ratio", "target"):
        table.add_column(col, justify="right" if col else "left")
    ok = lambda good: "[green]met[/]" if good else "[red]missed[/]"  # noqa: E731
    table.add_row("prefill (s)", f"{t['prefill_s']:.3f}", f"{h['prefill_s']:.3f}",
                  f"{result['prefill_ratio']:.2f}x time", f"<= {TARGET_PREFILL}x  {ok(result['prefill_ratio'] <= TARGET_PREFILL)}")
    table.add_row("decode (tokens/s)", f"{t['decode_tokens_per_s']:.1f}", f"{h['decode_tokens_per_s']:.1f}",
                  f"{result['decode_ratio']:.2f}x speed", f">= {TARGET_DECODE}x  {ok(result['decode_ratio'] >= TARGET_DECODE)}")
    console.print(table)
    console.print(f"greedy tokens identical to transformers': {'yes' if result['same_tokens'] else '[red]NO[/]'}")
    if h.get("packing_s") is not None:
        console.print(f"headcount's prefill includes packing its weights for oneDNN ({h['packing_s']:.2f} s, "
                      "done by each generate() call; hold headcount.models.packed(model) to pay it once)")
    else:
        console.print("oneDNN weight packing is not available in this torch build: plain nn.Linear throughout")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    result = run(args.prompt_tokens, args.new_tokens, args.repeats, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        render(result)
    return 0
