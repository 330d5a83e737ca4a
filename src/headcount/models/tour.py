"""The smollm2 stop of `headcount demo` (`make demo`): load, generate a few tokens, perplexity."""

from __future__ import annotations

import time


def demo_tour(console) -> None:
    """Load smollm2, show its heads and KV cache, greedily continue a prompt, and measure perplexity
    on a held-out slice of the default corpus. Skipped with one line if the package is missing."""
    from headcount.data import default_corpus
    from headcount.models import load
    from headcount.models.evaluation import evaluate_perplexity
    from headcount.models.generation import generate
    from headcount.models.zoo import ModelNotFoundError

    t0 = time.perf_counter()
    try:
        model = load("smollm2")
    except ModelNotFoundError as err:
        console.print(f"[yellow]smollm2 tour skipped:[/] {err}")
        return
    c = model.config
    attn = model.layers[0].attn
    per_token = sum(a.new_cache(1, 1).nbytes for a in model.attentions)
    console.print(f"[bold]smollm2[/] (SmolLM2-135M-Instruct, fp32) loaded in {time.perf_counter() - t0:.1f} s: "
                  f"{c.n_layers} layers, {c.n_heads} query heads sharing {c.n_kv_heads} KV heads of {c.head_dim} "
                  f"(GQA, query head i reads KV head {attn.kv_head_of}); KV cache {per_token:,} bytes per token "
                  f"({c.n_heads // c.n_kv_heads}x less than MHA)")
    prompt = "Multi-head attention lets a model"
    result = generate(model, prompt, 24)
    console.print(f"  generate (greedy, KV cache): [italic]{prompt}[/]{result.text!s}  "
                  f"[dim]({len(result.new_ids)} tokens, {result.decode_tokens_per_s:.1f} tokens/s)[/]")
    ppl = evaluate_perplexity(model, default_corpus().held_out_text, window=512, max_tokens=1024)
    console.print(f"  perplexity on a held-out slice of the default corpus: {ppl}")
    console.print("  [dim]more: headcount generate \"...\", headcount perplexity, headcount bench decode[/]")
