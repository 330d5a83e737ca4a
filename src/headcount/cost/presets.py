"""Model shapes from their papers and configs, by name.

GPT-3: Brown et al. 2020 (arXiv 2005.14165), Table 2.1, exactly as printed (d_ff = 4 d_model, vocab
50257, 2048 learned positions, tied embeddings, biases, LayerNorm). Transformer base/big: Vaswani et
al. 2017 (arXiv 1706.03762), Table 3 (shared 37000-token source/target vocabulary, sinusoidal
positions, post-norm). The rest: the models' config.json files.
"""

from __future__ import annotations

from dataclasses import dataclass

from headcount.cost.shape import CostError, ModelShape, global_every


@dataclass(frozen=True)
class Preset:
    key: str
    shape: ModelShape
    source: str
    paper_params: float | None = None  # the total the source prints (rounded), when it prints one
    note: str = ""


def _gpt3(key: str, name: str, params: float, n_layers: int, d_model: int, n_heads: int, head_dim: int,
          note: str = "") -> Preset:
    shape = ModelShape(d_model=d_model, n_heads=n_heads, head_dim=head_dim, n_layers=n_layers, d_ff=4 * d_model,
                       mlp="gelu", vocab_size=50257, tied_embeddings=True, position="learned", max_positions=2048,
                       attn_bias=True, norm="layernorm", final_norm=True, arch="decoder", name=name)
    return Preset(key, shape, "Brown et al. 2020, Table 2.1", params, note)


def _llama(key: str, name: str, *, d_model, n_heads, n_kv_heads, n_layers, d_ff, vocab, max_positions, tied=False,
           source: str, note: str = "", head_dim=None) -> Preset:
    shape = ModelShape(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, n_layers=n_layers,
                       d_ff=d_ff, mlp="gated", vocab_size=vocab, tied_embeddings=tied, position="rotary",
                       max_positions=max_positions, attn_bias=False, norm="rmsnorm", final_norm=True, arch="decoder",
                       name=name)
    return Preset(key, shape, source, None, note)


def _bert(key: str, name: str, *, d_model, n_heads, n_layers, d_ff, source: str, note: str = "") -> Preset:
    shape = ModelShape(d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_ff=d_ff, mlp="gelu", vocab_size=30522,
                       tied_embeddings=True, position="learned", max_positions=512, type_vocab_size=2,
                       attn_bias=True, norm="layernorm", embedding_norm=True, final_norm=False, pooler=True,
                       arch="encoder", name=name)
    return Preset(key, shape, source, None, note)


def _qwen2(key: str, name: str, *, d_model, n_heads, n_kv_heads, n_layers, d_ff, max_positions, source: str,
           note: str = "") -> Preset:
    shape = ModelShape(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_ff=d_ff,
                       mlp="gated", vocab_size=151936, tied_embeddings=True, position="rotary",
                       max_positions=max_positions, attn_bias=True, o_bias=False, mlp_bias=False, norm="rmsnorm",
                       final_norm=True, arch="decoder", name=name)
    return Preset(key, shape, source, None, note or "bias on Q, K and V only (not W_O, not the MLP); tied embeddings; "
                                                   "no sliding window (use_sliding_window is false)")


def _gemma3(key: str, name: str, *, d_model, n_heads, n_kv_heads, n_layers, d_ff, window, max_positions,
            source: str, head_dim=256, vocab=262144, note: str = "") -> Preset:
    shape = ModelShape(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, n_layers=n_layers,
                       d_ff=d_ff, mlp="gated", vocab_size=vocab, tied_embeddings=True, position="rotary",
                       max_positions=max_positions, attn_bias=False, norm="rmsnorm", final_norm=True,
                       qk_norm=True, post_norms=True, sliding_window=window,
                       layer_types=global_every(n_layers, 6), arch="decoder", name=name)
    return Preset(key, shape, source, None, note or (
        f"layer i is global when (i + 1) % 6 == 0 ({shape.global_layers} global, {shape.local_layers} local with a "
        f"{window}-token window); q/k RMSNorm (head_dim weights each); 4 RMSNorms per block (before and after the "
        "attention and the MLP); gated tanh-GELU MLP; tied embeddings, scaled by sqrt(d_model) (no parameters)"))


def _vaswani(key: str, name: str, params: float, *, d_model, n_heads, d_ff) -> Preset:
    shape = ModelShape(d_model=d_model, n_heads=n_heads, n_layers=6, d_ff=d_ff, mlp="gelu", vocab_size=37000,
                       tied_embeddings=True, position="sinusoidal", max_positions=0, attn_bias=True,
                       norm="layernorm", final_norm=False, arch="encoder-decoder", name=name)
    return Preset(key, shape, "Vaswani et al. 2017, Table 3", params,
                  "encoder-decoder, N = 6 blocks per stack; ReLU MLP (2 matrices, counted like gelu); one "
                  "embedding matrix shared by source, target and the pre-softmax layer (37000 BPE tokens, EN-DE)")


_PRESETS: tuple[Preset, ...] = (
    _gpt3("gpt3-small", "GPT-3 Small", 125e6, 12, 768, 12, 64),
    _gpt3("gpt3-medium", "GPT-3 Medium", 350e6, 24, 1024, 16, 64),
    _gpt3("gpt3-large", "GPT-3 Large", 760e6, 24, 1536, 16, 96),
    _gpt3("gpt3-xl", "GPT-3 XL", 1.3e9, 24, 2048, 24, 128,
          note="Table 2.1 prints 24 heads x 128 on d_model 2048: 24 x 128 = 3072 != 2048, kept as printed "
               "(a decoupled head_dim, W_O maps 3072 back to 2048). That shape has ~1.52B parameters, not the "
               "table's 1.3B; 16 heads x 128 (--heads 16 --head-dim 128) gives 1.32B"),
    _gpt3("gpt3-2.7b", "GPT-3 2.7B", 2.7e9, 32, 2560, 32, 80),
    _gpt3("gpt3-6.7b", "GPT-3 6.7B", 6.7e9, 32, 4096, 32, 128),
    _gpt3("gpt3-13b", "GPT-3 13B", 13e9, 40, 5140, 40, 128,
          note="Table 2.1 prints d_model 5140 with 40 heads x 128 = 5120: a decoupled head_dim, kept as printed"),
    _gpt3("gpt3-175b", "GPT-3 175B", 175e9, 96, 12288, 96, 128),
    _llama("llama-3-8b", "Llama 3 8B", d_model=4096, n_heads=32, n_kv_heads=8, n_layers=32, d_ff=14336, vocab=128256,
           max_positions=8192, source="meta-llama/Meta-Llama-3-8B config.json"),
    _llama("llama-3-70b", "Llama 3 70B", d_model=8192, n_heads=64, n_kv_heads=8, n_layers=80, d_ff=28672,
           vocab=128256, max_positions=8192, source="meta-llama/Meta-Llama-3-70B config.json"),
    _llama("llama-3-405b", "Llama 3.1 405B", d_model=16384, n_heads=128, n_kv_heads=8, n_layers=126, d_ff=53248,
           vocab=128256, max_positions=131072, source="meta-llama/Llama-3.1-405B config.json"),
    _llama("mistral-7b", "Mistral 7B", d_model=4096, n_heads=32, n_kv_heads=8, n_layers=32, d_ff=14336, vocab=32000,
           max_positions=32768, source="mistralai/Mistral-7B-v0.1 config.json",
           note="v0.1 limits attention to a 4096-token sliding window (a rolling KV cache of 4096 tokens); the KV "
                "numbers here assume full attention, as in v0.2 and later (--sliding-window 4096 counts v0.1's)"),
    _bert("bert-base", "BERT-base (uncased)", d_model=768, n_heads=12, n_layers=12, d_ff=3072,
          source="google-bert/bert-base-uncased config.json", note="total includes the pooler, not the MLM head"),
    _bert("all-minilm-l6-v2", "all-MiniLM-L6-v2", d_model=384, n_heads=12, n_layers=6, d_ff=1536,
          source="sentence-transformers/all-MiniLM-L6-v2 config.json", note="total includes the pooler"),
    _llama("smollm2-135m", "SmolLM2-135M", d_model=576, n_heads=9, n_kv_heads=3, n_layers=30, d_ff=1536, vocab=49152,
           max_positions=8192, tied=True, source="HuggingFaceTB/SmolLM2-135M config.json"),
    _gemma3("gemma-3-270m", "Gemma 3 270M", d_model=640, n_heads=4, n_kv_heads=1, n_layers=18, d_ff=2048, window=512,
            max_positions=32768, source="google/gemma-3-270m config.json (model_type gemma3_text)"),
    _qwen2("qwen2.5-0.5b", "Qwen2.5-0.5B", d_model=896, n_heads=14, n_kv_heads=2, n_layers=24, d_ff=4864,
           max_positions=32768, source="Qwen/Qwen2.5-0.5B config.json"),
    _qwen2("qwen2.5-1.5b", "Qwen2.5-1.5B", d_model=1536, n_heads=12, n_kv_heads=2, n_layers=28, d_ff=8960,
           max_positions=131072, source="Qwen/Qwen2.5-1.5B config.json"),
    _vaswani("transformer-base", "Transformer (base)", 65e6, d_model=512, n_heads=8, d_ff=2048),
    _vaswani("transformer-big", "Transformer (big)", 213e6, d_model=1024, n_heads=16, d_ff=4096),
)

PRESETS: dict[str, Preset] = {p.key: p for p in _PRESETS}
ALIASES: dict[str, str] = {
    "minilm": "all-minilm-l6-v2",
    "smollm2": "smollm2-135m",
    "llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b", "llama3-405b": "llama-3-405b",
    "llama-3.1-405b": "llama-3-405b",
    "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b",
    "bert": "bert-base", "bert-base-uncased": "bert-base",
    "transformer": "transformer-base",
    # the zoo's names (headcount.models.load) for the same shapes: the Coder models share the base shapes
    "gemma3-270m": "gemma-3-270m", "gemma-3-270m-it": "gemma-3-270m",
    "qwen2.5-coder-0.5b": "qwen2.5-0.5b", "qwen2.5-coder-1.5b": "qwen2.5-1.5b",
    "qwen2.5-0.5b-instruct": "qwen2.5-0.5b", "qwen2.5-1.5b-instruct": "qwen2.5-1.5b",
}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def get_preset(name: str) -> Preset:
    """The preset called `name` (case, '_' and ' ' do not matter; aliases accepted)."""
    key = _normalise(name)
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        if key.startswith("gpt-3-"):
            key = "gpt3-" + key[len("gpt-3-"):]
        if key not in PRESETS:
            raise CostError(f"unknown preset {name!r}; known: {', '.join(PRESETS)} (aliases: {', '.join(ALIASES)})")
    return PRESETS[key]


def preset_names() -> list[str]:
    return list(PRESETS)
