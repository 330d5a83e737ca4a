"""transformers config.json -> headcount DecoderConfig / EncoderConfig.

Every field that changes the computation is read or refused by name; nothing is silently ignored.
Each model_type's entry in families.py says which reader below builds its config, its attention and MLP bias
rules (one attention_bias switch and its default; Qwen2's q/k/v biases; none for Mistral, Mixtral, Phi-3;
always for GPT-2 and BERT; mlp_bias for Llama, SmolLM3, Granite), tie_word_embeddings' default, and which of
the refused fields (the last item) it implements: hf_config_write.py writes config.json by the same entry.

- bert (encoder_config): absolute positions, gelu / gelu_new. gpt2: Conv1D, learned positions, tied embeddings;
  scale_attn_by_inverse_layer_idx and scale_attn_weights=False refused.

- llama / mistral / qwen2 / qwen3 / smollm3 / granite / phi3: rotary from rope_parameters (or the older
  rope_scaling, which transformers prefers when both are there) + rope_theta, of rope type default, linear,
  llama3, yarn, dynamic or longrope (phi3: default or longrope; its "su" / "yarn" mean longrope, as
  Phi3Config reads them); each type's fields are read or refused by name (rotary.ROPE_FIELDS), a missing
  one named. original_max_position_embeddings: a top-level field wins (Phi3Config: default 4096), else the
  block's, else max_position_embeddings. partial_rotary_factor only for phi3 (transformers' Llama-style
  rotary ignores it for the default type and breaks for the others).
- phi3: fused qkv_proj [q; k; v] and gate_up_proj [gate; up] (headcount's own layouts), sliding_window on
  every layer when set (null by default). smollm3: no_rope_layers (1 = rotary, 0 = none; default: every
  no_rope_layer_interval-th layer has none), sliding windows on the layers layer_types marks. granite:
  embedding_multiplier, attention_multiplier (the softmax scale, default 1.0), residual_multiplier,
  logits_scaling.
  mistral: `sliding_window` on every layer (null = full attention; a missing field is transformers'
  default 4096; `layer_types` is ignored, as MistralModel ignores it). qwen2 / qwen3: sliding windows are
  implemented: with use_sliding_window, on the layers `layer_types` marks (else layers >= max_window_layers).
- gemma3_text: transformers' Gemma3TextConfig defaults fill what a file leaves out; layer_types (or
  sliding_window_pattern, default 6); rope per layer type (rope_parameters.{full,sliding}_attention, or
  rope_theta / rope_local_base_freq / rope_scaling, the last on global layers only); softmax scale
  query_pre_attn_scalar ** -0.5; embeddings x hidden_size ** 0.5. use_bidirectional_attention gives
  causal=False with the window transformers uses, |p - j| < sliding_window // 2 + 1.
- gemma3 (image + text): its text_config (tie_word_embeddings and token ids from the outer config).
- mixtral / qwen3_moe / olmoe / gpt_oss: llama-like attention (qwen3_moe: per-head q/k norms;
  olmoe: q/k norms over the whole projection; gpt_oss: biases, per-head sinks, alternating windows) and
  the routed feed-forward of moe.py (expert counts, top-k, each router's normalisation; Qwen3-MoE's
  mlp_only_layers / decoder_sparse_step give dense layers; OLMoE's clip_qkv is refused).
- gemma2: Gemma2Config's defaults fill what a file leaves out; attn_logit_softcapping and
  final_logit_softcapping; layer_types (default: sliding on even layers, full on odd); one rotary base;
  query_pre_attn_scalar; sandwich norms; embeddings x hidden_size ** 0.5. use_bidirectional_attention refused.
- gpt_neox (Pythia): head_dim = hidden_size / num_attention_heads; partial rotary (rotary_pct, or
  rope_parameters.partial_rotary_factor; rotary_emb_base); use_parallel_residual; LayerNorm with bias;
  GELU MLP with biases; attention_bias.
- olmo2: q/k RMSNorm over the whole projection (qk_norm_full), norms only after each sub-layer.
- Refused wherever set (outside the families above that implement them): final_logit_softcapping,
  attn_logit_softcapping, partial_rotary_factor, attention_chunk_size, no_rope_layers, and the Granite-style
  multipliers.
"""

from __future__ import annotations

import json
from pathlib import Path

from headcount.arguments import fraction, positive_float, positive_int, positive_ints
from headcount.models.decoder import DecoderConfig
from headcount.models.moe import MoEConfig
from headcount.models.encoder import EncoderConfig
from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.families import BY_MODEL_TYPE, MOE_FAMILIES, SUPPORTED  # noqa: F401 (re-exported)
from headcount.models.rotary import check_rope


# transformers' Gemma3TextConfig defaults: config.json files written by older versions (and the
# text_config of a gemma3 multimodal config) leave out whatever equals them.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1,
    "bos_token_id": 2, "tie_word_embeddings": True, "attention_bias": False, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}
GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}

# Fields that change the computation in some transformers model, refused by name wherever they are set
# (their "off" value in the middle): headcount never drops one silently.
_REFUSED = {"final_logit_softcapping": None, "attn_logit_softcapping": None, "partial_rotary_factor": 1.0,
            "attention_chunk_size": None, "no_rope_layers": None, "logits_scaling": 1.0,
            "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": None}


# --------------------------------------------------------------------------------------- configs
_ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "partial_rotary_factor"}


def _rope_block(block: dict, theta: float, source: str, where: str) -> tuple[float, float]:
    """(base, linear factor) from one rope_parameters / rope_scaling block; refuses what is not implemented."""
    if not isinstance(block, dict):
        raise CheckpointError(f"{source}: {where} is {block!r}, expected a dict")
    kind = block.get("rope_type", block.get("type", "default")) or "default"
    if kind not in ("default", "linear"):
        raise CheckpointError(f"{source}: {where}: rotary scaling {kind!r} is not supported "
                              f"(headcount implements the default rotary and 'linear')")
    extra = sorted(set(block) - _ROPE_KEYS)
    if extra:
        raise CheckpointError(f"{source}: {where}: field(s) {', '.join(extra)} are not supported")
    if block.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{source}: {where}: partial_rotary_factor={block['partial_rotary_factor']} is not "
                              f"supported (rotary on the whole head)")
    factor = 1.0
    if kind == "linear":
        factor = positive_float(f"{source}: {where}.factor", block.get("factor"),
                                expected="a positive factor for linear rotary scaling", error=CheckpointError)
    return float(block.get("rope_theta", theta)), float(factor)


def _rope_fields(cfg: dict, kind: str, head_dim: int, source: str) -> dict:
    """The DecoderConfig rotary fields (rope_theta, rope_scaling, rope_type, rope_parameters,
    rotary_dim) of a one-rotary family, standardised as transformers' RotaryEmbeddingConfigMixin
    does; a missing or unknown field of the rope type raises CheckpointError naming it."""
    where = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    block = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(block, dict):
        raise CheckpointError(f"{source}: {where} is {block!r}, expected a dict")
    block = dict(block)
    theta = float(block.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    partial = block.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    partial = 1.0 if partial is None else partial
    if partial != 1.0 and "partial_rotary_factor" not in BY_MODEL_TYPE[kind].reads:
        raise CheckpointError(f"{source}: {where}.partial_rotary_factor={partial!r} is not supported for {kind} "
                              "(transformers rotates the whole head there)")
    fraction(f"{source}: partial_rotary_factor", partial, include_high=True, error=CheckpointError)
    kind_of_rope = block.get("rope_type", block.get("type", "default")) or "default"
    if kind == "phi3":
        kind_of_rope = "longrope" if kind_of_rope in ("su", "yarn") else kind_of_rope  # as Phi3Config reads it
        if kind_of_rope not in ("default", "longrope"):
            raise CheckpointError(f"{source}: {where}.rope_type: {kind_of_rope!r} is not one Phi3 has "
                                  "(default, longrope)")
    if kind_of_rope in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in cfg or kind == "phi3":  # a top-level value wins (Phi3Config)
            block["original_max_position_embeddings"] = cfg.get("original_max_position_embeddings", 4096)
        else:
            block.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048))
    params = {k: v for k, v in block.items() if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor")}
    rotary_dim = int(head_dim * partial)
    try:
        check_rope(kind_of_rope, params, rotary_dim, block=where)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    fields = dict(rope_theta=theta, rotary_dim=rotary_dim if partial != 1.0 else None)
    if kind_of_rope == "linear":  # the older spelling of linear scaling: DecoderConfig.rope_scaling
        return {**fields, "rope_scaling": float(params["factor"])}
    if kind_of_rope == "default":
        return fields
    return {**fields, "rope_type": kind_of_rope, "rope_parameters": params}


def _nope_layers(cfg: dict, n_layers: int, source: str) -> tuple[int, ...]:
    """SmolLM3's layers without rotary: no_rope_layers[i] == 0 (1 = rotary), or by default every
    no_rope_layer_interval-th layer (as SmolLM3Config builds the list)."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = positive_int(f"{source}: no_rope_layer_interval", cfg.get("no_rope_layer_interval", 4),
                                error=CheckpointError)
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if not isinstance(flags, (list, tuple)) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
        raise CheckpointError(f"{source}: no_rope_layers: expected {n_layers} entries of 0 / 1 (num_hidden_layers), "
                              f"got {flags!r}")
    return tuple(i for i, f in enumerate(flags) if not f)


def _smollm3_layers(cfg: dict, n_layers: int, nope: tuple[int, ...],
                    source: str) -> tuple[int | None, tuple[str, ...] | None]:
    """SmolLM3's sliding windows: layer_types (default: the NoPE layers, when use_sliding_window and
    sliding_window are set), each sliding layer with config.sliding_window."""
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if types is None:
        on = cfg.get("use_sliding_window") and window is not None
        types = ["sliding_attention" if on and i in nope else "full_attention" for i in range(n_layers)]
    types = _layer_types(types, n_layers, source)
    if "sliding_attention" not in types:
        return None, None
    if window is None:
        raise CheckpointError(f"{source}: layer_types has sliding_attention layers but sliding_window is null")
    return int(window), types


def _get(cfg: dict, key: str, source: str):
    if key not in cfg:
        raise CheckpointError(f"{source}: config has no {key!r}")
    return cfg[key]


def _refuse_unsupported(cfg: dict, source: str) -> None:
    fam = BY_MODEL_TYPE.get(cfg.get("model_type"))
    reads = fam.reads if fam is not None else ()
    for key, off in _REFUSED.items():
        if key not in reads and cfg.get(key, off) != off:
            raise CheckpointError(f"{source}: {key}={cfg[key]!r} is not supported (headcount does not implement it "
                                  f"and will not ignore it)")


def _common(cfg: dict, source: str) -> dict:
    """The DecoderConfig fields every rotary family reads the same way (tie_word_embeddings' default and the
    attention biases from the family's entry)."""
    fam = BY_MODEL_TYPE[cfg["model_type"]]
    qkv_bias, o_bias = fam.read_biases(cfg)
    d_model, n_heads = _get(cfg, "hidden_size", source), _get(cfg, "num_attention_heads", source)
    return dict(
        vocab_size=_get(cfg, "vocab_size", source), d_model=d_model, n_layers=_get(cfg, "num_hidden_layers", source),
        n_heads=n_heads, n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or d_model // n_heads, d_ff=_get(cfg, "intermediate_size", source),
        max_position=cfg.get("max_position_embeddings", 2048), norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        position="rotary", tie_embeddings=bool(cfg.get("tie_word_embeddings", fam.tie_default)),
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=fam.read_mlp_bias(cfg),
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=_first(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"))


def _qwen_layers(cfg: dict, n_layers: int, source: str) -> tuple[int | None, tuple[str, ...] | None]:
    """Qwen2 / Qwen3 sliding windows: on when use_sliding_window, on the layers config.layer_types marks
    (or, without it, layers >= max_window_layers), as transformers builds them."""
    if not cfg.get("use_sliding_window"):
        return None, None
    window = cfg.get("sliding_window")
    if window is None:
        return None, None
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    return int(window), _layer_types(types, n_layers, source)


def _layer_types(types, n_layers: int, source: str) -> tuple[str, ...]:
    if not isinstance(types, (list, tuple)) or len(types) != n_layers:
        raise CheckpointError(f"{source}: layer_types has {len(types) if isinstance(types, (list, tuple)) else types!r}"
                              f" entries for num_hidden_layers={n_layers}")
    bad = sorted({str(t) for t in types} - {"full_attention", "sliding_attention"})
    if bad:
        raise CheckpointError(f"{source}: layer_types: unsupported layer type(s) {', '.join(bad)} "
                              "(supported: full_attention, sliding_attention)")
    return tuple(types)


def _llama_like(cfg: dict, kind: str, source: str) -> DecoderConfig:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for {kind} (only 'silu')")
    if cfg.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: use_bidirectional_attention is not supported for {kind}")
    fields = _common(cfg, source)
    rope = _rope_fields(cfg, kind, fields["head_dim"], source)
    window, types, extra = None, None, {}
    if kind in ("qwen2", "qwen3"):
        window, types = _qwen_layers(cfg, fields["n_layers"], source)
    elif kind in ("mistral", "phi3"):
        # MistralModel / Phi3Model put every layer in the window (Mistral ignores layer_types, as transformers
        # warns); a missing field is Mistral's default 4096, Phi3's None
        window = cfg.get("sliding_window", 4096 if kind == "mistral" else None)
        window = int(window) if window is not None else None
    elif kind == "smollm3":
        extra["nope_layers"] = _nope_layers(cfg, fields["n_layers"], source)
        window, types = _smollm3_layers(cfg, fields["n_layers"], extra["nope_layers"], source)
    elif kind == "granite":
        extra = dict(softmax_scale=float(cfg.get("attention_multiplier", 1.0)),
                     embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
                     residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
                     logits_scaling=float(cfg.get("logits_scaling", 1.0)))
    return DecoderConfig(
        **fields, **rope, **extra, norm="rms", mlp="gated_silu",
        qk_norm=kind == "qwen3", sliding_window=window, layer_types=types, family=kind)


def _count(cfg: dict, keys: tuple[str, ...], source: str, *, low: int = 1) -> int:
    """The first of `keys` present (a field and its transformers alias), an int >= low."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        raise CheckpointError(f"{source}: config has no {keys[0]!r}")
    return positive_int(f"{source}: {key}", cfg[key], low, expected=f"an int >= {low}", error=CheckpointError)


def _moe(cfg: dict, kind: str, source: str) -> DecoderConfig:
    """mixtral / qwen3_moe / olmoe / gpt_oss: their attention switches and the MoEConfig (moe.py)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for {kind} (only 'silu')")
    if cfg.get("clip_qkv") is not None:
        raise CheckpointError(f"{source}: clip_qkv={cfg['clip_qkv']!r} is not supported (headcount does not clamp "
                              "q/k/v and will not ignore it)")
    fields = _common(cfg, source)
    n_layers = fields["n_layers"]
    rope = _rope_fields(cfg, kind, fields["head_dim"], source)
    n_experts = _count(cfg, ("num_experts", "num_local_experts") if kind in ("qwen3_moe", "olmoe")
                       else ("num_local_experts", "num_experts"), source, low=0 if kind == "qwen3_moe" else 1)
    top_k = _count(cfg, ("num_experts_per_tok",), source)
    if n_experts and top_k > n_experts:
        raise CheckpointError(f"{source}: num_experts_per_tok={top_k} is more than the {n_experts} experts")
    extra: dict = {}
    window, types = None, None
    moe: dict = {"n_experts": n_experts, "top_k": top_k, "d_expert": fields["d_ff"]}
    if kind == "mixtral":
        window = cfg.get("sliding_window")
    elif kind == "qwen3_moe":
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        moe["d_expert"] = _count(cfg, ("moe_intermediate_size",), source)
        moe["normalize"] = bool(cfg.get("norm_topk_prob", False))
        step = _count(cfg, ("decoder_sparse_step",), source) if "decoder_sparse_step" in cfg else 1
        only = cfg.get("mlp_only_layers") or []
        if only:  # an empty list (no dense layer) is transformers' default
            positive_ints(f"{source}: mlp_only_layers", only, 0, expected="a list of layer indices",
                          error=CheckpointError)
        moe["dense_layers"] = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
        extra = {"qk_norm": True}
    elif kind == "olmoe":
        moe["normalize"] = bool(cfg.get("norm_topk_prob", False))
        extra = _full_width_qk_norm(source)
    else:  # gpt_oss
        window = cfg.get("sliding_window", 128)
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                           for i in range(n_layers)]
        types = _layer_types(types, n_layers, source)
        moe.update(router="topk_softmax", act="swiglu_clamped", expert_bias=True, router_bias=True,
                   swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)), swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
        extra = {"attn_sinks": True, "norm": "rms_float"}
        if window is None or "sliding_attention" not in types:
            window, types = None, None
    positive_int(f"{source}: sliding_window", window, none=True, expected="a positive int or null",
                 error=CheckpointError)
    moe_cfg = MoEConfig(**moe) if n_experts else None
    return DecoderConfig(**{**fields, "norm": "rms", "mlp": "gated_silu", **rope,
                            "sliding_window": window, "layer_types": types, "moe": moe_cfg, "family": kind, **extra})


def _full_width_qk_norm(source: str) -> dict:
    """OLMoE's q/k RMSNorm runs over the whole projection (all heads at once), not per head: OLMo 2's
    norms.FullRMSNorm (qk_norm_full), Llama's rounding order (the weight after the cast)."""
    return {"qk_norm": True, "qk_norm_full": True}


def gemma3_text_config(cfg: dict) -> dict:
    """A gemma3_text config (or a gemma3 config's text_config) with transformers' defaults filled in."""
    return {**GEMMA3_TEXT_DEFAULTS, **cfg}


def _gemma3(cfg: dict, kind: str, source: str) -> DecoderConfig:
    cfg = gemma3_text_config(cfg)
    act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported for gemma3 "
                              f"(only gelu_pytorch_tanh)")
    fields = _common(cfg, source)
    n_layers = fields["n_layers"]
    types = cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    types = _layer_types(types, n_layers, source)
    # rotary: rope_parameters per layer type (transformers 5), or rope_theta / rope_local_base_freq /
    # rope_scaling (the global layers') in older files
    params = cfg.get("rope_parameters") or {}
    if params and not set(params) <= set(GEMMA3_THETA):
        raise CheckpointError(f"{source}: rope_parameters: expected entries per layer type "
                              f"(full_attention, sliding_attention), got {sorted(params)}")
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
    full.setdefault("rope_theta", cfg.get("rope_theta", GEMMA3_THETA["full_attention"]))
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq", GEMMA3_THETA["sliding_attention"]))
    if cfg.get("rope_scaling"):
        full.update(cfg["rope_scaling"])
    theta, factor = _rope_block(full, GEMMA3_THETA["full_attention"], source, "rope_parameters.full_attention")
    local_theta, local_factor = _rope_block(local, GEMMA3_THETA["sliding_attention"], source,
                                            "rope_parameters.sliding_attention")
    if local_factor != 1.0:
        raise CheckpointError(f"{source}: rope_parameters.sliding_attention: linear scaling on the sliding-window "
                              "layers is not supported")
    window = cfg.get("sliding_window")
    causal = not cfg.get("use_bidirectional_attention")
    if "sliding_attention" in types:
        if window is None:
            raise CheckpointError(f"{source}: layer_types has sliding_attention layers but sliding_window is null")
        # transformers' bidirectional Gemma 3 uses |p - j| < sliding_window // 2 + 1 (Gemma3TextConfig)
        window = int(window) if causal else int(window) // 2 + 1
    else:
        window, types = None, None
    return DecoderConfig(
        **fields, norm="rms_float", mlp="gated_gelu_tanh", rope_theta=theta, rope_scaling=factor,
        rope_local_theta=local_theta, qk_norm=True,
        softmax_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5, sliding_window=window, layer_types=types,
        embed_scale=cfg["hidden_size"] ** 0.5, post_norms=True, causal=causal, family="gemma3")


# transformers' Gemma2Config defaults (what older config.json files leave out)
GEMMA2_DEFAULTS = {
    "vocab_size": 256_000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    "tie_word_embeddings": True, "attention_bias": False, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
}


def _positive_or_none(cfg: dict, key: str, source: str) -> float | None:
    return positive_float(f"{source}: {key}", cfg.get(key), none=True, expected="a positive number or null",
                          error=CheckpointError)


def _gemma2(cfg: dict, kind: str, source: str) -> DecoderConfig:
    cfg = {**GEMMA2_DEFAULTS, **cfg}
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported for gemma2 (only gelu_pytorch_tanh)")
    if cfg.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: use_bidirectional_attention is not supported for gemma2")
    fields = _common(cfg, source)
    n_layers = fields["n_layers"]
    types = cfg.get("layer_types")
    if types is None:  # Gemma2Config: sliding on layers 0, 2, 4, ..., full on 1, 3, 5, ...
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    types = _layer_types(types, n_layers, source)
    window = cfg.get("sliding_window")
    if "sliding_attention" in types:
        if window is None:
            raise CheckpointError(f"{source}: layer_types has sliding_attention layers but sliding_window is null")
        window = int(window)
    else:
        window, types = None, None
    rope = _rope_fields(cfg, "gemma2", fields["head_dim"], source)
    return DecoderConfig(
        **fields, **rope, norm="rms_float", mlp="gated_gelu_tanh", softmax_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5, sliding_window=window,
        layer_types=types, embed_scale=cfg["hidden_size"] ** 0.5, post_norms=True,
        attn_softcap=_positive_or_none(cfg, "attn_logit_softcapping", source),
        final_softcap=_positive_or_none(cfg, "final_logit_softcapping", source), family="gemma2")


def _gpt_neox(cfg: dict, kind: str, source: str) -> DecoderConfig:
    d_model, n_heads = _get(cfg, "hidden_size", source), _get(cfg, "num_attention_heads", source)
    if d_model % n_heads:
        raise CheckpointError(f"{source}: hidden_size={d_model} is not a multiple of num_attention_heads={n_heads} "
                              "(GPT-NeoX's head size is their quotient)")
    head_dim = d_model // n_heads
    # rope_parameters (transformers 5) or rope_scaling, the older rotary_pct / rotary_emb_base filling what they
    # leave out (GPTNeoXConfig.convert_rope_params_to_dict)
    block = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(block, dict):
        raise CheckpointError(f"{source}: rope_parameters is {block!r}, expected a dict")
    block = dict(block)
    pct = block.setdefault("partial_rotary_factor", cfg.get("rotary_pct", 0.25))
    block.setdefault("rope_theta", cfg.get("rotary_emb_base", cfg.get("rope_theta", 10000.0)))
    fraction(f"{source}: rotary_pct / partial_rotary_factor", pct, include_high=True,
             expected="a fraction in (0, 1]", error=CheckpointError)
    rope = _rope_fields({"rope_parameters": block, "max_position_embeddings": cfg.get("max_position_embeddings", 2048)},
                        "gpt_neox", head_dim, source)
    rotary_dim = int(head_dim * pct)
    if rotary_dim < 2 or rotary_dim % 2:
        raise CheckpointError(f"{source}: rotary_pct={pct} of head_dim={head_dim} gives {rotary_dim} rotary dims; "
                              "headcount needs an even number >= 2")
    act = cfg.get("hidden_act", "gelu")
    mlp = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}.get(act)
    if mlp is None:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for gpt_neox (gelu, gelu_new)")
    qkv_bias, o_bias = BY_MODEL_TYPE[kind].read_biases(cfg)
    return DecoderConfig(
        vocab_size=_get(cfg, "vocab_size", source), d_model=d_model, n_layers=_get(cfg, "num_hidden_layers", source),
        n_heads=n_heads, head_dim=head_dim, d_ff=_get(cfg, "intermediate_size", source),
        max_position=cfg.get("max_position_embeddings", 2048), norm="layer",
        norm_eps=float(cfg.get("layer_norm_eps", 1e-5)), mlp=mlp, position="rotary", **rope, qkv_bias=qkv_bias,
        o_bias=o_bias, mlp_bias=BY_MODEL_TYPE[kind].read_mlp_bias(cfg), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        parallel_residual=bool(cfg.get("use_parallel_residual", True)), bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=_first(cfg.get("eos_token_id")), pad_token_id=cfg.get("pad_token_id"), family="gpt_neox")


def _olmo2(cfg: dict, kind: str, source: str) -> DecoderConfig:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for olmo2 (only 'silu')")
    fields = _common(cfg, source)
    fields["norm_eps"] = float(cfg.get("rms_norm_eps", 1e-5))
    rope = _rope_fields(cfg, "olmo2", fields["head_dim"], source)
    return DecoderConfig(
        **fields, **rope, norm="rms_float", mlp="gated_silu", qk_norm=True, qk_norm_full=True, pre_norms=False, post_norms=True, family="olmo2")


def text_config(cfg: dict, source: str) -> dict:
    """The language model's config: a gemma3 multimodal config's text_config (with its token ids and
    tie_word_embeddings from the outer config where the text part has none), else cfg itself."""
    if cfg.get("model_type") != "gemma3":
        return cfg
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{source}: model_type 'gemma3' without a text_config")
    text = dict(text)
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise CheckpointError(f"{source}: text_config.model_type {text['model_type']!r}, expected 'gemma3_text'")
    text["model_type"] = "gemma3_text"
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        if key in cfg and key not in text:
            text[key] = cfg[key]
    if "tie_word_embeddings" in cfg:  # Gemma3ForConditionalGeneration ties by the outer config's switch
        text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return text


def _gpt2(cfg: dict, kind: str, source: str) -> DecoderConfig:
    if cfg.get("scale_attn_by_inverse_layer_idx"):
        raise CheckpointError(f"{source}: scale_attn_by_inverse_layer_idx is not supported")
    if cfg.get("scale_attn_weights", True) is False:
        raise CheckpointError(f"{source}: scale_attn_weights=False is not supported")
    act = cfg.get("activation_function", "gelu_new")
    mlp = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}.get(act)
    if mlp is None:
        raise CheckpointError(f"{source}: activation_function {act!r} is not supported for gpt2")
    d_model = _get(cfg, "n_embd", source)
    fam = BY_MODEL_TYPE[kind]
    qkv_bias, o_bias = fam.read_biases(cfg)
    return DecoderConfig(
        vocab_size=_get(cfg, "vocab_size", source), d_model=d_model, n_layers=_get(cfg, "n_layer", source),
        n_heads=_get(cfg, "n_head", source), d_ff=cfg.get("n_inner") or 4 * d_model,
        max_position=cfg.get("n_positions", 1024), norm="layer",
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), mlp=mlp, position="learned",
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=fam.read_mlp_bias(cfg), tie_embeddings=True,
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=_first(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"), family="gpt2")


# families.py's Family.reader -> the function that reads that family's config.json
_READERS = {"llama": _llama_like, "moe": _moe, "gemma3": _gemma3, "gemma2": _gemma2, "gpt_neox": _gpt_neox,
            "olmo2": _olmo2, "gpt2": _gpt2}


def decoder_config(cfg: dict, source: str = "config") -> DecoderConfig:
    """A transformers config dict of any decoder model_type in SUPPORTED -> DecoderConfig, by its family's
    config reader (families.py's Family.reader). For gemma3 (multimodal) the text_config is read;
    bidirectional gemma3 gives causal=False."""
    cfg = text_config(cfg, source)
    kind = cfg.get("model_type")
    _refuse_unsupported(cfg, source)
    fam = BY_MODEL_TYPE.get(kind)
    if fam is not None and not fam.encoder:
        return _READERS[fam.reader](cfg, kind, source)
    raise CheckpointError(f"{source}: model_type {kind!r} is not a decoder headcount supports "
                          f"(supported: {', '.join(k for k in SUPPORTED if k != 'bert')})")


def encoder_config(cfg: dict, source: str = "config") -> EncoderConfig:
    if cfg.get("model_type") != "bert":
        raise CheckpointError(f"{source}: model_type {cfg.get('model_type')!r} is not an encoder headcount supports "
                              f"(supported: bert)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{source}: position_embedding_type {cfg['position_embedding_type']!r} is not "
                              f"supported (only 'absolute')")
    act = cfg.get("hidden_act", "gelu")
    acts = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
    if act not in acts:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for bert")
    return EncoderConfig(
        vocab_size=_get(cfg, "vocab_size", source), d_model=_get(cfg, "hidden_size", source),
        n_layers=_get(cfg, "num_hidden_layers", source), n_heads=_get(cfg, "num_attention_heads", source),
        d_ff=_get(cfg, "intermediate_size", source), max_position=cfg.get("max_position_embeddings", 512),
        type_vocab_size=cfg.get("type_vocab_size", 2), norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        act=acts[act], pad_token_id=cfg.get("pad_token_id") or 0)


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) and value else value


def model_type(cfg: dict, source: str) -> str:
    kind = cfg.get("model_type")
    if kind not in SUPPORTED:
        arch = cfg.get("architectures")
        raise CheckpointError(f"{source}: unsupported architecture model_type={kind!r}"
                              f"{f' ({arch[0]})' if arch else ''}; supported: {', '.join(SUPPORTED)}")
    return kind


def read_config(directory: str | Path) -> dict:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a transformers checkpoint directory has a config.json)")
    try:
        cfg = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return cfg
