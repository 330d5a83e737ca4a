"""`headcount bench exactness`: the embedded models against transformers on the same weights, printed.

- minilm: last hidden states vs transformers' BertModel (eager) on a padded batch, every position and
  real tokens only;
- smollm2: logits vs LlamaForCausalLM on a padded batch (real tokens), plain and packed paths;
- smollm2 perplexity on the held-out part of the default corpus vs transformers' loss on the same
  windows (each window's first token unscored, as evaluation.py defines it);
- qwen2.5-coder-0.5b and gemma3-270m (read from GGUF) against transformers' AutoModelForCausalLM loading the same
  dequantised checkpoint directory (zoo.checkpoint_dir, byte-equal to transformers' own GGUF loader): logits
  on the first 64 tokens of the held-out corpus (plain and packed), perplexity on the first few windows of
  512, 32 greedy tokens with the KV cache against transformers' generate(); for gemma3-270m also a prompt
  of 600 tokens, past its 512-token sliding window (every position's logits, then 32 greedy tokens);
- one random small model of each family headcount reads (built with transformers' own config classes,
  no download: llama, qwen2 and qwen3 with sliding-window layers, mistral, gemma3_text causal and
  bidirectional, gemma3's language model; llama with llama3 / dynamic rope, qwen2 with yarn, phi3, smollm3,
  granite; gemma2 with attention and final soft-capping, gpt_neox with partial rotary and parallel
  residual, olmo2 with full-width q/k norms): logits (last hidden states for the bidirectional one) on a
  padded batch, and greedy decoding with the KV cache from a prompt longer than the sliding window
  against transformers' generate().
"""

from __future__ import annotations

import json
import math
import os

from headcount.arguments import positive_int

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


# ------------------------------------------------------------------------------- the GGUF zoo models
# name -> what is checked beyond logits, perplexity and greedy decoding: a prompt longer than the model's
# sliding window (gemma3-270m: 512 on 5 of every 6 layers), or None.
GGUF_MODELS = {"qwen2.5-coder-0.5b": None, "gemma3-270m": 600}
REAL_MODELS = ("minilm", "smollm2", *GGUF_MODELS)
FAMILIES = "families"  # the name of the random-families rows in `models`
ALL = (*REAL_MODELS, FAMILIES)
# the bounds a row must meet to be `ok` (the rendered table's bound column): the same weights in fp32, only the
# order of the sums differs
TARGETS = {"logits_max_abs_diff": 1e-3, "perplexity_rel_diff": 1e-4}
GGUF_WINDOW, GGUF_WINDOWS, LOGIT_TOKENS, NEW_TOKENS = 512, 4, 64, 32


def _held_out_ids(model, n: int) -> list[int]:
    """The first n token ids of the held-out corpus as a prompt (with the model's BOS where its tokenizer
    adds one: Gemma's)."""
    from headcount.data import default_corpus

    ids = model.tokenizer.encode("\n\n".join(default_corpus().texts("held_out")))
    if len(ids) < n:
        raise ValueError(f"the held-out corpus has {len(ids)} tokens; {n} are needed")
    return ids[:n]


def _max_logit_diff(ours, hf, ids, *, chunk: int = 128) -> tuple[float, float]:
    """(max |logits diff|, max |logit|) over every position of one sequence, the logits built `chunk`
    positions at a time from each side's final hidden states (600 x 262,144 fp32 logits would be 630 MB)."""
    import torch

    x = torch.tensor([ids])
    with torch.inference_mode():
        h_ours = ours(x, compute_logits=False).hidden_states[0]
        h_hf = hf.model(input_ids=x).last_hidden_state[0]
        diff = scale = 0.0
        for i in range(0, len(ids), chunk):
            ref = hf.lm_head(h_hf[i:i + chunk]).float()
            diff = max(diff, float((ours.lm_head(h_ours[i:i + chunk]).float() - ref).abs().max()))
            scale = max(scale, float(ref.abs().max()))
    return diff, scale


def _greedy(ours, hf, prompt: list[int], new_tokens: int) -> dict:
    """new_tokens greedy tokens: headcount's generate() (KV cache, packed weights) against transformers'
    generate(), neither stopping at end-of-sequence so both always give new_tokens tokens."""
    import copy

    import torch

    config = copy.deepcopy(hf.generation_config)
    config.update(do_sample=False, eos_token_id=None, max_new_tokens=new_tokens, min_new_tokens=None,
                  pad_token_id=hf.config.pad_token_id if hf.config.pad_token_id is not None else 0,
                  temperature=None, top_p=None, top_k=None)
    x = torch.tensor([prompt])
    # transformers 5 fills a passed config's unset (None) fields from the model's own generation_config,
    # eos_token_id included: clear it there too for the call
    saved = hf.generation_config.eos_token_id
    hf.generation_config.eos_token_id = None
    try:
        with torch.inference_mode():
            want = hf.generate(x, attention_mask=torch.ones_like(x),
                               generation_config=config)[0, len(prompt):].tolist()
    finally:
        hf.generation_config.eos_token_id = saved
    from headcount.models import generate

    got = generate(ours, prompt, new_tokens, stop_at_eos=False).new_ids
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    return {"prompt_tokens": len(prompt), "greedy_tokens": len(want), "greedy_equal": got == want,
            "first_difference": first, "distinct_tokens": len(set(want))}


def gguf_model_vs_transformers(name: str, *, window: int = GGUF_WINDOW, max_windows: int | None = GGUF_WINDOWS,
                               logit_tokens: int = LOGIT_TOKENS, new_tokens: int = NEW_TOKENS,
                               long_prompt: int | None = None, log=None) -> dict:
    """One GGUF zoo model (a key of GGUF_MODELS), loaded by headcount.models.load(name), against
    transformers' AutoModelForCausalLM on the same checkpoint directory (fp32, sdpa).

    - logits on the first `logit_tokens` tokens of the held-out corpus, every position (plain and packed);
    - perplexity (evaluation.evaluate_perplexity) on the first `max_windows` windows of `window` tokens of
      the held-out corpus (None = all of it) against transformers' loss on the same windows;
    - `new_tokens` greedy tokens after those `logit_tokens` tokens, headcount's generate() against
      transformers' generate();
    - long_prompt (default: GGUF_MODELS[name]): every position's logits on a prompt of that many tokens and
      greedy decoding after it (a prompt longer than a sliding window exercises the window's mask and cache).
    """
    import time

    import torch
    import transformers

    from headcount.data import default_corpus
    from headcount.models import evaluate_perplexity, load, packed, zoo
    from headcount.models.evaluation import token_stream, windows

    say = log or (lambda msg: None)
    long_prompt = GGUF_MODELS[name] if long_prompt is None else long_prompt
    t0 = time.perf_counter()
    ours = load(name)
    directory = zoo.checkpoint_dir(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                           attn_implementation="sdpa").eval()
    row: dict = {"checkpoint": directory.name, "transformers_class": type(hf).__name__,
                 "sliding_windows": sorted({layer.attn.sliding_window for layer in ours.layers
                                            if layer.attn.sliding_window is not None})}
    say(f"{name}: loaded both sides in {time.perf_counter() - t0:.1f} s")

    ids = _held_out_ids(ours, max(logit_tokens, long_prompt or 0))
    x = torch.tensor([ids[:logit_tokens]])
    with torch.inference_mode():
        ref = hf(input_ids=x).logits.float()
        row["logits_tokens"] = logit_tokens
        row["logits_max_abs_diff"] = float((ours(x).logits - ref).abs().max())
        with packed(ours):
            row["logits_max_abs_diff_packed"] = float((ours(x).logits - ref).abs().max())
        row["logit_scale"] = float(ref.abs().max())
    del ref
    row.update(_greedy(ours, hf, ids[:logit_tokens], new_tokens))
    say(f"{name}: logits and greedy decoding, {time.perf_counter() - t0:.1f} s")

    texts = default_corpus().texts("held_out")
    stream = token_stream(ours, texts)
    chunks = windows(stream, window)[:max_windows]
    result = evaluate_perplexity(ours, stream, window, max_tokens=sum(len(c) for c in chunks))
    total, n = 0.0, 0
    with torch.inference_mode():
        for w in chunks:
            xw = torch.tensor([w])
            total += hf(input_ids=xw, labels=xw).loss.double().item() * (len(w) - 1)
            n += len(w) - 1
    ref_ppl = math.exp(total / n)
    row.update(window=window, windows=len(chunks), scored_tokens=n, perplexity=result.perplexity,
               perplexity_transformers=ref_ppl, perplexity_rel_diff=abs(result.perplexity - ref_ppl) / ref_ppl)
    say(f"{name}: perplexity on {len(chunks)} windows of {window}, {time.perf_counter() - t0:.1f} s")

    if long_prompt:
        diff, scale = _max_logit_diff(ours, hf, ids[:long_prompt])
        greedy = _greedy(ours, hf, ids[:long_prompt], new_tokens)
        row["long_prompt"] = {"logits_max_abs_diff": diff, "logit_scale": scale, **greedy}
        say(f"{name}: {long_prompt}-token prompt, {time.perf_counter() - t0:.1f} s")
    row["ok"] = (row["logits_max_abs_diff"] <= TARGETS["logits_max_abs_diff"]
                 and row["logits_max_abs_diff_packed"] <= TARGETS["logits_max_abs_diff"]
                 and row["perplexity_rel_diff"] <= TARGETS["perplexity_rel_diff"] and row["greedy_equal"]
                 and ("long_prompt" not in row or (row["long_prompt"]["greedy_equal"] and row["long_prompt"][
                     "logits_max_abs_diff"] <= TARGETS["logits_max_abs_diff"])))
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


# ------------------------------------------------------------------------------- random small families
# rotary families: rope types past original_max_position_embeddings = 32 (the rows decode past it),
# Phi-3's fused projections + LongRoPE + partial rotary, SmolLM3's NoPE layers, Granite's multipliers
# A narrower shape than SHAPE's (d_model 64, 3 layers, head_dim 16): these rows are also the test suite's.
_SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.05 * i for i in range(6)],
             "long_factor": [1.0 + 0.4 * i for i in range(6)]}
ROPE_FAMILIES = {
    "llama rope llama3": ("LlamaConfig", "LlamaForCausalLM", {
        **_SMALL, "rope_parameters": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}}),
    "qwen2 rope yarn": ("Qwen2Config", "Qwen2ForCausalLM", {
        **_SMALL, "rope_parameters": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}}),
    "llama rope dynamic": ("LlamaConfig", "LlamaForCausalLM", {
        **_SMALL, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {  # head_dim 16, rotary on the first 12 dims (Phi-4-mini's 0.75)
        **_SMALL, "original_max_position_embeddings": 32, "partial_rotary_factor": 0.75,
        "rope_parameters": _LONGROPE, "sliding_window": 40}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {  # layers 1 and 3: no rotary, and a 16-token window
        **_SMALL, "num_hidden_layers": 4, "no_rope_layer_interval": 2, "use_sliding_window": True,
        "sliding_window": 16, "tie_word_embeddings": True}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {
        **_SMALL, "embedding_multiplier": 6.0, "attention_multiplier": 0.1,
        "residual_multiplier": 0.5, "logits_scaling": 4.0, "attention_bias": True}),
}
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
    # mixture-of-experts families (8 / 4 experts, top 2), GPT-OSS's sinks and alternating windows
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_key_value_heads": 2, "num_local_experts": 4,
                                                        "num_experts_per_tok": 2, "intermediate_size": 96,
                                                        "sliding_window": 16}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_key_value_heads": 2, "head_dim": 48, "num_experts": 8, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 64, "norm_topk_prob": True, "mlp_only_layers": [2],
                   "use_sliding_window": True, "sliding_window": 16}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2,
                                                  "intermediate_size": 64}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"num_key_value_heads": 2, "head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "intermediate_size": 64, "sliding_window": 16, "swiglu_limit": 3.0,
                 # GPT-OSS's own yarn (factor 32 from 4,096 positions, beta 32 / 1, truncate false)
                 "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False,
                                     "original_max_position_embeddings": 4096}}),
    **ROPE_FAMILIES,
    # families that change the decoder's structure
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"num_key_value_heads": 2, "head_dim": 48, "sliding_window": 16, "query_pre_attn_scalar": 40,
                "attn_logit_softcapping": 4.0, "final_logit_softcapping": 10.0, "tie_word_embeddings": True}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.25, "use_parallel_residual": True}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"num_key_value_heads": 2}),
}
# transformers classes that have no SDPA path (GPT-OSS: its sinks): compared on their eager attention
EAGER_ONLY = ("GptOssForCausalLM",)
SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
             max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def random_transformers_model(family: str, seed: int = 0, *, shape: dict | None = None):
    """A random small transformers model of `family` (a key of RANDOM_FAMILIES), in eval mode, with
    weights that make every tensor matter and keep greedy decoding from collapsing onto one token.
    shape: config fields that replace SHAPE's and the family's (a smaller model for a quick test)."""
    import torch
    import transformers

    cfg_name, model_name, extra = RANDOM_FAMILIES[family]
    fields = {**SHAPE, **extra, **(shape or {})}
    if cfg_name == "Gemma3Config":  # the image + text model: a tiny SigLIP tower beside the text model
        text = {**fields, **RANDOM_FAMILIES["gemma3_text"][2]}
        vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=28, patch_size=14)
        cfg = transformers.Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                        image_token_index=511, boi_token_index=509, eoi_token_index=510)
    else:
        cfg = getattr(transformers, cfg_name)(**fields)
    # eager where transformers has no SDPA path (EAGER_ONLY) or soft-caps the scores (Gemma 2: _supports_sdpa False)
    cfg._attn_implementation = "eager" if model_name in EAGER_ONLY or fields.get("attn_logit_softcapping") else "sdpa"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    gemma = cfg_name.startswith(("Gemma3", "Gemma2"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma multiplies by 1 + w, the others by w
                p.copy_((0.0 if gemma else 1.0) + torch.randn(p.shape, generator=g) * (0.3 if gemma else 0.1))
            elif cfg_name == "GPTNeoXConfig":  # parallel residual: N(0, 0.2) everywhere collapses onto one token
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed_in" in name else 0.05))
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
        # neither side stops at eos, so every row compares new_tokens tokens (a random model may emit eos early)
        row.update(_greedy(ours, hf, ids[0, :prompt_tokens].tolist(), new_tokens))
    return row


def random_families() -> list[dict]:
    return [random_family_vs_transformers(family) for family in RANDOM_FAMILIES]


def parse_models(models, *, what: str = "--models") -> tuple[str, ...]:
    """A comma-separated string (or a sequence) of names from ALL -> a tuple in ALL's order, no repeats.
    Raises ValueError naming `what` for an unknown or empty list."""
    names = [m.strip() for m in (models.split(",") if isinstance(models, str) else models)]
    names = [m for m in names if m]
    unknown = [m for m in names if m not in ALL]
    if unknown or not names:
        raise ValueError(f"{what}: {'unknown ' + repr(unknown[0]) if unknown else 'empty'}; expected a "
                         f"comma-separated list of {', '.join(ALL)}")
    return tuple(m for m in ALL if m in names)


def run(window: int = 1024, *, real: bool = True, families: bool = True, models=None,
        gguf_window: int = GGUF_WINDOW, gguf_windows: int | None = GGUF_WINDOWS, log=None) -> dict:
    """The real embedded models and the random small families, as one dict (JSON-ready).

    models: names from ALL (a comma-separated string or a sequence); None = every real model when `real`,
        and the families when `families`. Named explicitly, a model whose packages are missing raises
        ModelNotFoundError (a ValueError with the pip command); in the default list it becomes
        {"skipped": <why>}.
    window: smollm2's perplexity window (its whole held-out corpus is scored).
    gguf_window, gguf_windows: qwen2.5-coder-0.5b's and gemma3-270m's perplexity: the first gguf_windows
        windows of gguf_window tokens of the held-out corpus (None = all of it; slow on a CPU).
    Keys: "minilm", "smollm2", "qwen2.5-coder-0.5b", "gemma3-270m" (each a dict), "families" (a list).
    """
    from headcount.models import zoo

    for name, value, low in (("window", window, 2), ("gguf_window", gguf_window, 2), ("gguf_windows", gguf_windows, 1)):
        if value is None and name == "gguf_windows":
            continue
        positive_int(name, value, low, expected=f"an int >= {low}")
    explicit = models is not None
    if explicit:
        chosen = parse_models(models)
    else:
        chosen = (REAL_MODELS if real else ()) + ((FAMILIES,) if families else ())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from installed packages
    out: dict = {}
    for name in chosen:
        if name == FAMILIES:
            out[FAMILIES] = random_families()
            continue
        if not zoo.installed(name):
            if explicit:
                zoo.package_dir(zoo.ZOO[name])  # raises ModelNotFoundError with the pip command
            out[name] = {"skipped": f"not installed: {zoo.ZOO[name].pip_command}"}
            continue
        if name == "minilm":
            out[name] = minilm_vs_transformers()
        elif name == "smollm2":
            out[name] = smollm2_vs_transformers(window)
        else:
            out[name] = gguf_model_vs_transformers(name, window=gguf_window, max_windows=gguf_windows, log=log)
    return out


def _bound(value: float, bound: float) -> str:
    return f"{bound:.0e}".replace("e-0", "e-") + ("" if value <= bound else "  [red]missed[/]")


def _yes(flag: bool) -> str:
    return "yes" if flag else "[red]NO[/]"


def render(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    rows = [name for name in REAL_MODELS if name in result]
    if rows:
        table = Table(title="headcount vs transformers on the same weights")
        for col in ("check", "measured", "bound"):
            table.add_column(col, justify="left" if col == "check" else "right")
        for name in rows:
            r = result[name]
            if "skipped" in r:
                table.add_row(f"{name}: skipped", r["skipped"], "")
            elif name == "minilm":
                table.add_row("minilm last hidden state, padded batch, max |diff|", f"{r['max_abs_diff']:.1e}", "1e-4")
                table.add_row("  real tokens only", f"{r['max_abs_diff_real_tokens']:.1e}", "")
            elif name == "smollm2":
                table.add_row("smollm2 logits, max |diff| (real tokens)", f"{r['logits_max_abs_diff']:.1e}", "1e-3")
                table.add_row("  with packed weights (generate / perplexity path)",
                              f"{r['logits_max_abs_diff_packed']:.1e}", "1e-3")
                table.add_row(f"smollm2 perplexity, held-out, window {r['window']} ({r['scored_tokens']:,} tokens)",
                              f"{r['perplexity']:.4f} vs {r['perplexity_transformers']:.4f}", "")
                table.add_row("  relative difference", f"{r['perplexity_rel_diff']:.1e}", "1e-4")
            else:
                bound = TARGETS["logits_max_abs_diff"]
                table.add_row(f"{name} logits, {r['logits_tokens']} tokens, max |diff| (logits up to "
                              f"{r['logit_scale']:.1f})", f"{r['logits_max_abs_diff']:.1e}",
                              _bound(r["logits_max_abs_diff"], bound))
                table.add_row("  with packed weights", f"{r['logits_max_abs_diff_packed']:.1e}",
                              _bound(r["logits_max_abs_diff_packed"], bound))
                table.add_row(f"  perplexity, held-out, {r['windows']} windows of {r['window']} "
                              f"({r['scored_tokens']:,} tokens)",
                              f"{r['perplexity']:.4f} vs {r['perplexity_transformers']:.4f}", "")
                table.add_row("  relative difference", f"{r['perplexity_rel_diff']:.1e}",
                              _bound(r["perplexity_rel_diff"], TARGETS["perplexity_rel_diff"]))
                table.add_row(f"  {r['greedy_tokens']} greedy tokens after {r['prompt_tokens']} = generate()",
                              _yes(r["greedy_equal"]), "equal")
                long = r.get("long_prompt")
                if long:
                    window = ", ".join(str(w) for w in r["sliding_windows"]) or "none"
                    table.add_row(f"  {long['prompt_tokens']}-token prompt (sliding window {window}): every "
                                  f"position's logits, max |diff|", f"{long['logits_max_abs_diff']:.1e}",
                                  _bound(long["logits_max_abs_diff"], bound))
                    table.add_row(f"  {long['greedy_tokens']} greedy tokens after it = generate()",
                                  _yes(long["greedy_equal"]), "equal")
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


def main(argv=None) -> int:
    """benchmarks/exactness.py (and `python -m headcount.models.exactness`): the options of `run`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="headcount against transformers on the same weights")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated rows to run, from {','.join(ALL)} (default: all of them)")
    parser.add_argument("--families-only", action="store_true", help="only the random small families "
                        "(no model packages needed; the same as --models families)")
    parser.add_argument("--window", type=int, default=1024, help="smollm2 perplexity window (default 1024)")
    parser.add_argument("--gguf-window", type=int, default=GGUF_WINDOW,
                        help=f"qwen2.5-coder-0.5b / gemma3-270m perplexity window (default {GGUF_WINDOW})")
    parser.add_argument("--gguf-windows", type=int, default=GGUF_WINDOWS,
                        help=f"how many of those windows, from the start of the held-out corpus (default "
                             f"{GGUF_WINDOWS}; 0 = all of it, slow)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    try:
        if args.families_only and args.models is not None:
            raise ValueError("--families-only: give either it or --models, not both")
        models = FAMILIES if args.families_only else args.models
        if models is not None:
            parse_models(models)
        for flag, value, low in (("--window", args.window, 2), ("--gguf-window", args.gguf_window, 2),
                                 ("--gguf-windows", args.gguf_windows, 0)):
            if value < low:
                raise ValueError(f"{flag}: expected an int >= {low}, got {value}")
        result = run(args.window, models=models, gguf_window=args.gguf_window,
                     gguf_windows=args.gguf_windows or None, log=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as err:
        print(f"exactness: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        render(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
