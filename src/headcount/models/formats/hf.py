"""transformers checkpoints <-> headcount models: the reader and the writer of one format.

Supported: BertModel (and Bert* heads: only the encoder is kept), GPT2Model / GPT2LMHeadModel,
LlamaForCausalLM (SmolLM2, Llama 2/3 with default or linear rotary), MistralForCausalLM (sliding window
on every layer when set), Qwen2ForCausalLM (q/k/v biases, no o bias) and Qwen3ForCausalLM (q/k norms;
both with their optional sliding-window layers), Gemma3ForCausalLM / Gemma3TextModel (`gemma3_text`;
with use_bidirectional_attention an encoder: BidirectionalEncoder) and the language model of
Gemma3ForConditionalGeneration (`gemma3`: the vision tower and projector are not read), and the
mixture-of-experts families MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM and
GptOssForCausalLM (per-head sinks `self_attn.sinks`): their expert tensors in hf_moe.py.

Gemma's RMSNorms multiply by (1 + w) (in float32); headcount's norms multiply by a plain weight, so
the reader stores 1 + w (computed in float32, as Gemma does) and the writer subtracts 1. This holds
for the four norms of each block, the final norm and the per-head q_norm / k_norm.

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
import math
import warnings
from pathlib import Path
from typing import Iterator, Mapping

import torch

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.encoder import BidirectionalEncoder, Encoder, EncoderConfig
from headcount.models.formats import hf_moe
from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.hf_config import MOE_FAMILIES, decoder_config, encoder_config, model_type, read_config
from headcount.models.formats.native import chat_template_writer, check_out, tokenizer_writer, write_dir
from headcount.models.formats.tensors import SafetensorsFile, ShardedTensors, assign, check_finite, no_init

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


def _gemma_weight(w: Tensor) -> Tensor:
    """Gemma's RMSNorm weight w -> the plain weight 1 + w (float32, as Gemma computes it)."""
    return 1.0 + w.float()


def _decoder_values(cfg: DecoderConfig, t: _Tensors, *, lm_head: bool = True) -> Iterator[tuple[str, Tensor]]:
    """(headcount name, tensor) pairs, produced one at a time: with a lazy reader (SafetensorsFile) loading
    holds the model plus the few source tensors of one value, never a second copy of the weights."""
    d, nh, nkv, hd, ff = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    heads = f"d_model={d}, n_heads={nh}, n_kv_heads={nkv}, head_dim={hd}"
    if cfg.family == "gpt2":
        yield "embed.weight", t.get("wte.weight", (cfg.vocab_size, d), "vocab_size x d_model")
        yield "pos_embed.weight", t.get("wpe.weight", (cfg.max_position, d), "n_positions x d_model")
        for i in range(cfg.n_layers):
            h, o = f"h.{i}.", f"layers.{i}."
            for src, dst in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
                yield o + dst + ".weight", t.get(h + src + ".weight", (d,))
                yield o + dst + ".bias", t.get(h + src + ".bias", (d,))
            # Conv1D weights are [in, out]: transpose to nn.Linear's [out, in].
            yield o + "attn.qkv_proj.weight", t.get(h + "attn.c_attn.weight", (d, 3 * d), heads).t()
            yield o + "attn.qkv_proj.bias", t.get(h + "attn.c_attn.bias", (3 * d,), heads)
            yield o + "attn.o_proj.weight", t.get(h + "attn.c_proj.weight", (d, d)).t()
            yield o + "attn.o_proj.bias", t.get(h + "attn.c_proj.bias", (d,))
            yield o + "mlp.up_proj.weight", t.get(h + "mlp.c_fc.weight", (d, ff), f"d_ff={ff}").t()
            yield o + "mlp.up_proj.bias", t.get(h + "mlp.c_fc.bias", (ff,))
            yield o + "mlp.down_proj.weight", t.get(h + "mlp.c_proj.weight", (ff, d), f"d_ff={ff}").t()
            yield o + "mlp.down_proj.bias", t.get(h + "mlp.c_proj.bias", (d,))
        yield "norm.weight", t.get("ln_f.weight", (d,))
        yield "norm.bias", t.get("ln_f.bias", (d,))
        return
    if cfg.family == "gpt_neox":
        yield from _gpt_neox_values(cfg, t, heads, lm_head=lm_head)
        return
    # llama / mistral / qwen2 / qwen3 / gemma3 / gemma2 / olmo2
    gemma = cfg.family in GEMMA
    norm = _gemma_weight if gemma else (lambda w: w)
    norms = _NORMS.get(cfg.family, _NORMS["llama"])
    yield "embed.weight", t.get("embed_tokens.weight", (cfg.vocab_size, d), "vocab_size x d_model")
    for i in range(cfg.n_layers):
        h, o = f"layers.{i}.", f"layers.{i}."
        for ours, theirs in norms.items():
            yield o + ours + ".weight", norm(t.get(h + theirs + ".weight", (d,)))
        if cfg.family == "phi3":  # fused already, in headcount's row order: qkv_proj [q; k; v]
            yield o + "attn.qkv_proj.weight", t.get(h + "self_attn.qkv_proj.weight", ((nh + 2 * nkv) * hd, d), heads)
        else:
            q = t.get(h + "self_attn.q_proj.weight", (nh * hd, d), heads)
            k = t.get(h + "self_attn.k_proj.weight", (nkv * hd, d), heads)
            v = t.get(h + "self_attn.v_proj.weight", (nkv * hd, d), heads)
            yield o + "attn.qkv_proj.weight", torch.cat([q, k, v], dim=0)  # rows [Q heads | K heads | V heads]
        if cfg.qkv_bias:
            yield o + "attn.qkv_proj.bias", torch.cat([
                t.get(h + "self_attn.q_proj.bias", (nh * hd,), heads),
                t.get(h + "self_attn.k_proj.bias", (nkv * hd,), heads),
                t.get(h + "self_attn.v_proj.bias", (nkv * hd,), heads)])
        if cfg.qk_norm_full:  # OLMo 2: one norm over the whole projection
            yield o + "attn.q_norm.weight", t.get(h + "self_attn.q_norm.weight", (nh * hd,), heads)
            yield o + "attn.k_norm.weight", t.get(h + "self_attn.k_norm.weight", (nkv * hd,), heads)
        elif cfg.qk_norm:
            for n in ("q_norm", "k_norm"):
                yield o + f"attn.{n}.weight", norm(t.get(h + f"self_attn.{n}.weight", (hd,), f"head_dim={hd}"))
        yield o + "attn.o_proj.weight", t.get(h + "self_attn.o_proj.weight", (d, nh * hd), heads)
        if cfg.o_bias:
            yield o + "attn.o_proj.bias", t.get(h + "self_attn.o_proj.bias", (d,))
        if cfg.attn_sinks:
            yield o + "attn.sinks", t.get(h + "self_attn.sinks", (nh,), heads)
        if cfg.is_moe_layer(i):
            yield from hf_moe.read_layer(cfg, t, i)
            continue
        if cfg.family == "phi3":  # gate_up_proj [gate; up], as headcount's
            yield o + "mlp.gate_up_proj.weight", t.get(h + "mlp.gate_up_proj.weight", (2 * ff, d),
                                                       f"2 x intermediate_size={ff}")
        else:
            gate = t.get(h + "mlp.gate_proj.weight", (ff, d), f"intermediate_size={ff}")
            up = t.get(h + "mlp.up_proj.weight", (ff, d), f"intermediate_size={ff}")
            yield o + "mlp.gate_up_proj.weight", torch.cat([gate, up], dim=0)
        yield o + "mlp.down_proj.weight", t.get(h + "mlp.down_proj.weight", (d, ff), f"intermediate_size={ff}")
        if cfg.mlp_bias:
            yield o + "mlp.gate_up_proj.bias", torch.cat([t.get(h + "mlp.gate_proj.bias", (ff,)),
                                                          t.get(h + "mlp.up_proj.bias", (ff,))])
            yield o + "mlp.down_proj.bias", t.get(h + "mlp.down_proj.bias", (d,))
    yield "norm.weight", norm(t.get("norm.weight", (d,)))
    if lm_head and not cfg.tie_embeddings:
        # lm_head sits outside the "model." prefix in *ForCausalLM checkpoints
        names = [n for n in ("lm_head.weight", "language_model.lm_head.weight") if n in t.tensors]
        if not names:
            raise CheckpointError(f"{t.source}: tensor 'lm_head.weight' is missing (tie_word_embeddings is false)")
        name = names[0]
        w = t.tensors[name]
        if tuple(w.shape) != (cfg.vocab_size, d):
            raise CheckpointError(f"{t.source}: tensor {name!r} has shape {list(w.shape)}, expected "
                                  f"{[cfg.vocab_size, d]}")
        check_finite(w, name, t.source)
        yield "lm_head.weight", w


# headcount's norm <- transformers' (Llama's post_attention_layernorm is the norm BEFORE the MLP; Gemma's is
# the one after the attention, and its pre_feedforward_layernorm comes before the MLP; OLMo 2 has only the
# norms after each sub-layer)
_NORMS = {
    "llama": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "gemma3": {"attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
               "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm"},
    "olmo2": {"post_attn_norm": "post_attention_layernorm", "post_mlp_norm": "post_feedforward_layernorm"},
}
_NORMS["gemma2"] = _NORMS["gemma3"]
GEMMA = ("gemma3", "gemma2")  # norms stored as w, multiplied by 1 + w


def _gpt_neox_values(cfg: DecoderConfig, t: _Tensors, heads: str, *, lm_head: bool) -> Iterator[tuple[str, Tensor]]:
    """GPT-NeoX / Pythia: query_key_value's rows are laid out [n_heads, 3, head_dim] (each head's q, k, v
    together); headcount's qkv_proj wants [3, n_heads, head_dim] ([all Q | all K | all V])."""
    d, nh, hd, ff = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff
    yield "embed.weight", t.get("embed_in.weight", (cfg.vocab_size, d), "vocab_size x hidden_size")
    for i in range(cfg.n_layers):
        h, o = f"layers.{i}.", f"layers.{i}."
        for src, dst in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")):
            yield o + dst + ".weight", t.get(h + src + ".weight", (d,))
            yield o + dst + ".bias", t.get(h + src + ".bias", (d,))
        w = t.get(h + "attention.query_key_value.weight", (3 * nh * hd, d), heads)
        yield o + "attn.qkv_proj.weight", w.view(nh, 3, hd, d).transpose(0, 1).reshape(3 * nh * hd, d)
        if cfg.qkv_bias:
            b = t.get(h + "attention.query_key_value.bias", (3 * nh * hd,), heads)
            yield o + "attn.qkv_proj.bias", b.view(nh, 3, hd).transpose(0, 1).reshape(-1)
        yield o + "attn.o_proj.weight", t.get(h + "attention.dense.weight", (d, nh * hd), heads)
        if cfg.o_bias:
            yield o + "attn.o_proj.bias", t.get(h + "attention.dense.bias", (d,))
        yield o + "mlp.up_proj.weight", t.get(h + "mlp.dense_h_to_4h.weight", (ff, d), f"intermediate_size={ff}")
        yield o + "mlp.up_proj.bias", t.get(h + "mlp.dense_h_to_4h.bias", (ff,))
        yield o + "mlp.down_proj.weight", t.get(h + "mlp.dense_4h_to_h.weight", (d, ff), f"intermediate_size={ff}")
        yield o + "mlp.down_proj.bias", t.get(h + "mlp.dense_4h_to_h.bias", (d,))
    yield "norm.weight", t.get("final_layer_norm.weight", (d,))
    yield "norm.bias", t.get("final_layer_norm.bias", (d,))
    if lm_head and not cfg.tie_embeddings:
        yield "lm_head.weight", _lm_head(cfg, t, ("embed_out.weight", "lm_head.weight"))


def _lm_head(cfg: DecoderConfig, t: _Tensors, names: tuple[str, ...]) -> Tensor:
    """The untied output matrix: outside the model's prefix in *ForCausalLM checkpoints."""
    found = [n for n in names if n in t.tensors]
    if not found:
        raise CheckpointError(f"{t.source}: tensor {names[0]!r} is missing (tie_word_embeddings is false)")
    w = t.tensors[found[0]]
    if tuple(w.shape) != (cfg.vocab_size, cfg.d_model):
        raise CheckpointError(f"{t.source}: tensor {found[0]!r} has shape {list(w.shape)}, expected "
                              f"{[cfg.vocab_size, cfg.d_model]}")
    check_finite(w, found[0], t.source)
    return w


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


_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def from_state_dict(cfg: dict, tensors: Mapping[str, Tensor], *, source: str = "state_dict",
                    dtype: torch.dtype = torch.float32) -> Decoder | Encoder | BidirectionalEncoder:
    """A transformers config dict and name -> tensor mapping -> a headcount Decoder or Encoder
    (a BidirectionalEncoder for a gemma3_text config with use_bidirectional_attention)."""
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
        prefixes = ("gpt_neox.", "") if kind == "gpt_neox" else ("transformer.", "model.", "")
        if kind == "gemma3":  # Gemma3ForConditionalGeneration: the language model only
            prefixes = ("model.language_model.", "language_model.model.", "language_model.")
            vision = sum(1 for k in tensors if k.startswith(_VISION))
            warnings.warn(f"{source}: gemma3 (image + text): loading the language model; the vision tower and "
                          f"projector ({vision} tensors) are not read", stacklevel=2)
        t = _Tensors(tensors, source, prefixes)
        with no_init():
            model = Decoder(dcfg, dtype=dtype) if dcfg.causal else BidirectionalEncoder(dcfg, dtype=dtype)
        values = _decoder_values(dcfg, t, lm_head=dcfg.causal)
    assign(model, values, source, fresh=bool(getattr(tensors, "fresh", False)))
    return model.eval()


def from_transformers(hf_model, *, dtype: torch.dtype = torch.float32) -> Decoder | Encoder | BidirectionalEncoder:
    """A live transformers model (BertModel, GPT2Model/GPT2LMHeadModel, Llama / Mistral / Qwen2 / Qwen3 /
    Gemma3 ForCausalLM, Gemma3TextModel, Gemma3ForConditionalGeneration) -> the headcount model with the
    same weights (copied: the two stay independent)."""
    cfg = hf_model.config.to_dict()
    name = type(hf_model).__name__
    return from_state_dict(cfg, hf_model.state_dict(), source=name, dtype=dtype)


# ------------------------------------------------------------------------------- checkpoint files
def read_checkpoint_tensors(directory: str | Path) -> tuple[Mapping[str, Tensor], str]:
    """(name -> tensor, the file name(s) they came from) for a transformers checkpoint directory."""
    directory = Path(directory)
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    pt = directory / "pytorch_model.bin"
    if single.is_file():  # read lazily, one tensor at a time (SafetensorsFile)
        return SafetensorsFile(single), str(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{index}: not a valid safetensors index") from None
        return ShardedTensors([SafetensorsFile(directory / shard) for shard in shards]), str(index)
    if pt.is_file():
        try:
            state = torch.load(pt, map_location="cpu", weights_only=True)  # never unpickles code
        except Exception as e:
            raise CheckpointError(f"{pt}: cannot read (weights_only=True: {str(e).splitlines()[0]})") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{pt}: expected a state dict, got {type(state).__name__}")
        return state, str(pt)
    raise CheckpointError(f"{directory}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def load_checkpoint(directory: str | Path, *,
                    dtype: torch.dtype = torch.float32) -> Decoder | Encoder | BidirectionalEncoder:
    """A local transformers checkpoint directory -> a headcount model, with its tokenizer.json if present."""
    from headcount.models.tokenizer import Tokenizer

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    cfg = read_config(directory)
    # fail on the architecture and on any unsupported field before reading weights
    if model_type(cfg, str(directory / "config.json")) != "bert":
        decoder_config(cfg, str(directory / "config.json"))
    tensors, source = read_checkpoint_tensors(directory)
    model = from_state_dict(cfg, tensors, source=source, dtype=dtype)
    tok_path = directory / "tokenizer.json"
    if tok_path.is_file():
        c = model.config
        if isinstance(model, Encoder):
            model.tokenizer = Tokenizer.from_file(tok_path, pad_token_id=c.pad_token_id, add_special_tokens=True)
        elif isinstance(model, BidirectionalEncoder):  # embedding models encode with their special tokens
            model.tokenizer = Tokenizer.from_file(tok_path, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                                                  pad_token_id=c.pad_token_id, add_special_tokens=True)
        else:
            model.tokenizer = Tokenizer.from_file(tok_path, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                                                  pad_token_id=c.pad_token_id,
                                                  add_special_tokens=_add_bos(directory, cfg))
        from headcount.models.chat import read_chat_template

        model.tokenizer.chat_template = read_chat_template(directory)
    model.name = str(directory)
    return model


def _add_bos(directory: Path, cfg: dict) -> bool:
    """tokenizer_config.json's add_bos_token (Gemma: true), else config.json's, else False."""
    path = directory / "tokenizer_config.json"
    if path.is_file():
        try:
            tok_cfg = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError(f"{path}: not valid JSON") from None
        if isinstance(tok_cfg, dict) and "add_bos_token" in tok_cfg:
            return bool(tok_cfg["add_bos_token"])
    return bool(cfg.get("add_bos_token", False))


# ------------------------------------------------------------------------------------------ writing
# family -> (transformers config class, model class): what to_transformers builds and config.json names.
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),  # a BidirectionalEncoder: Gemma3TextModel
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
}
_MODEL_TYPE = {"gemma3": "gemma3_text"}


def hf_classes(model) -> tuple[str, str]:
    """(config class, model class) names in transformers for this headcount model."""
    family = model.config.family
    if family not in HF_CLASSES:
        raise ValueError(f"to_transformers: writes {', '.join(HF_CLASSES)} decoders, not {family!r}")
    cfg_cls, model_cls = HF_CLASSES[family]
    return (cfg_cls, "Gemma3TextModel") if not model.config.causal else (cfg_cls, model_cls)


def _qk_scalar(cfg: DecoderConfig) -> int | float:
    """Gemma's query_pre_attn_scalar back from softmax_scale = scalar ** -0.5 (a whole number when it was one)."""
    if cfg.softmax_scale is None:
        return cfg.head_dim
    scalar = cfg.softmax_scale ** -2
    return int(round(scalar)) if abs(scalar - round(scalar)) < 1e-6 * scalar else scalar


def _granite_scale(cfg: DecoderConfig) -> float:
    """Granite's attention_multiplier: its softmax scale (the config's, or head_dim ** -0.5 when unset)."""
    return cfg.softmax_scale if cfg.softmax_scale is not None else cfg.head_dim ** -0.5


def _attention_biases(model, family: str) -> bool:
    """The one attention_bias switch of llama / qwen3 / gemma3 (q, k, v and o together): True when any
    layer has a bias (an lstsq refit or mean compensation gives o_proj one; the rest are written as zeros).
    Qwen2 always has q/k/v biases and no o bias; Mistral has none: a bias they cannot hold is refused."""
    qkv = any(layer.attn.qkv_proj.bias is not None for layer in model.layers)
    o = any(layer.attn.o_proj.bias is not None for layer in model.layers)
    if family in ("mistral", "mixtral", "phi3") and (qkv or o):
        raise ValueError(f"model: a {family} checkpoint has no attention biases, and this model has some "
                         "(compensation adds an o_proj bias): transformers' model cannot hold them")
    if family == "qwen2" and o:
        raise ValueError("model: a Qwen2 checkpoint has no o_proj bias, and this model has one (compensation adds it): "
                         "transformers' Qwen2ForCausalLM cannot hold it")
    return (qkv or o) if family in ("llama", "qwen3", "gemma3", "qwen3_moe", "olmoe", "gpt_oss", "smollm3",
                                    "granite", "gemma2", "olmo2") else family == "qwen2"


def to_transformers_state_dict(model: Decoder | BidirectionalEncoder) -> tuple[dict, dict[str, Tensor]]:
    """(config dict, state dict) in transformers' layout for llama / mistral / qwen2 / qwen3 / gemma3
    decoders: the inverse of the converter, used to write the SmolLM2 cache as an ordinary checkpoint,
    to export, and to build the reference model in tests. Gemma's norms are written as w = weight - 1."""
    cfg = model.config
    family = cfg.family
    hf_classes(model)  # refuses other families
    if family == "gpt_neox":
        return _gpt_neox_state_dict(model)
    # Head counts from the modules (a pruned or merged model's config keeps the original counts);
    # the caller checks that every layer has the same counts with even groups.
    nh, nkv = model.layers[0].attn.n_heads, model.layers[0].attn.n_kv_heads
    hd, ff = cfg.head_dim, cfg.d_ff
    bias = _attention_biases(model, family)
    if cfg.mlp_bias and family not in ("llama", "smollm3", "granite"):
        raise ValueError(f"model: MLP biases; transformers' {family} has none")
    gemma = family in GEMMA

    def norm(w: Tensor) -> Tensor:
        w = w.detach()
        return (w.float() - 1.0).to(w.dtype) if gemma else w

    norms = _NORMS.get(family, _NORMS["llama"])
    top = "model." if cfg.causal else ""  # Gemma3TextModel (the encoder) has no "model." prefix
    sd: dict[str, Tensor] = {top + "embed_tokens.weight": model.embed.weight.detach()}
    for i, layer in enumerate(model.layers):
        p = f"{top}layers.{i}."
        attn = layer.attn
        w = attn.qkv_proj.weight.detach()
        if family == "phi3":  # Phi3 keeps them fused, in headcount's row order
            sd[p + "self_attn.qkv_proj.weight"] = w
        else:
            sd[p + "self_attn.q_proj.weight"] = w[: nh * hd]
            sd[p + "self_attn.k_proj.weight"] = w[nh * hd:(nh + nkv) * hd]
            sd[p + "self_attn.v_proj.weight"] = w[(nh + nkv) * hd:]
        b = attn.qkv_proj.bias
        if bias:
            b = b.detach() if b is not None else w.new_zeros(w.shape[0])
            sd[p + "self_attn.q_proj.bias"] = b[: nh * hd]
            sd[p + "self_attn.k_proj.bias"] = b[nh * hd:(nh + nkv) * hd]
            sd[p + "self_attn.v_proj.bias"] = b[(nh + nkv) * hd:]
        if cfg.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = norm(attn.q_norm.weight)
            sd[p + "self_attn.k_norm.weight"] = norm(attn.k_norm.weight)
        sd[p + "self_attn.o_proj.weight"] = attn.o_proj.weight.detach()
        ob = attn.o_proj.bias
        if bias and family != "qwen2":
            sd[p + "self_attn.o_proj.bias"] = ob.detach() if ob is not None else w.new_zeros(cfg.d_model)
        if getattr(attn, "sinks", None) is not None:
            sd[p + "self_attn.sinks"] = attn.sinks.detach()
        if cfg.is_moe_layer(i):
            sd.update(hf_moe.write_layer(layer.mlp, family, p))
            for ours, theirs in norms.items():
                sd[p + theirs + ".weight"] = norm(getattr(layer, ours).weight)
            continue
        gu = layer.mlp.gate_up_proj.weight.detach()
        if family == "phi3":
            sd[p + "mlp.gate_up_proj.weight"] = gu
        else:
            sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = gu[:ff], gu[ff:]
        sd[p + "mlp.down_proj.weight"] = layer.mlp.down_proj.weight.detach()
        if cfg.mlp_bias:
            gub = layer.mlp.gate_up_proj.bias.detach()
            sd[p + "mlp.gate_proj.bias"], sd[p + "mlp.up_proj.bias"] = gub[:ff], gub[ff:]
            sd[p + "mlp.down_proj.bias"] = layer.mlp.down_proj.bias.detach()
        for ours, theirs in norms.items():
            sd[p + theirs + ".weight"] = norm(getattr(layer, ours).weight)
    sd[top + "norm.weight"] = norm(model.norm.weight)
    if cfg.causal and not cfg.tie_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight.detach()
    hf = {
        "architectures": [hf_classes(model)[1]], "model_type": _MODEL_TYPE.get(family, family),
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": ff,
        "max_position_embeddings": cfg.max_position, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id, "torch_dtype": "float32",
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
        if family == "phi3" and cfg.rope_type == "longrope":  # Phi3Config reads it at the top level first
            hf["original_max_position_embeddings"] = cfg.rope_parameters["original_max_position_embeddings"]
    types = [cfg.layer_type(i) for i in range(cfg.n_layers)]
    if family == "gemma2":
        if cfg.embed_scale != cfg.d_model ** 0.5:
            raise ValueError(f"model: embed_scale {cfg.embed_scale} is not sqrt(d_model); Gemma 2 cannot hold it")
        hf.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": _qk_scalar(cfg),
                   "sliding_window": cfg.sliding_window if cfg.sliding_window is not None else 4096,
                   "layer_types": types, "attention_bias": bias, "attn_logit_softcapping": cfg.attn_softcap,
                   "final_logit_softcapping": cfg.final_softcap})
        return hf, sd
    if family == "olmo2":
        hf.update({"hidden_act": "silu", "attention_bias": bias})
        return hf, sd
    if gemma:
        window = cfg.sliding_window
        if window is not None and not cfg.causal:
            window = (window - 1) * 2  # transformers reads it back as window // 2 + 1
        hf.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": _qk_scalar(cfg),
                   "sliding_window": window if window is not None else 4096, "layer_types": types,
                   "rope_local_base_freq": cfg.rope_local_theta if cfg.rope_local_theta is not None else cfg.rope_theta,
                   "attention_bias": bias, "use_bidirectional_attention": not cfg.causal,
                   "final_logit_softcapping": None, "attn_logit_softcapping": None})
        if cfg.embed_scale is not None and cfg.embed_scale != cfg.d_model ** 0.5:
            raise ValueError(f"model: embed_scale {cfg.embed_scale} is not sqrt(d_model); Gemma 3 cannot hold it")
        return hf, sd
    hf["hidden_act"] = "silu"
    if cfg.moe is not None:
        hf.update(hf_moe.config_fields(cfg))
    if family == "olmoe" and nh * hd != cfg.d_model:  # OlmoeAttention sizes q_norm by hidden_size
        raise ValueError(f"model: {nh} query heads x head_dim {hd} != hidden_size {cfg.d_model}; transformers' "
                         "OlmoeForCausalLM sizes its q/k norms by hidden_size, so a pruned OLMoE cannot be written "
                         "as one: keep it in headcount's format (save)")
    if family == "mixtral":
        hf["sliding_window"] = cfg.sliding_window
    elif family == "qwen3_moe":
        hf.update({"attention_bias": bias, "use_sliding_window": cfg.sliding_window is not None,
                   "sliding_window": cfg.sliding_window})
    elif family == "olmoe":
        hf["attention_bias"] = bias
    elif family == "gpt_oss":
        hf.update({"attention_bias": bias, "sliding_window": cfg.sliding_window, "layer_types": types})
    if family in MOE_FAMILIES:  # transformers 5 spelling (GptOssConfig would otherwise default to yarn)
        if "rope_parameters" not in hf:  # (a rope type beyond linear is written above)
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
            if cfg.rope_scaling != 1.0:
                hf["rope_parameters"].update(rope_type="linear", factor=cfg.rope_scaling)
        hf.pop("rope_scaling", None)
        return hf, sd
    if family in ("llama", "smollm3", "granite"):
        hf.update({"attention_bias": bias, "mlp_bias": cfg.mlp_bias})
        if family == "smollm3":
            hf.update({"no_rope_layers": [int(i not in cfg.nope_layers) for i in range(cfg.n_layers)],
                       "layer_types": types, "use_sliding_window": cfg.sliding_window is not None,
                       "sliding_window": cfg.sliding_window})
        if family == "granite":
            hf.update({"embedding_multiplier": cfg.embedding_multiplier, "residual_multiplier": cfg.residual_multiplier,
                       "logits_scaling": cfg.logits_scaling, "attention_multiplier": _granite_scale(cfg)})
    elif family == "phi3":
        if cfg.sliding_window is not None and "full_attention" in types:
            raise ValueError("model: Phi3 applies its sliding window to every layer; this model has full layers")
        hf["sliding_window"] = cfg.sliding_window
    elif family == "mistral":
        if cfg.sliding_window is not None and "full_attention" in types:
            raise ValueError("model: Mistral applies its sliding window to every layer; this model has full layers")
        hf["sliding_window"] = cfg.sliding_window
    else:  # qwen2 / qwen3: sliding windows on the layers layer_types marks
        if cfg.sliding_window is not None:
            first = types.index("sliding_attention")
            hf.update({"use_sliding_window": True, "sliding_window": cfg.sliding_window, "max_window_layers": first})
        else:
            hf.update({"use_sliding_window": False, "sliding_window": None})
        hf["layer_types"] = types
        if family == "qwen3":
            hf["attention_bias"] = bias
    return hf, sd


def _gpt_neox_state_dict(model: Decoder) -> tuple[dict, dict[str, Tensor]]:
    """GPT-NeoX / Pythia: qkv_proj's [all Q | all K | all V] rows written back per head ([n_heads, 3,
    head_dim]). transformers derives head_size = hidden_size / num_attention_heads, so a pruned layer is
    written with every original head: each removed head padded back as a ZERO head (zero q, k, v rows and
    biases, zero dense columns; its context is 0, so the output is exactly the pruned model's)."""
    cfg = model.config
    d, n, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
    bias = any(l.attn.qkv_proj.bias is not None or l.attn.o_proj.bias is not None for l in model.layers)
    sd: dict[str, Tensor] = {"gpt_neox.embed_in.weight": model.embed.weight.detach()}
    for i, layer in enumerate(model.layers):
        attn, p = layer.attn, f"gpt_neox.layers.{i}."
        if attn.n_kv_heads != attn.n_heads or not attn.is_uniform:
            raise ValueError(f"model: layer {i} shares K/V heads ({attn.n_heads} query, {attn.n_kv_heads} KV); "
                             "GPT-NeoX in transformers has one K/V head per query head")
        k, kept = attn.n_heads, torch.tensor(attn.kept_heads)
        w = attn.qkv_proj.weight.detach()
        full = w.new_zeros(n, 3, hd, d)
        full[kept] = w.view(3, k, hd, d).transpose(0, 1)
        sd[p + "attention.query_key_value.weight"] = full.reshape(3 * n * hd, d)
        o = w.new_zeros(d, n, hd)
        o[:, kept] = attn.o_proj.weight.detach().view(d, k, hd)
        sd[p + "attention.dense.weight"] = o.reshape(d, n * hd)
        if bias:
            b = attn.qkv_proj.bias
            full_b = w.new_zeros(n, 3, hd)
            if b is not None:
                full_b[kept] = b.detach().view(3, k, hd).transpose(0, 1)
            sd[p + "attention.query_key_value.bias"] = full_b.reshape(-1)
            ob = attn.o_proj.bias
            sd[p + "attention.dense.bias"] = ob.detach() if ob is not None else w.new_zeros(d)
        for ours, theirs in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            sd[p + theirs + ".weight"] = getattr(layer, ours).weight.detach()
            sd[p + theirs + ".bias"] = getattr(layer, ours).bias.detach()
        for ours, theirs in (("up_proj", "dense_h_to_4h"), ("down_proj", "dense_4h_to_h")):
            sd[p + f"mlp.{theirs}.weight"] = getattr(layer.mlp, ours).weight.detach()
            sd[p + f"mlp.{theirs}.bias"] = getattr(layer.mlp, ours).bias.detach()
    sd["gpt_neox.final_layer_norm.weight"] = model.norm.weight.detach()
    sd["gpt_neox.final_layer_norm.bias"] = model.norm.bias.detach()
    if not cfg.tie_embeddings:
        sd["embed_out.weight"] = model.lm_head.weight.detach()  # Pythia's name (transformers 5 renames it)
    rd = cfg.rotary_dim or hd
    pct = rd / hd if int(hd * (rd / hd)) == rd else (rd + 0.5) / hd  # transformers takes int(head_dim * pct)
    rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **(cfg.rope_parameters or {}),
            "partial_rotary_factor": pct}
    if cfg.rope_scaling != 1.0:
        rope.update(rope_type="linear", factor=cfg.rope_scaling)
    hf = {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": cfg.vocab_size,
        "hidden_size": d, "num_hidden_layers": cfg.n_layers, "num_attention_heads": n, "intermediate_size": cfg.d_ff,
        "hidden_act": "gelu" if cfg.mlp == "gelu" else "gelu_new", "max_position_embeddings": cfg.max_position,
        "layer_norm_eps": cfg.norm_eps, "use_parallel_residual": cfg.parallel_residual, "rope_parameters": rope,
        "rotary_pct": pct, "rotary_emb_base": cfg.rope_theta, "attention_bias": bias,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id, "torch_dtype": "float32",
    }
    return hf, sd


def to_transformers(model: Decoder | BidirectionalEncoder, *, attn_implementation: str = "sdpa"):
    """The transformers model (LlamaForCausalLM, MistralForCausalLM, Qwen2/Qwen3ForCausalLM,
    Gemma3ForCausalLM, or Gemma3TextModel for a bidirectional Gemma) with this model's weights (needs
    the transformers package): the reference the tests and `headcount bench decode / exactness` compare
    against."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config and our weights: never the hub
    try:
        import transformers
    except ImportError:
        raise ImportError("comparing against transformers needs it: pip install transformers") from None
    hf_cfg, sd = to_transformers_state_dict(model)
    cfg_name, model_name = hf_classes(model)
    cfg = getattr(transformers, cfg_name)(
        **{k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    # Gemma 2's soft-capping runs on transformers' eager path only (Gemma2PreTrainedModel._supports_sdpa is False)
    cfg._attn_implementation = "eager" if model.config.attn_softcap is not None else attn_implementation
    hf = getattr(transformers, model_name)(cfg).to(model.embed.weight.dtype)
    sd = {("lm_head.weight" if k == "embed_out.weight" else k): v for k, v in sd.items()}  # GPT-NeoX in transformers 5
    missing, unexpected = hf.load_state_dict({k: v.clone() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"to_transformers: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings and hasattr(hf, "tie_weights"):
        hf.tie_weights()
    return hf.eval()


# export_transformers: a checkpoint of a (pruned) model that transformers loads with no headcount code.
# export_transformers: a plain transformers checkpoint that loads with no headcount code.
#   Llama (LlamaForCausalLM; the same for Mistral, Qwen2, Qwen3 and Gemma 3): every layer must keep the same numbers of query and KV heads, in even
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


def decoder_state_dict(model) -> tuple[dict, dict[str, Tensor]]:
    """(config.json dict, state dict) of a (pruned) llama / mistral / qwen2 / qwen3 / gemma3 model with
    uniform layers: what export_transformers writes."""
    if not isinstance(model, (Decoder, BidirectionalEncoder)) or model.config.family not in HF_CLASSES:
        raise ValueError(f"model: export_transformers writes {' / '.join(HF_CLASSES)} decoders and BERT encoders; "
                         f"this is {type(model).__name__} ({getattr(model.config, 'family', '?')})")
    if model.config.family == "gpt_neox":  # removed heads are padded back as zero heads: any pattern is written
        hf, sd = to_transformers_state_dict(model)
        hf["dtype"] = "float32"
        return hf, sd
    cfg = model.config
    if cfg.family == "phi3" and cfg.rope_type == "longrope":
        return _phi3_longrope_state_dict(model)
    if cfg.family == "olmoe" and any(layer.attn.n_heads * cfg.head_dim != cfg.d_model for layer in model.layers):
        raise ValueError("model: query heads removed from an OLMoE, which transformers' OlmoeAttention cannot hold: "
                         "one num_attention_heads for every layer, and OlmoeForCausalLM sizes its q/k norms by hidden_size "
                         "(k_norm by hidden_size // num_attention_heads x num_key_value_heads), not by the heads kept; "
                         "zero heads would enter those full-width norms' statistics. Keep it in headcount's format "
                         "(save), or reduce K/V heads only (merge-kv)")
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
    nh = lay[0][0]
    if cfg.d_model % nh:
        raise ValueError(f"model: {nh} query heads per layer; transformers' LlamaConfig requires hidden_size "
                         f"({cfg.d_model}) to be a multiple of num_attention_heads")
    hf, sd = to_transformers_state_dict(model)
    hf["dtype"] = "float32"
    return hf, sd


def _phi3_longrope_state_dict(model) -> tuple[dict, dict[str, Tensor]]:
    """Phi-3 with LongRoPE: Phi3Config.validate_rope sizes short_factor / long_factor by
    hidden_size // num_attention_heads (not head_dim), so the file keeps num_attention_heads = hidden_size //
    head_dim and the model's KV count, every removed head written as a zero head (hf_padding.py: exact)."""
    from headcount.models.formats.hf_padding import write_padded

    cfg = model.config
    if cfg.d_model % cfg.head_dim:
        raise ValueError(f"model: hidden_size {cfg.d_model} is not a multiple of head_dim {cfg.head_dim}; transformers' "
                         "Phi3Config sizes LongRoPE's factor lists by hidden_size // num_attention_heads")
    n_q, n_kv = cfg.d_model // cfg.head_dim, max(layer.attn.n_kv_heads for layer in model.layers)
    if n_q % n_kv:
        raise ValueError(f"model: {n_kv} KV heads do not divide the {n_q} query heads (hidden_size // head_dim) that "
                         "transformers' Phi3Config needs with LongRoPE")
    hf, sd = to_transformers_state_dict(model)
    for i, layer in enumerate(model.layers):
        write_padded(sd, f"model.layers.{i}.self_attn.", layer.attn, n_q, n_kv, fused=True, bias=False)
    hf.update({"num_attention_heads": n_q, "num_key_value_heads": n_kv, "dtype": "float32"})
    return hf, sd


llama_state_dict = decoder_state_dict  # the name it had when only Llama was written


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
    LlamaForCausalLM (Mistral / Qwen2 / Qwen3 / Gemma3ForCausalLM, Gemma3TextModel) or
    BertModel.from_pretrained loads with no headcount code (see the notes above)."""
    from headcount.models.encoder import Encoder

    directory = Path(directory).expanduser()
    check_out(directory, force)
    hf, sd = bert_state_dict(model) if isinstance(model, Encoder) else decoder_state_dict(model)
    files: dict[str, object] = {"config.json": hf, "model.safetensors": sd}
    writer = tokenizer_writer(model)
    if writer is not None:
        files["tokenizer.json"] = writer
    if (template := chat_template_writer(model)) is not None:
        files["chat_template.jinja"] = template
    return write_dir(directory, files)
