"""transformers checkpoints <-> headcount models: the reader and the writer of one format.

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

import json
from pathlib import Path
from typing import Mapping

import torch

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.encoder import Encoder, EncoderConfig
from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.hf_config import decoder_config, encoder_config, model_type, read_config
from headcount.models.formats.native import check_out, tokenizer_writer, write_dir
from headcount.models.formats.tensors import assign, check_finite, no_init, read_safetensors

Tensor = torch.Tensor


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
        check_finite(t, full, self.source)
        self.used.add(full)
        return t


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
        check_finite(w, name, t.source)
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
    assign(model, values, source)
    return model.eval()


def from_transformers(hf_model, *, dtype: torch.dtype = torch.float32) -> Decoder | Encoder:
    """A live transformers model (BertModel, GPT2Model/GPT2LMHeadModel, LlamaForCausalLM,
    Qwen2ForCausalLM) -> the headcount model with the same weights (copied: the two stay independent)."""
    cfg = hf_model.config.to_dict()
    name = type(hf_model).__name__
    return from_state_dict(cfg, hf_model.state_dict(), source=name, dtype=dtype)


# ------------------------------------------------------------------------------- checkpoint files
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



# ------------------------------------------------------------------------------------------ writing
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


# export_transformers: a checkpoint of a (pruned) model that transformers loads with no headcount code.
# export_transformers: a plain transformers checkpoint that loads with no headcount code.
#   Llama (LlamaForCausalLM): every layer must keep the same numbers of query and KV heads, in even
#     groups (kv_head_of[i] == i // (n_heads // n_kv_heads)); head_dim stays 64, written explicitly
#     (transformers honours `head_dim`, so num_attention_heads * head_dim may differ from hidden_size).
#     transformers' LlamaConfig also insists hidden_size % num_attention_heads == 0 (checked at load), so
#     a count that does not divide hidden_size is refused. A compensated o_proj bias is carried with
#     attention_bias=True (transformers then gives q/k/v biases too: written as zeros, exact).
#     Per-layer counts: transformers 5.x `per_layer_config` is accepted by LlamaConfig but
#     LlamaAttention reads the global num_attention_heads (checked on 5.24: every layer is built with
#     the global count), so it cannot carry them; refused with the reason.
#   BERT (BertModel): transformers derives the head size as hidden_size / num_attention_heads, so a
#     pruned layer cannot be written with fewer heads. Removed heads are padded back as ZERO heads
#     (zero Q/K/V rows and biases, zero o_proj columns): their context is 0 (V = 0), so the output is
#     exactly the pruned model's. Works for any per-layer pattern; the file is not smaller.
def _layouts(model) -> list[tuple[int, int, bool]]:
    return [(l.attn.n_heads, l.attn.n_kv_heads, l.attn.is_uniform) for l in model.layers]


def llama_state_dict(model) -> tuple[dict, dict[str, Tensor]]:
    """(config.json dict, LlamaForCausalLM state dict) for a pruned Llama decoder with uniform layers."""
    from headcount.models.decoder import Decoder

    if not isinstance(model, Decoder) or model.config.family != "llama":
        raise ValueError(f"model: export_transformers writes llama decoders and BERT encoders; this is "
                         f"{type(model).__name__} ({getattr(model.config, 'family', '?')})")
    lay = _layouts(model)
    if len({(nh, nkv) for nh, nkv, _ in lay}) != 1:
        counts = ", ".join(f"{i}:{nh}/{nkv}" for i, (nh, nkv, _) in enumerate(lay))
        raise ValueError("model: layers keep different head counts (layer:query/kv " + counts + "); a transformers "
                         "Llama checkpoint has one count for every layer (transformers' per_layer_config does not "
                         "reach LlamaAttention). Prune with uniform=True, or keep it in headcount's format (save)")
    uneven = [i for i, (_, _, uniform) in enumerate(lay) if not uniform]
    if uneven:
        raise ValueError(f"model: layers {uneven[:8]} have uneven GQA groups (kv_head_of "
                         f"{model.layers[uneven[0]].attn.kv_head_of}); transformers' repeat_kv needs query head i to "
                         "read KV head i // (n_heads // n_kv_heads). Prune with uniform=True (same count per group) "
                         "or mode='group'")
    cfg = model.config
    nh = lay[0][0]
    if cfg.d_model % nh:
        raise ValueError(f"model: {nh} query heads per layer; transformers' LlamaConfig requires hidden_size "
                         f"({cfg.d_model}) to be a multiple of num_attention_heads")
    hf, sd = to_transformers_state_dict(model)
    hf["dtype"] = "float32"
    return hf, sd


def bert_state_dict(model) -> tuple[dict, dict[str, Tensor]]:
    """(config.json, BertModel state dict) with every removed head padded back as a zero head."""
    cfg = model.config
    n, hd, d = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.d_model
    sd: dict[str, Tensor] = {
        "embeddings.word_embeddings.weight": model.embed.weight.detach(),
        "embeddings.position_embeddings.weight": model.pos_embed.weight.detach(),
        "embeddings.token_type_embeddings.weight": model.type_embed.weight.detach(),
        "embeddings.LayerNorm.weight": model.embed_norm.weight.detach(),
        "embeddings.LayerNorm.bias": model.embed_norm.bias.detach(),
    }
    for i, layer in enumerate(model.layers):
        attn, p = layer.attn, f"encoder.layer.{i}."
        if attn.n_kv_heads != attn.n_heads or not attn.is_uniform:
            raise ValueError(f"model: layer {i} shares K/V heads ({attn.n_heads} query, {attn.n_kv_heads} KV); "
                             "BERT in transformers has one K/V head per query head")
        w, b = attn.qkv_proj.weight.detach(), attn.qkv_proj.bias.detach()
        k = attn.n_heads
        rows = [h * hd + j for h in attn.kept_heads for j in range(hd)]  # where each kept head goes
        for part, name in enumerate(("query", "key", "value")):
            full_w, full_b = w.new_zeros(n * hd, d), w.new_zeros(n * hd)
            full_w[rows] = w[part * k * hd:(part + 1) * k * hd]
            full_b[rows] = b[part * k * hd:(part + 1) * k * hd]
            sd[p + f"attention.self.{name}.weight"], sd[p + f"attention.self.{name}.bias"] = full_w, full_b
        o = w.new_zeros(d, n * hd)
        o[:, rows] = attn.o_proj.weight.detach()
        sd[p + "attention.output.dense.weight"] = o
        ob = attn.o_proj.bias
        sd[p + "attention.output.dense.bias"] = ob.detach() if ob is not None else w.new_zeros(d)
        sd[p + "attention.output.LayerNorm.weight"] = layer.attn_norm.weight.detach()
        sd[p + "attention.output.LayerNorm.bias"] = layer.attn_norm.bias.detach()
        sd[p + "intermediate.dense.weight"] = layer.mlp.up_proj.weight.detach()
        sd[p + "intermediate.dense.bias"] = layer.mlp.up_proj.bias.detach()
        sd[p + "output.dense.weight"] = layer.mlp.down_proj.weight.detach()
        sd[p + "output.dense.bias"] = layer.mlp.down_proj.bias.detach()
        sd[p + "output.LayerNorm.weight"] = layer.mlp_norm.weight.detach()
        sd[p + "output.LayerNorm.bias"] = layer.mlp_norm.bias.detach()
    if model.pooler is not None:
        sd["pooler.dense.weight"] = model.pooler.weight.detach()
        sd["pooler.dense.bias"] = model.pooler.bias.detach()
    hf = {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": cfg.vocab_size, "hidden_size": d,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": n, "intermediate_size": cfg.d_ff,
        "hidden_act": "gelu" if cfg.act == "gelu" else "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.max_position, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "pad_token_id": cfg.pad_token_id, "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "torch_dtype": "float32",
        "dtype": "float32",
    }
    return hf, sd


def export_transformers(model, directory, *, force: bool = False) -> Path:
    """Write a transformers checkpoint (config.json, model.safetensors, tokenizer.json) that
    LlamaForCausalLM / BertModel.from_pretrained loads with no headcount code (see the module doc)."""
    from headcount.models.encoder import Encoder

    directory = Path(directory).expanduser()
    check_out(directory, force)
    hf, sd = bert_state_dict(model) if isinstance(model, Encoder) else llama_state_dict(model)
    files: dict[str, object] = {"config.json": hf, "model.safetensors": sd}
    writer = tokenizer_writer(model)
    if writer is not None:
        files["tokenizer.json"] = writer
    return write_dir(directory, files)
