"""transformers checkpoints -> headcount models.

Supported: BertModel (and Bert* heads: only the encoder is kept), GPT2Model / GPT2LMHeadModel,
LlamaForCausalLM (SmolLM2, Llama 2/3 with default rotary), Qwen2ForCausalLM (q/k/v biases, no o bias).

The separate q_proj / k_proj / v_proj weights become one fused `qkv_proj` by concatenation along
the output dimension, in that order: headcount's rows are [all Q heads | all K heads | all V heads],
each head head_dim contiguous rows, which is exactly how transformers lays out each projection.
GPT-2's Conv1D stores weights as [in, out]: they are transposed (its c_attn is already [Q | K | V]).
Llama's gate_proj / up_proj become one `gate_up_proj` (rows [gate | up]).

Three entry points, one path:
  from_transformers(hf_model)            a live transformers model (config + state_dict)
  load_checkpoint(directory)             config.json + model.safetensors (or shards, or a
                                         pytorch_model.bin read with weights_only=True)
  from_state_dict(config, tensors, ...)  a config dict and a name -> tensor mapping

Every error names the file and, where one is at fault, the tensor. Nothing is ever unpickled.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from pathlib import Path
from typing import Callable, Mapping

import torch

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.encoder import Encoder, EncoderConfig

Tensor = torch.Tensor

SUPPORTED = ("bert", "gpt2", "llama", "qwen2")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: the message names the file and the tensor."""


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


# --------------------------------------------------------------------------------------- tensors
class _Tensors:
    """Name -> tensor lookup with prefix stripping and errors that name the file and the tensor."""

    def __init__(self, tensors: Mapping[str, Tensor], source: str, prefixes: tuple[str, ...]):
        self.tensors, self.source, self.used = tensors, source, set()
        self.prefix = ""
        for p in prefixes:  # the first prefix under which the checkpoint's tensors are found
            if any(k.startswith(p) for k in tensors):
                self.prefix = p
                break

    def has(self, name: str) -> bool:
        return (self.prefix + name) in self.tensors or name in self.tensors

    def get(self, name: str, shape: tuple[int, ...], why: str = "") -> Tensor:
        full = self.prefix + name
        if full not in self.tensors:
            if name in self.tensors:
                full = name
            else:
                raise CheckpointError(f"{self.source}: tensor {full!r} is missing")
        t = self.tensors[full]
        if tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"{self.source}: tensor {full!r} has shape {list(t.shape)}, expected "
                                  f"{list(shape)}{' (' + why + ')' if why else ''}")
        if not t.is_floating_point():
            raise CheckpointError(f"{self.source}: tensor {full!r} has dtype {t.dtype}, expected a float dtype")
        _check_finite(t, full, self.source)
        self.used.add(full)
        return t


def _check_finite(t: Tensor, name: str, source: str) -> None:
    """Damaged bytes inside a tensor's data almost always decode to some NaN / inf somewhere."""
    if not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"{source}: tensor {name!r} holds NaN or infinite values (a corrupted file?)")


def _assign(model: torch.nn.Module, values: dict[str, Tensor], source: str) -> None:
    """Put copies of `values` into the model's parameters; every parameter must be covered.

    Always a copy: safetensors memory-maps the file, and a parameter left pointing into the map
    would crash the process (SIGBUS) if the file were truncated or rewritten in place later.
    `p.data =` keeps each Parameter object, so tied weights stay tied."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(values))
    if missing:
        raise CheckpointError(f"{source}: no weights for {missing[:5]}")
    with torch.no_grad():
        for name, value in values.items():
            p = params[name]
            if p.shape != value.shape:  # a converter bug rather than a bad file, but say which
                raise CheckpointError(f"{source}: {name} would get shape {list(value.shape)}, expected {list(p.shape)}")
            p.data = value.detach().to(device=p.device, dtype=p.dtype).clone(memory_format=torch.contiguous_format)


@contextlib.contextmanager
def no_init():
    """Build modules without initialising their weights (they are about to be overwritten): the
    random init of 135M parameters costs more than reading them from disk."""
    saved = {name: getattr(torch.nn.init, name) for name in
             ("kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "uniform_", "normal_",
              "zeros_", "ones_", "constant_", "trunc_normal_")}

    def skip(tensor, *args, **kwargs):
        return tensor

    try:
        for name in saved:
            setattr(torch.nn.init, name, skip)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _decoder_values(cfg: DecoderConfig, t: _Tensors) -> dict[str, Tensor]:
    d, nh, nkv, hd, ff = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    heads = f"d_model={d}, n_heads={nh}, n_kv_heads={nkv}, head_dim={hd}"
    out: dict[str, Tensor] = {}
    if cfg.family == "gpt2":
        out["embed.weight"] = t.get("wte.weight", (cfg.vocab_size, d), "vocab_size x d_model")
        out["pos_embed.weight"] = t.get("wpe.weight", (cfg.max_position, d), "n_positions x d_model")
        for i in range(cfg.n_layers):
            h, o = f"h.{i}.", f"layers.{i}."
            for src, dst in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
                out[o + dst + ".weight"] = t.get(h + src + ".weight", (d,))
                out[o + dst + ".bias"] = t.get(h + src + ".bias", (d,))
            # Conv1D weights are [in, out]: transpose to nn.Linear's [out, in].
            out[o + "attn.qkv_proj.weight"] = t.get(h + "attn.c_attn.weight", (d, 3 * d), heads).t()
            out[o + "attn.qkv_proj.bias"] = t.get(h + "attn.c_attn.bias", (3 * d,), heads)
            out[o + "attn.o_proj.weight"] = t.get(h + "attn.c_proj.weight", (d, d)).t()
            out[o + "attn.o_proj.bias"] = t.get(h + "attn.c_proj.bias", (d,))
            out[o + "mlp.up_proj.weight"] = t.get(h + "mlp.c_fc.weight", (d, ff), f"d_ff={ff}").t()
            out[o + "mlp.up_proj.bias"] = t.get(h + "mlp.c_fc.bias", (ff,))
            out[o + "mlp.down_proj.weight"] = t.get(h + "mlp.c_proj.weight", (ff, d), f"d_ff={ff}").t()
            out[o + "mlp.down_proj.bias"] = t.get(h + "mlp.c_proj.bias", (d,))
        out["norm.weight"] = t.get("ln_f.weight", (d,))
        out["norm.bias"] = t.get("ln_f.bias", (d,))
        return out
    # llama / qwen2
    out["embed.weight"] = t.get("embed_tokens.weight", (cfg.vocab_size, d), "vocab_size x d_model")
    for i in range(cfg.n_layers):
        h, o = f"layers.{i}.", f"layers.{i}."
        out[o + "attn_norm.weight"] = t.get(h + "input_layernorm.weight", (d,))
        out[o + "mlp_norm.weight"] = t.get(h + "post_attention_layernorm.weight", (d,))
        q = t.get(h + "self_attn.q_proj.weight", (nh * hd, d), heads)
        k = t.get(h + "self_attn.k_proj.weight", (nkv * hd, d), heads)
        v = t.get(h + "self_attn.v_proj.weight", (nkv * hd, d), heads)
        out[o + "attn.qkv_proj.weight"] = torch.cat([q, k, v], dim=0)  # rows [Q heads | K heads | V heads]
        if cfg.qkv_bias:
            out[o + "attn.qkv_proj.bias"] = torch.cat([
                t.get(h + "self_attn.q_proj.bias", (nh * hd,), heads),
                t.get(h + "self_attn.k_proj.bias", (nkv * hd,), heads),
                t.get(h + "self_attn.v_proj.bias", (nkv * hd,), heads)])
        out[o + "attn.o_proj.weight"] = t.get(h + "self_attn.o_proj.weight", (d, nh * hd), heads)
        if cfg.o_bias:
            out[o + "attn.o_proj.bias"] = t.get(h + "self_attn.o_proj.bias", (d,))
        gate = t.get(h + "mlp.gate_proj.weight", (ff, d), f"intermediate_size={ff}")
        up = t.get(h + "mlp.up_proj.weight", (ff, d), f"intermediate_size={ff}")
        out[o + "mlp.gate_up_proj.weight"] = torch.cat([gate, up], dim=0)
        out[o + "mlp.down_proj.weight"] = t.get(h + "mlp.down_proj.weight", (d, ff), f"intermediate_size={ff}")
        if cfg.mlp_bias:
            out[o + "mlp.gate_up_proj.bias"] = torch.cat([t.get(h + "mlp.gate_proj.bias", (ff,)),
                                                          t.get(h + "mlp.up_proj.bias", (ff,))])
            out[o + "mlp.down_proj.bias"] = t.get(h + "mlp.down_proj.bias", (d,))
    out["norm.weight"] = t.get("norm.weight", (d,))
    if not cfg.tie_embeddings:
        # lm_head sits outside the "model." prefix in *ForCausalLM checkpoints
        name = "lm_head.weight"
        if name not in t.tensors:
            raise CheckpointError(f"{t.source}: tensor 'lm_head.weight' is missing (tie_word_embeddings is false)")
        w = t.tensors[name]
        if tuple(w.shape) != (cfg.vocab_size, d):
            raise CheckpointError(f"{t.source}: tensor 'lm_head.weight' has shape {list(w.shape)}, expected "
                                  f"{[cfg.vocab_size, d]}")
        _check_finite(w, name, t.source)
        out["lm_head.weight"] = w
    return out


def _encoder_values(cfg: EncoderConfig, t: _Tensors) -> dict[str, Tensor]:
    d, ff = cfg.d_model, cfg.d_ff
    out = {
        "embed.weight": t.get("embeddings.word_embeddings.weight", (cfg.vocab_size, d), "vocab_size x hidden_size"),
        "pos_embed.weight": t.get("embeddings.position_embeddings.weight", (cfg.max_position, d)),
        "type_embed.weight": t.get("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, d)),
        "embed_norm.weight": t.get("embeddings.LayerNorm.weight", (d,)),
        "embed_norm.bias": t.get("embeddings.LayerNorm.bias", (d,)),
    }
    heads = f"hidden_size={d}, num_attention_heads={cfg.n_heads}"
    for i in range(cfg.n_layers):
        h, o = f"encoder.layer.{i}.", f"layers.{i}."
        a = h + "attention."
        out[o + "attn.qkv_proj.weight"] = torch.cat(
            [t.get(a + f"self.{n}.weight", (d, d), heads) for n in ("query", "key", "value")])
        out[o + "attn.qkv_proj.bias"] = torch.cat(
            [t.get(a + f"self.{n}.bias", (d,), heads) for n in ("query", "key", "value")])
        out[o + "attn.o_proj.weight"] = t.get(a + "output.dense.weight", (d, d))
        out[o + "attn.o_proj.bias"] = t.get(a + "output.dense.bias", (d,))
        out[o + "attn_norm.weight"] = t.get(a + "output.LayerNorm.weight", (d,))
        out[o + "attn_norm.bias"] = t.get(a + "output.LayerNorm.bias", (d,))
        out[o + "mlp.up_proj.weight"] = t.get(h + "intermediate.dense.weight", (ff, d), f"intermediate_size={ff}")
        out[o + "mlp.up_proj.bias"] = t.get(h + "intermediate.dense.bias", (ff,))
        out[o + "mlp.down_proj.weight"] = t.get(h + "output.dense.weight", (d, ff), f"intermediate_size={ff}")
        out[o + "mlp.down_proj.bias"] = t.get(h + "output.dense.bias", (d,))
        out[o + "mlp_norm.weight"] = t.get(h + "output.LayerNorm.weight", (d,))
        out[o + "mlp_norm.bias"] = t.get(h + "output.LayerNorm.bias", (d,))
    if cfg.pooler:
        out["pooler.weight"] = t.get("pooler.dense.weight", (d, d))
        out["pooler.bias"] = t.get("pooler.dense.bias", (d,))
    return out


def model_type(cfg: dict, source: str) -> str:
    kind = cfg.get("model_type")
    if kind not in SUPPORTED:
        arch = cfg.get("architectures")
        raise CheckpointError(f"{source}: unsupported architecture model_type={kind!r}"
                              f"{f' ({arch[0]})' if arch else ''}; supported: {', '.join(SUPPORTED)}")
    return kind


def from_state_dict(cfg: dict, tensors: Mapping[str, Tensor], *, source: str = "state_dict",
                    dtype: torch.dtype = torch.float32) -> Decoder | Encoder:
    """A transformers config dict and name -> tensor mapping -> a headcount Decoder or Encoder."""
    kind = model_type(cfg, source)
    if kind == "bert":
        ecfg = encoder_config(cfg, source)
        t = _Tensors(tensors, source, ("bert.", ""))
        ecfg.pooler = t.has("pooler.dense.weight")
        with no_init():
            model = Encoder(ecfg, dtype=dtype)
        values = _encoder_values(ecfg, t)
    else:
        dcfg = decoder_config(cfg, source)
        t = _Tensors(tensors, source, ("transformer.", "model.", ""))
        with no_init():
            model = Decoder(dcfg, dtype=dtype)
        values = _decoder_values(dcfg, t)
    _assign(model, values, source)
    return model.eval()


def from_transformers(hf_model, *, dtype: torch.dtype = torch.float32) -> Decoder | Encoder:
    """A live transformers model (BertModel, GPT2Model/GPT2LMHeadModel, LlamaForCausalLM,
    Qwen2ForCausalLM) -> the headcount model with the same weights (copied: the two stay independent)."""
    cfg = hf_model.config.to_dict()
    name = type(hf_model).__name__
    return from_state_dict(cfg, hf_model.state_dict(), source=name, dtype=dtype)


# ------------------------------------------------------------------------------- checkpoint files
def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """All tensors of a .safetensors file, after checking its header against the file's size, so a
    truncated or corrupted file gets an error naming the file and the first tensor it cannot hold."""
    from safetensors.torch import load_file

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100_000_000):
            raise CheckpointError(f"{path}: not a safetensors file, or truncated (header of {header_len} bytes, "
                                  f"file of {size})")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: corrupted safetensors header ({e.__class__.__name__})") from None
    data_len = size - 8 - header_len
    itemsize = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            expected = math.prod(info["shape"]) * itemsize.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupted safetensors header at tensor {name!r}") from None
        if end > data_len:
            raise CheckpointError(f"{path}: truncated: tensor {name!r} needs bytes {start}..{end} of the data, "
                                  f"the file holds {data_len}")
        if info["dtype"] in itemsize and end - start != expected:
            raise CheckpointError(f"{path}: corrupted: tensor {name!r} has {end - start} bytes for shape "
                                  f"{info['shape']} of {info['dtype']}")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors' own checks (overlaps, bad dtypes)
        raise CheckpointError(f"{path}: cannot read safetensors ({e})") from None


def read_checkpoint_tensors(directory: str | Path) -> tuple[dict[str, Tensor], str]:
    """(name -> tensor, the file name(s) they came from) for a transformers checkpoint directory."""
    directory = Path(directory)
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    pt = directory / "pytorch_model.bin"
    if single.is_file():
        return read_safetensors(single), str(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{index}: not a valid safetensors index") from None
        tensors: dict[str, Tensor] = {}
        for shard in shards:
            tensors.update(read_safetensors(directory / shard))
        return tensors, str(index)
    if pt.is_file():
        try:
            state = torch.load(pt, map_location="cpu", weights_only=True)  # never unpickles code
        except Exception as e:
            raise CheckpointError(f"{pt}: cannot read (weights_only=True: {str(e).splitlines()[0]})") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{pt}: expected a state dict, got {type(state).__name__}")
        return state, str(pt)
    raise CheckpointError(f"{directory}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


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


def load_checkpoint(directory: str | Path, *, dtype: torch.dtype = torch.float32) -> Decoder | Encoder:
    """A local transformers checkpoint directory -> a headcount model, with its tokenizer.json if present."""
    from headcount.models.tokenizer import Tokenizer

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    cfg = read_config(directory)
    model_type(cfg, str(directory / "config.json"))  # fail on the architecture before reading weights
    tensors, source = read_checkpoint_tensors(directory)
    model = from_state_dict(cfg, tensors, source=source, dtype=dtype)
    tok_path = directory / "tokenizer.json"
    if tok_path.is_file():
        if isinstance(model, Encoder):
            model.tokenizer = Tokenizer.from_file(tok_path, pad_token_id=model.config.pad_token_id,
                                                  add_special_tokens=True)
        else:
            c = model.config
            model.tokenizer = Tokenizer.from_file(tok_path, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                                                  pad_token_id=c.pad_token_id,
                                                  add_special_tokens=bool(cfg.get("add_bos_token", False)))
    model.name = str(directory)
    return model


def to_transformers_state_dict(model: Decoder) -> tuple[dict, dict[str, Tensor]]:
    """(config dict, state dict) in transformers' Llama / Qwen2 layout: the inverse of the converter,
    used to write the SmolLM2 cache as an ordinary checkpoint and to build the reference model in tests."""
    cfg = model.config
    if cfg.family not in ("llama", "qwen2"):
        raise ValueError(f"to_transformers_state_dict: only llama / qwen2 decoders, not {cfg.family!r}")
    # Head counts from the modules (a pruned or merged model's config keeps the original counts);
    # the caller checks that every layer has the same counts with even groups.
    nh, nkv = model.layers[0].attn.n_heads, model.layers[0].attn.n_kv_heads
    hd, ff = cfg.head_dim, cfg.d_ff
    # Llama has one attention_bias switch for q, k, v and o: a bias any layer gained (lstsq refit,
    # mean compensation) is written everywhere, zeros where a layer has none. Qwen2: q/k/v biases only.
    llama_bias = cfg.family == "llama" and any(
        layer.attn.qkv_proj.bias is not None or layer.attn.o_proj.bias is not None for layer in model.layers)
    sd: dict[str, Tensor] = {"model.embed_tokens.weight": model.embed.weight.detach()}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        w = layer.attn.qkv_proj.weight.detach()
        sd[p + "self_attn.q_proj.weight"] = w[: nh * hd]
        sd[p + "self_attn.k_proj.weight"] = w[nh * hd:(nh + nkv) * hd]
        sd[p + "self_attn.v_proj.weight"] = w[(nh + nkv) * hd:]
        b = layer.attn.qkv_proj.bias
        if b is not None or llama_bias:
            b = b.detach() if b is not None else w.new_zeros(w.shape[0])
            sd[p + "self_attn.q_proj.bias"] = b[: nh * hd]
            sd[p + "self_attn.k_proj.bias"] = b[nh * hd:(nh + nkv) * hd]
            sd[p + "self_attn.v_proj.bias"] = b[(nh + nkv) * hd:]
        sd[p + "self_attn.o_proj.weight"] = layer.attn.o_proj.weight.detach()
        ob = layer.attn.o_proj.bias
        if ob is not None or llama_bias:
            sd[p + "self_attn.o_proj.bias"] = ob.detach() if ob is not None else w.new_zeros(cfg.d_model)
        gu = layer.mlp.gate_up_proj.weight.detach()
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = gu[:ff], gu[ff:]
        sd[p + "mlp.down_proj.weight"] = layer.mlp.down_proj.weight.detach()
        if cfg.mlp_bias:
            gub = layer.mlp.gate_up_proj.bias.detach()
            sd[p + "mlp.gate_proj.bias"], sd[p + "mlp.up_proj.bias"] = gub[:ff], gub[ff:]
            sd[p + "mlp.down_proj.bias"] = layer.mlp.down_proj.bias.detach()
        sd[p + "input_layernorm.weight"] = layer.attn_norm.weight.detach()
        sd[p + "post_attention_layernorm.weight"] = layer.mlp_norm.weight.detach()
    sd["model.norm.weight"] = model.norm.weight.detach()
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight.detach()
    hf = {
        "architectures": ["LlamaForCausalLM" if cfg.family == "llama" else "Qwen2ForCausalLM"],
        "model_type": cfg.family, "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": nh, "num_key_value_heads": nkv,
        "head_dim": hd, "intermediate_size": ff, "max_position_embeddings": cfg.max_position,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": llama_bias,
        "mlp_bias": cfg.mlp_bias, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id, "torch_dtype": "float32",
    }
    return hf, sd


def to_transformers(model: Decoder, *, attn_implementation: str = "sdpa"):
    """The transformers LlamaForCausalLM / Qwen2ForCausalLM with this decoder's weights (needs the
    transformers package): the reference the tests and `headcount bench decode` compare against."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config and our weights: never the hub
    try:
        import transformers
    except ImportError:
        raise ImportError("comparing against transformers needs it: pip install transformers") from None
    hf_cfg, sd = to_transformers_state_dict(model)
    cls_cfg = transformers.LlamaConfig if model.config.family == "llama" else transformers.Qwen2Config
    cls_model = transformers.LlamaForCausalLM if model.config.family == "llama" else transformers.Qwen2ForCausalLM
    cfg = cls_cfg(**{k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    cfg._attn_implementation = attn_implementation
    hf = cls_model(cfg).to(model.embed.weight.dtype)
    missing, unexpected = hf.load_state_dict({k: v.clone() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"to_transformers: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()
