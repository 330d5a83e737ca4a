"""transformers config.json -> headcount DecoderConfig / EncoderConfig.

Every field that changes the computation is read or refused by name; nothing is silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

from headcount.models.decoder import DecoderConfig
from headcount.models.encoder import EncoderConfig
from headcount.models.formats.errors import CheckpointError

SUPPORTED = ("bert", "gpt2", "llama", "qwen2")



# --------------------------------------------------------------------------------------- configs
def _rope_theta(cfg: dict, source: str) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for block in (params, scaling):
        kind = block.get("rope_type", block.get("type", "default"))
        if kind not in (None, "default"):
            raise CheckpointError(f"{source}: rotary scaling {kind!r} is not supported (only the default rotary)")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


def _get(cfg: dict, key: str, source: str):
    if key not in cfg:
        raise CheckpointError(f"{source}: config has no {key!r}")
    return cfg[key]


def decoder_config(cfg: dict, source: str = "config") -> DecoderConfig:
    """A transformers config dict (llama / qwen2 / gpt2) -> DecoderConfig."""
    kind = cfg.get("model_type")
    if kind in ("llama", "qwen2"):
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for {kind} (only 'silu')")
        if kind == "qwen2" and cfg.get("use_sliding_window"):
            raise CheckpointError(f"{source}: Qwen2 sliding-window attention is not supported")
        d_model, n_heads = _get(cfg, "hidden_size", source), _get(cfg, "num_attention_heads", source)
        attention_bias = bool(cfg.get("attention_bias", False))
        return DecoderConfig(
            vocab_size=_get(cfg, "vocab_size", source), d_model=d_model,
            n_layers=_get(cfg, "num_hidden_layers", source), n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=cfg.get("head_dim") or d_model // n_heads, d_ff=_get(cfg, "intermediate_size", source),
            max_position=cfg.get("max_position_embeddings", 2048), norm="rms",
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), mlp="gated_silu", position="rotary",
            rope_theta=_rope_theta(cfg, source),
            qkv_bias=True if kind == "qwen2" else attention_bias,
            o_bias=False if kind == "qwen2" else attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"), eos_token_id=_first(cfg.get("eos_token_id")),
            pad_token_id=cfg.get("pad_token_id"), family=kind)
    if kind == "gpt2":
        if cfg.get("scale_attn_by_inverse_layer_idx"):
            raise CheckpointError(f"{source}: scale_attn_by_inverse_layer_idx is not supported")
        if cfg.get("scale_attn_weights", True) is False:
            raise CheckpointError(f"{source}: scale_attn_weights=False is not supported")
        act = cfg.get("activation_function", "gelu_new")
        mlp = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}.get(act)
        if mlp is None:
            raise CheckpointError(f"{source}: activation_function {act!r} is not supported for gpt2")
        d_model = _get(cfg, "n_embd", source)
        return DecoderConfig(
            vocab_size=_get(cfg, "vocab_size", source), d_model=d_model, n_layers=_get(cfg, "n_layer", source),
            n_heads=_get(cfg, "n_head", source), d_ff=cfg.get("n_inner") or 4 * d_model,
            max_position=cfg.get("n_positions", 1024), norm="layer",
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), mlp=mlp, position="learned",
            qkv_bias=True, o_bias=True, mlp_bias=True, tie_embeddings=True,
            bos_token_id=cfg.get("bos_token_id"), eos_token_id=_first(cfg.get("eos_token_id")),
            pad_token_id=cfg.get("pad_token_id"), family="gpt2")
    raise CheckpointError(f"{source}: model_type {kind!r} is not a decoder headcount supports "
                          f"(supported: llama, qwen2, gpt2)")


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
