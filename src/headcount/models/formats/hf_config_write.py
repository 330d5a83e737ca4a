"""headcount config -> transformers config.json: the inverse of hf_config.py, for hf.py's writer.

Every family gets the fields all rotary decoders share (sizes, head counts, head_dim, rms_norm_eps, rope_theta,
tie_word_embeddings, token ids; rotary scaling as rope_scaling for linear, rope_parameters for the other rope
types and partial rotary; the activation under the entry's act_key), then the keys its families.py entry lists,
each written by one function of CONFIG_KEYS; mixture-of-experts families add hf_moe.config_fields and spell
rotary as transformers 5's rope_parameters. GPT-NeoX and BERT name their fields differently and have their own
writers (_gpt_neox, _bert). What transformers' class cannot hold is refused with ValueError, by the entry's
flags: a sliding window on some layers only where the class puts it on every layer, an embedding scale other
than sqrt(hidden_size) for Gemma, pruned query heads where the class sizes q_norm by hidden_size (OLMoE).

Every config.json carries `transformers_version`, as transformers' own save_pretrained writes it: without it,
transformers (4.57 and vLLM's with it) takes any local checkpoint for a possibly broken Mistral tokenizer and warns
"...incorrect regex pattern..." on every load.
"""

from __future__ import annotations

import math
from importlib import metadata

from headcount.models.formats import hf_moe
from headcount.models.formats.families import Family

_OMIT = object()  # a CONFIG_KEYS function's "leave this key out"
_ACT = {"gated_silu": "silu", "gated_gelu_tanh": "gelu_pytorch_tanh"}  # DecoderConfig.mlp -> transformers' name


def _qk_scalar(cfg) -> int | float:
    """Gemma's query_pre_attn_scalar back from softmax_scale = scalar ** -0.5 (a whole number when it was one)."""
    if cfg.softmax_scale is None:
        return cfg.head_dim
    scalar = cfg.softmax_scale ** -2
    return int(round(scalar)) if abs(scalar - round(scalar)) < 1e-6 * scalar else scalar


def _granite_scale(cfg) -> float:
    """Granite's attention_multiplier: its softmax scale (the config's, or head_dim ** -0.5 when unset)."""
    return cfg.softmax_scale if cfg.softmax_scale is not None else cfg.head_dim ** -0.5


def _window(cfg, fam: Family, types: list[str], bias: bool):
    window = cfg.sliding_window
    if window is None:
        return fam.window_default
    return window if cfg.causal else (window - 1) * 2  # bidirectional Gemma 3 reads it back as window // 2 + 1


def _original_max(cfg, fam: Family, types: list[str], bias: bool):
    """Phi3Config reads LongRoPE's original_max_position_embeddings at the top level first."""
    if cfg.rope_type != "longrope":
        return _OMIT
    return cfg.rope_parameters["original_max_position_embeddings"]


# config.json key -> its value for (DecoderConfig, family entry, layer types, attention biases written)
CONFIG_KEYS = {
    "attention_bias": lambda cfg, fam, types, bias: bias,
    "mlp_bias": lambda cfg, fam, types, bias: cfg.mlp_bias,
    "sliding_window": _window,
    "use_sliding_window": lambda cfg, fam, types, bias: cfg.sliding_window is not None,
    "max_window_layers": lambda cfg, fam, types, bias: (types.index("sliding_attention")
                                                        if cfg.sliding_window is not None else _OMIT),
    "layer_types": lambda cfg, fam, types, bias: types,
    "query_pre_attn_scalar": lambda cfg, fam, types, bias: _qk_scalar(cfg),
    "rope_local_base_freq": lambda cfg, fam, types, bias: (cfg.rope_local_theta if cfg.rope_local_theta is not None
                                                           else cfg.rope_theta),
    "use_bidirectional_attention": lambda cfg, fam, types, bias: not cfg.causal,
    "attn_logit_softcapping": lambda cfg, fam, types, bias: cfg.attn_softcap,
    "final_logit_softcapping": lambda cfg, fam, types, bias: cfg.final_softcap,
    "no_rope_layers": lambda cfg, fam, types, bias: [int(i not in cfg.nope_layers) for i in range(cfg.n_layers)],
    "embedding_multiplier": lambda cfg, fam, types, bias: cfg.embedding_multiplier,
    "residual_multiplier": lambda cfg, fam, types, bias: cfg.residual_multiplier,
    "logits_scaling": lambda cfg, fam, types, bias: cfg.logits_scaling,
    "attention_multiplier": lambda cfg, fam, types, bias: _granite_scale(cfg),
    "original_max_position_embeddings": _original_max,
}


def transformers_version() -> str | None:
    """The installed transformers' version (what its save_pretrained writes), read without importing it; None
    where transformers is not installed."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def with_version(hf: dict) -> dict:
    """`hf` with transformers_version set (see the module doc), unless transformers is not installed."""
    version = transformers_version()
    if version is not None:
        hf["transformers_version"] = version
    return hf


def transformers_config(cfg, fam: Family, classes: tuple[str, str], nh: int, nkv: int, bias: bool) -> dict:
    """config.json of the model with this config, written as family `fam` by transformers class `classes[1]`,
    with nh query and nkv KV heads per layer and the attention biases `bias` says."""
    if fam.encoder:
        return with_version(_bert(cfg, classes))
    if fam.qkv_layout == "per_head":
        return with_version(_gpt_neox(cfg, classes, bias))
    return with_version(_rotary(cfg, fam, classes, nh, nkv, bias))


def _rotary(cfg, fam: Family, classes: tuple[str, str], nh: int, nkv: int, bias: bool) -> dict:
    cfg_cls, model_cls = classes
    hd, d = cfg.head_dim, cfg.d_model
    types = [cfg.layer_type(i) for i in range(cfg.n_layers)]
    if fam.window_every_layer and cfg.sliding_window is not None and "full_attention" in types:
        raise ValueError(f"model: {model_cls} applies its sliding window to every layer; this model has full layers")
    if fam.embed_scale_sqrt and cfg.embed_scale != d ** 0.5:
        raise ValueError(f"model: embed_scale {cfg.embed_scale} is not sqrt(d_model); transformers' {cfg_cls} "
                         "cannot hold it")
    if fam.q_norm_by_hidden and nh * hd != d:
        raise ValueError(f"model: {nh} query heads x head_dim {hd} != hidden_size {d}; transformers' {model_cls} "
                         "sizes its q/k norms by hidden_size, so a pruned model of it cannot be written as one: keep "
                         "it in headcount's format (save)")
    if cfg.mlp not in _ACT:
        raise ValueError(f"model: mlp {cfg.mlp!r}; transformers' {model_cls} has {' or '.join(_ACT)}")
    hf = {
        "architectures": [model_cls], "model_type": fam.model_types[0],
        "vocab_size": cfg.vocab_size, "hidden_size": d, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_position, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id, "torch_dtype": "float32",
        fam.act_key: _ACT[cfg.mlp],
    }
    if cfg.rope_scaling != 1.0:  # the older spelling, which transformers 4.x and 5.x both read
        hf["rope_scaling"] = {"rope_type": "linear", "factor": cfg.rope_scaling}
    partial = cfg.rotary_dim is not None and cfg.rotary_dim != hd
    if cfg.rope_type != "default" or partial:
        hf["rope_parameters"] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta,
                                 **(cfg.rope_parameters or {})}
        if partial:  # transformers rotates int(head_dim * factor) dims: a factor that gives rotary_dim back
            factor = cfg.rotary_dim / hd
            factor = factor if int(hd * factor) == cfg.rotary_dim else math.nextafter(factor, 1.0)
            hf["rope_parameters"]["partial_rotary_factor"] = hf["partial_rotary_factor"] = factor
    for key in fam.keys:
        value = CONFIG_KEYS[key](cfg, fam, types, bias)
        if value is not _OMIT:
            hf[key] = value
    if cfg.moe is not None:
        hf.update(hf_moe.config_fields(cfg))
    if fam.moe:  # transformers 5 spelling (GptOssConfig would otherwise default to yarn)
        if "rope_parameters" not in hf:  # (a rope type beyond linear is written above)
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
            if cfg.rope_scaling != 1.0:
                hf["rope_parameters"].update(rope_type="linear", factor=cfg.rope_scaling)
        hf.pop("rope_scaling", None)
    return hf


def _gpt_neox(cfg, classes: tuple[str, str], bias: bool) -> dict:
    hd = cfg.head_dim
    rd = cfg.rotary_dim or hd
    pct = rd / hd if int(hd * (rd / hd)) == rd else (rd + 0.5) / hd  # transformers takes int(head_dim * pct)
    rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **(cfg.rope_parameters or {}),
            "partial_rotary_factor": pct}
    if cfg.rope_scaling != 1.0:
        rope.update(rope_type="linear", factor=cfg.rope_scaling)
    return {
        "architectures": [classes[1]], "model_type": "gpt_neox", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff, "hidden_act": "gelu" if cfg.mlp == "gelu" else "gelu_new",
        "max_position_embeddings": cfg.max_position, "layer_norm_eps": cfg.norm_eps,
        "use_parallel_residual": cfg.parallel_residual, "rope_parameters": rope, "rotary_pct": pct,
        "rotary_emb_base": cfg.rope_theta, "attention_bias": bias, "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "torch_dtype": "float32",
    }


def _bert(cfg, classes: tuple[str, str]) -> dict:
    return {
        "architectures": [classes[1]], "model_type": "bert", "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "hidden_act": "gelu" if cfg.act == "gelu" else "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.max_position, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "pad_token_id": cfg.pad_token_id, "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "torch_dtype": "float32",
    }
