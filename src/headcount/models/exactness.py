"""`headcount bench exactness`: the embedded models against transformers on the same weights, printed.

- minilm: last hidden states vs transformers' BertModel (eager) on a padded batch, every position and
  real tokens only;
- smollm2: logits vs LlamaForCausalLM on a padded batch (real tokens), plain and packed paths;
- smollm2 perplexity on the held-out part of the default corpus vs transformers' loss on the same
  windows (each window's first token unscored, as evaluation.py defines it).
"""

from __future__ import annotations

import json
import math
import os

TEXTS = ["Multi-head attention runs several heads in parallel.", "Short one.",
         "Each head writes to its own slice of the output, which W_O then mixes back together."]


def minilm_vs_transformers() -> dict:
    import torch
    import transformers
    from safetensors.torch import load_file

    from headcount.models import load, zoo

    ours = load("minilm")
    d = zoo.minilm_dir()
    cfg = transformers.BertConfig(**json.loads((d / "config.json").read_text()))
    cfg._attn_implementation = "eager"
    hf = transformers.BertModel(cfg).eval()
    hf.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
    ids, mask = ours.tokenizer.batch(TEXTS)
    with torch.no_grad():
        diff = (ours(ids, mask).last_hidden_state - hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state).abs()
    return {"max_abs_diff": diff.max().item(), "max_abs_diff_real_tokens": diff[mask].max().item()}


def smollm2_vs_transformers(window: int = 1024) -> dict:
    import torch

    from headcount.data import default_corpus
    from headcount.models import evaluate_perplexity, load, packed
    from headcount.models.formats.hf import to_transformers
    from headcount.models.evaluation import token_stream, windows

    ours = load("smollm2")
    hf = to_transformers(ours, attn_implementation="sdpa")
    ids, mask = ours.tokenizer.batch(TEXTS)
    with torch.inference_mode():
        ref = hf(input_ids=ids, attention_mask=mask.long()).logits
        plain = (ours(ids, attention_mask=mask).logits - ref).abs()[mask].max().item()
        with packed(ours):
            fast = (ours(ids, attention_mask=mask).logits - ref).abs()[mask].max().item()
        texts = default_corpus().texts("held_out")
        result = evaluate_perplexity(ours, texts, window=window)
        total, n = 0.0, 0
        for w in windows(token_stream(ours, texts), window):
            x = torch.tensor([w])
            total += hf(input_ids=x, labels=x).loss.double().item() * (len(w) - 1)
            n += len(w) - 1
    ref_ppl = math.exp(total / n)
    return {"logits_max_abs_diff": plain, "logits_max_abs_diff_packed": fast, "window": window,
            "perplexity": result.perplexity, "perplexity_transformers": ref_ppl,
            "perplexity_rel_diff": abs(result.perplexity - ref_ppl) / ref_ppl, "scored_tokens": n}


def run(window: int = 1024) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from installed packages
    return {"minilm": minilm_vs_transformers(), "smollm2": smollm2_vs_transformers(window)}


def render(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    m, s = result["minilm"], result["smollm2"]
    table = Table(title="headcount vs transformers on the same weights")
    for col in ("check", "measured", "bound (issue)"):
        table.add_column(col, justify="left" if col == "check" else "right")
    table.add_row("minilm last hidden state, padded batch, max |diff|", f"{m['max_abs_diff']:.1e}", "1e-4")
    table.add_row("  real tokens only", f"{m['max_abs_diff_real_tokens']:.1e}", "")
    table.add_row("smollm2 logits, max |diff| (real tokens)", f"{s['logits_max_abs_diff']:.1e}", "1e-3")
    table.add_row("  with packed weights (generate / perplexity path)", f"{s['logits_max_abs_diff_packed']:.1e}", "1e-3")
    table.add_row(f"smollm2 perplexity, held-out, window {s['window']} ({s['scored_tokens']:,} tokens)",
                  f"{s['perplexity']:.4f} vs {s['perplexity_transformers']:.4f}", "")
    table.add_row("  relative difference", f"{s['perplexity_rel_diff']:.1e}", "1e-4")
    console.print(table)
