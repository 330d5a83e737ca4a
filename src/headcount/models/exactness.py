"""`headcount bench exactness`: the embedded models against transformers on the same weights, printed.

- minilm: last hidden states vs transformers' BertModel (eager) on a padded batch, every position and
  real tokens only;
- smollm2: logits vs LlamaForCausalLM on a padded batch (real tokens), plain and packed paths;
- smollm2 perplexity on the held-out part of the default corpus vs transformers' loss on the same
  windows (each window's first token unscored, as evaluation.py defines it);
- one random small model of each family headcount reads (built with transformers' own config classes,
  no download: llama, qwen2 and qwen3 with sliding-window layers, mistral, gemma3_text causal and
  bidirectional, gemma3's language model): logits (last hidden states for the bidirectional one) on a
  padded batch, and greedy decoding with the KV cache from a prompt longer than the sliding window
  against transformers' generate().
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


# ------------------------------------------------------------------------------- random small families
# family -> (transformers config class, model class, config fields beyond the shared shape)
RANDOM_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2, "use_sliding_window": True,
                                                  "sliding_window": 16, "max_window_layers": 2}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 48, "use_sliding_window": True,
                                                  "sliding_window": 16, "max_window_layers": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 1, "sliding_window": 16}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    {"num_key_value_heads": 1, "head_dim": 64, "sliding_window": 16, "query_pre_attn_scalar": 48,
                     "sliding_window_pattern": 3, "tie_word_embeddings": True, "pad_token_id": 0}),
    "gemma3_text bidirectional": ("Gemma3TextConfig", "Gemma3TextModel",
                                    {"num_key_value_heads": 1, "head_dim": 64, "sliding_window": 16,
                                     "sliding_window_pattern": 3, "use_bidirectional_attention": True}),
    "gemma3 text part": ("Gemma3Config", "Gemma3ForConditionalGeneration", {}),
}
SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
             max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def random_transformers_model(family: str, seed: int = 0):
    """A random small transformers model of `family` (a key of RANDOM_FAMILIES), in eval mode, with
    weights that make every tensor matter and keep greedy decoding from collapsing onto one token."""
    import torch
    import transformers

    cfg_name, model_name, extra = RANDOM_FAMILIES[family]
    fields = {**SHAPE, **extra}
    if cfg_name == "Gemma3Config":  # the image + text model: a tiny SigLIP tower beside the text model
        text = {**fields, **RANDOM_FAMILIES["gemma3_text"][2]}
        vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=28, patch_size=14)
        cfg = transformers.Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                        image_token_index=511, boi_token_index=509, eoi_token_index=510)
    else:
        cfg = getattr(transformers, cfg_name)(**fields)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    gemma = cfg_name.startswith("Gemma3")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma multiplies by 1 + w, the others by w
                p.copy_((0.0 if gemma else 1.0) + torch.randn(p.shape, generator=g) * (0.3 if gemma else 0.1))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.02 if gemma and "embed" in name else 0.2))
    return model


def random_family_vs_transformers(family: str, *, prompt_tokens: int = 24, new_tokens: int = 32) -> dict:
    """One random small model of `family`: logits (or last hidden states) max |diff| on a padded batch of
    2 x 48 tokens (real tokens only), and greedy decoding of new_tokens after a prompt longer than the
    sliding window (16) against transformers' generate()."""
    import warnings

    import torch

    from headcount.models import from_transformers, generate

    hf = random_transformers_model(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gemma3: "the vision tower is not read"
        ours = from_transformers(hf)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 509, (2, 48), generator=g)  # 0-2 are pad / bos / eos: generate() treats pad specially
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    row = {"family": family, "layers": len(ours.layers),
           "sliding_windows": [layer.attn.sliding_window for layer in ours.layers]}
    with torch.inference_mode():
        if hasattr(ours, "lm_head"):
            ref = hf(input_ids=ids, attention_mask=mask).logits
            out = ours(ids, attention_mask=mask).logits
            row["output"] = "logits"
        else:
            ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
            out = ours(ids, mask).last_hidden_state
            row["output"] = "last hidden state"
    row["max_abs_diff"] = (out - ref)[mask.bool()].abs().max().item()
    row["scale"] = ref[mask.bool()].abs().max().item()
    if hasattr(ours, "lm_head"):
        prompt = ids[:1, :prompt_tokens]
        want = hf.generate(prompt, max_new_tokens=new_tokens, do_sample=False)[0, prompt_tokens:].tolist()
        got = generate(ours, prompt[0], new_tokens).new_ids  # both stop at eos
        row.update(prompt_tokens=prompt_tokens, greedy_tokens=len(want), greedy_equal=got == want,
                   distinct_tokens=len(set(want)))
    return row


def random_families() -> list[dict]:
    return [random_family_vs_transformers(family) for family in RANDOM_FAMILIES]


def run(window: int = 1024, *, real: bool = True, families: bool = True) -> dict:
    """The real embedded models (real=True; needs their packages) and the random small families."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from installed packages
    out: dict = {}
    if real:
        out.update(minilm=minilm_vs_transformers(), smollm2=smollm2_vs_transformers(window))
    if families:
        out["families"] = random_families()
    return out


def render(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if "minilm" in result:
        m, s = result["minilm"], result["smollm2"]
        table = Table(title="headcount vs transformers on the same weights")
        for col in ("check", "measured", "bound (issue)"):
            table.add_column(col, justify="left" if col == "check" else "right")
        table.add_row("minilm last hidden state, padded batch, max |diff|", f"{m['max_abs_diff']:.1e}", "1e-4")
        table.add_row("  real tokens only", f"{m['max_abs_diff_real_tokens']:.1e}", "")
        table.add_row("smollm2 logits, max |diff| (real tokens)", f"{s['logits_max_abs_diff']:.1e}", "1e-3")
        table.add_row("  with packed weights (generate / perplexity path)", f"{s['logits_max_abs_diff_packed']:.1e}",
                      "1e-3")
        table.add_row(f"smollm2 perplexity, held-out, window {s['window']} ({s['scored_tokens']:,} tokens)",
                      f"{s['perplexity']:.4f} vs {s['perplexity_transformers']:.4f}", "")
        table.add_row("  relative difference", f"{s['perplexity_rel_diff']:.1e}", "1e-4")
        console.print(table)
    if result.get("families"):
        table = Table(title="random small models vs transformers, fp32 (bound 1e-4; greedy: 32 tokens after a "
                            "24-token prompt, window 16)")
        for col in ("family", "local layers", "max |diff|", "greedy = generate()"):
            table.add_column(col, justify="left" if col == "family" else "right")
        for row in result["families"]:
            windows = row["sliding_windows"]
            greedy = "-" if "greedy_equal" not in row else (
                f"{'yes' if row['greedy_equal'] else '[red]NO[/]'} ({row['greedy_tokens']})")
            what = "" if row["output"] == "logits" else " (hidden)"
            table.add_row(row["family"] + what, f"{sum(w is not None for w in windows)}/{len(windows)}",
                          f"{row['max_abs_diff']:.1e}", greedy)
        console.print(table)
