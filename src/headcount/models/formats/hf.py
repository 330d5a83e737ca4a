"""transformers checkpoints <-> headcount models: the reader and the writer of one format.

Read: every model_type of families.py's table (hf_config.SUPPORTED): bert (BertModel, and Bert* heads: only
the encoder is kept), gpt2, llama, qwen2, qwen3, mistral, gemma3_text (with use_bidirectional_attention a
BidirectionalEncoder) and gemma3 (the language model of Gemma3ForConditionalGeneration: the vision tower and
projector are not read), mixtral, qwen3_moe, olmoe, gpt_oss (expert tensors in hf_moe.py), phi3, smollm3,
granite, gemma2, gpt_neox and olmo2.
Written (to_transformers_state_dict, to_transformers, export_transformers): every family whose entry names
transformers classes, i.e. all of those but gpt2: BertModel, LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM (Gemma3TextModel for a bidirectional one),
MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, GptOssForCausalLM, Phi3ForCausalLM,
SmolLM3ForCausalLM, GraniteForCausalLM, Gemma2ForCausalLM, GPTNeoXForCausalLM and Olmo2ForCausalLM.

Reader and writer walk the same Family entry (families.py): the reader maps each transformers name to
headcount's, the writer inverts the map. What the entries describe:
- q_proj / k_proj / v_proj become one fused `qkv_proj` by concatenation along the output dimension: rows
  [all Q heads | all K heads | all V heads], each head head_dim contiguous rows, which is how transformers
  lays out each projection. A fused qkv is either in that order already (Phi-3's qkv_proj, GPT-2's c_attn)
  or per head ([n_heads, 3, head_dim]: GPT-NeoX's query_key_value) and reordered.
- gate_proj / up_proj become one `gate_up_proj` (rows [gate | up]); Phi-3's gate_up_proj is that already.
- GPT-2's Conv1D stores weights as [in, out]: they are transposed.
- Gemma's RMSNorms multiply by (1 + w) (in float32); headcount's multiply by a plain weight, so the reader
  stores 1 + w (computed in float32, as Gemma does) and the writer subtracts 1: every norm of a block, the
  final norm and the per-head q_norm / k_norm.
- Where transformers sizes heads by hidden_size / num_attention_heads (BERT, GPT-NeoX), a pruned layer is
  written with every original head, each removed one a ZERO head (zero q, k, v rows and biases, zero o_proj
  columns; its context is 0, so the output is exactly the pruned model's).

Three entry points, one path:
  from_transformers(hf_model)            a live transformers model (config + state_dict)
  load_checkpoint(directory)             config.json + model.safetensors (or shards, or a
                                         pytorch_model.bin read with weights_only=True)
  from_state_dict(config, tensors, ...)  a config dict and a name -> tensor mapping

Every error names the file and, where one is at fault, the tensor. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

import torch

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.dropped import NO_TRANSFORMERS, refuse_dropped
from headcount.models.encoder import BidirectionalEncoder, Encoder, EncoderConfig
from headcount.models.formats import hf_moe
from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.families import BY_MODEL_TYPE, FAMILIES, Family
from headcount.models.formats.hf_config import decoder_config, encoder_config, model_type, read_config
from headcount.models.formats.hf_config_write import transformers_config
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


class _Dims(NamedTuple):
    """What a layer's tensor shapes and optional tensors depend on, from either config."""
    d: int
    nh: int
    nkv: int
    hd: int
    ff: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    qk_norm_full: bool
    sinks: bool
    gated: bool


def _dims(cfg: DecoderConfig | EncoderConfig) -> _Dims:
    if isinstance(cfg, EncoderConfig):  # BERT: MHA, biases everywhere, a plain GELU MLP
        hd = cfg.d_model // cfg.n_heads
        return _Dims(cfg.d_model, cfg.n_heads, cfg.n_heads, hd, cfg.d_ff, True, True, True, False, False, False, False)
    return _Dims(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.qkv_bias, cfg.o_bias,
                 cfg.mlp_bias, cfg.qk_norm, cfg.qk_norm_full, cfg.attn_sinks, cfg.mlp.startswith("gated"))


def _is_moe_layer(cfg, i: int) -> bool:
    return isinstance(cfg, DecoderConfig) and cfg.is_moe_layer(i)


def _gemma_weight(w: Tensor) -> Tensor:
    """Gemma's RMSNorm weight w -> the plain weight 1 + w (float32, as Gemma computes it)."""
    return 1.0 + w.float()


def _same(w: Tensor) -> Tensor:
    return w


# ------------------------------------------------------------------------------------------ reading
def _read(fam: Family, t: _Tensors, name: str, shape: tuple[int, ...], why: str = "") -> Tensor:
    """One tensor in nn.Linear's [out, in] (GPT-2's Conv1D weights are stored [in, out])."""
    if fam.conv1d and len(shape) == 2:
        return t.get(name, shape[::-1], why).t()
    return t.get(name, shape, why)


def _read_qkv(fam: Family, t: _Tensors, h: str, x: _Dims, suffix: str, heads: str) -> Tensor:
    """qkv_proj's weight (suffix ".weight") or bias (".bias") in headcount's rows [all Q | all K | all V]."""
    q, kv = x.nh * x.hd, x.nkv * x.hd
    rest = (x.d,) if suffix == ".weight" else ()
    if len(fam.qkv) == 3:
        return torch.cat([_read(fam, t, h + name + suffix, (rows, *rest), heads)
                          for name, rows in zip(fam.qkv, (q, kv, kv))])
    w = _read(fam, t, h + fam.qkv[0] + suffix, (q + 2 * kv, *rest), heads)
    if fam.qkv_layout == "per_head":  # [n_heads, 3, head_dim] -> [3, n_heads, head_dim]
        w = w.reshape(x.nh, 3, x.hd, *rest).transpose(0, 1).reshape(q + 2 * kv, *rest)
    return w


def _read_mlp_in(fam: Family, t: _Tensors, h: str, x: _Dims, suffix: str) -> Tensor:
    """gate_up_proj (rows [gate | up]) or up_proj: weight or bias."""
    rest = (x.d,) if suffix == ".weight" else ()
    why = f"intermediate_size={x.ff}"
    if x.gated and len(fam.mlp_in) == 1:  # fused already, in headcount's row order
        return _read(fam, t, h + fam.mlp_in[0] + suffix, (2 * x.ff, *rest), f"2 x {why}")
    return torch.cat([_read(fam, t, h + name + suffix, (x.ff, *rest), why) for name in fam.mlp_in])


def _layer_values(fam: Family, cfg, t: _Tensors, i: int, norm) -> Iterator[tuple[str, Tensor]]:
    """(headcount name, tensor) pairs of layer i, read by the names of the family's entry."""
    x = _dims(cfg)
    h, o = fam.layer.format(i=i), f"layers.{i}."
    heads = f"d_model={x.d}, n_heads={x.nh}, n_kv_heads={x.nkv}, head_dim={x.hd}"
    for ours, theirs in fam.norms.items():
        yield o + ours + ".weight", norm(t.get(h + theirs + ".weight", (x.d,)))
        if fam.norm_bias:
            yield o + ours + ".bias", t.get(h + theirs + ".bias", (x.d,))
    yield o + "attn.qkv_proj.weight", _read_qkv(fam, t, h, x, ".weight", heads)
    if x.qkv_bias:
        yield o + "attn.qkv_proj.bias", _read_qkv(fam, t, h, x, ".bias", heads)
    q_norm, k_norm = (h + n + ".weight" for n in fam.qk_norms)
    if x.qk_norm_full:  # OLMo 2, OLMoE: one norm over the whole projection
        yield o + "attn.q_norm.weight", t.get(q_norm, (x.nh * x.hd,), heads)
        yield o + "attn.k_norm.weight", t.get(k_norm, (x.nkv * x.hd,), heads)
    elif x.qk_norm:
        yield o + "attn.q_norm.weight", norm(t.get(q_norm, (x.hd,), f"head_dim={x.hd}"))
        yield o + "attn.k_norm.weight", norm(t.get(k_norm, (x.hd,), f"head_dim={x.hd}"))
    yield o + "attn.o_proj.weight", _read(fam, t, h + fam.o_proj + ".weight", (x.d, x.nh * x.hd), heads)
    if x.o_bias:
        yield o + "attn.o_proj.bias", t.get(h + fam.o_proj + ".bias", (x.d,))
    if x.sinks:
        yield o + "attn.sinks", t.get(h + fam.sinks, (x.nh,), heads)
    if _is_moe_layer(cfg, i):
        yield from hf_moe.read_layer(cfg, t, i)
        return
    mlp_in = "mlp.gate_up_proj" if x.gated else "mlp.up_proj"
    yield o + mlp_in + ".weight", _read_mlp_in(fam, t, h, x, ".weight")
    if x.mlp_bias:
        yield o + mlp_in + ".bias", _read_mlp_in(fam, t, h, x, ".bias")
    yield o + "mlp.down_proj.weight", _read(fam, t, h + fam.mlp_out + ".weight", (x.d, x.ff),
                                            f"intermediate_size={x.ff}")
    if x.mlp_bias:
        yield o + "mlp.down_proj.bias", t.get(h + fam.mlp_out + ".bias", (x.d,))


def _decoder_values(cfg: DecoderConfig, t: _Tensors, *, lm_head: bool = True) -> Iterator[tuple[str, Tensor]]:
    """(headcount name, tensor) pairs, produced one at a time: with a lazy reader (SafetensorsFile) loading
    holds the model plus the few source tensors of one value, never a second copy of the weights."""
    fam, d = FAMILIES[cfg.family], cfg.d_model
    norm = _gemma_weight if fam.one_plus_norms else _same
    yield "embed.weight", t.get(fam.embed, (cfg.vocab_size, d), "vocab_size x hidden_size")
    if fam.pos_embed is not None:
        yield "pos_embed.weight", t.get(fam.pos_embed, (cfg.max_position, d), "max_position_embeddings x hidden_size")
    for i in range(cfg.n_layers):
        yield from _layer_values(fam, cfg, t, i, norm)
    yield "norm.weight", norm(t.get(fam.final_norm + ".weight", (d,)))
    if fam.norm_bias:
        yield "norm.bias", t.get(fam.final_norm + ".bias", (d,))
    if lm_head and not cfg.tie_embeddings:
        yield "lm_head.weight", _lm_head(cfg, t, fam.lm_head)


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


def _encoder_values(cfg: EncoderConfig, t: _Tensors) -> Iterator[tuple[str, Tensor]]:
    fam, d = FAMILIES["bert"], cfg.d_model
    yield "embed.weight", t.get(fam.embed, (cfg.vocab_size, d), "vocab_size x hidden_size")
    yield "pos_embed.weight", t.get(fam.pos_embed, (cfg.max_position, d))
    shapes = {"type_embed.weight": (cfg.type_vocab_size, d), "embed_norm.weight": (d,), "embed_norm.bias": (d,)}
    if cfg.pooler:
        shapes.update({"pooler.weight": (d, d), "pooler.bias": (d,)})
    for ours, shape in shapes.items():
        yield ours, t.get(fam.extra[ours], shape)
    for i in range(cfg.n_layers):
        yield from _layer_values(fam, cfg, t, i, _same)


_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def from_state_dict(cfg: dict, tensors: Mapping[str, Tensor], *, source: str = "state_dict",
                    dtype: torch.dtype = torch.float32) -> Decoder | Encoder | BidirectionalEncoder:
    """A transformers config dict and name -> tensor mapping -> a headcount Decoder or Encoder
    (a BidirectionalEncoder for a gemma3_text config with use_bidirectional_attention)."""
    kind = model_type(cfg, source)
    fam = BY_MODEL_TYPE[kind]
    if fam.encoder:
        ecfg = encoder_config(cfg, source)
        t = _Tensors(tensors, source, (fam.prefix, ""))
        ecfg.pooler = t.has(fam.extra["pooler.weight"])
        with no_init():
            model = Encoder(ecfg, dtype=dtype)
        values = _encoder_values(ecfg, t)
    else:
        dcfg = decoder_config(cfg, source)
        prefixes = (fam.prefix, "")
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
    """A live transformers model of any family the reader knows (the module docstring) -> the headcount model
    with the same weights (copied: the two stay independent)."""
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
# family -> (transformers config class, model class): the decoders to_transformers builds and config.json names
HF_CLASSES = {name: f.classes for name, f in FAMILIES.items() if f.classes is not None and not f.encoder}


def hf_classes(model) -> tuple[str, str]:
    """(config class, model class) names in transformers for this headcount model."""
    fam = FAMILIES.get(model.config.family)
    if fam is None or fam.classes is None:
        writes = ", ".join(name for name, f in FAMILIES.items() if f.classes is not None)
        raise ValueError(f"to_transformers: writes {writes}, not {model.config.family!r}")
    cfg_cls, model_cls = fam.classes
    if not getattr(model.config, "causal", True) and fam.bidirectional_class is not None:
        return cfg_cls, fam.bidirectional_class
    return cfg_cls, model_cls


def _attention_biases(model, fam: Family, model_cls: str) -> bool:
    """Whether the checkpoint carries attention biases. A `switch` family (one attention_bias for q, k, v and
    o) gets them when any layer has one (an lstsq refit or mean compensation gives o_proj one; the rest are
    written as zeros); `qkv` (Qwen2) always has q/k/v biases and no o bias; `none` (Mistral, Mixtral, Phi-3)
    has none: a bias the family cannot hold is refused."""
    qkv = any(layer.attn.qkv_proj.bias is not None for layer in model.layers)
    o = any(layer.attn.o_proj.bias is not None for layer in model.layers)
    if fam.attention_bias == "none" and (qkv or o):
        raise ValueError(f"model: a {fam.name} checkpoint has no attention biases, and this model has some "
                         f"(compensation adds an o_proj bias): transformers' {model_cls} cannot hold them")
    if fam.attention_bias == "qkv" and o:
        raise ValueError(f"model: a {fam.name} checkpoint has no o_proj bias, and this model has one (compensation "
                         f"adds it): transformers' {model_cls} cannot hold it")
    return {"switch": qkv or o, "qkv": True, "none": False, "always": True}[fam.attention_bias]


def _zero_padded(attn, i: int, n: int, hd: int, model_cls: str) -> tuple[Tensor, Tensor | None, Tensor]:
    """(qkv rows [3 n hd, d], its bias or None, o_proj [d, n hd]) with every one of the layer's n original heads:
    kept heads at their places, removed ones zero."""
    if attn.n_kv_heads != attn.n_heads or not attn.is_uniform:
        raise ValueError(f"model: layer {i} shares K/V heads ({attn.n_heads} query, {attn.n_kv_heads} KV); "
                         f"{model_cls} in transformers has one K/V head per query head")
    k, kept = attn.n_heads, torch.tensor(attn.kept_heads)
    w = attn.qkv_proj.weight.detach()
    d = w.shape[1]
    full = w.new_zeros(3, n, hd, d)
    full[:, kept] = w.view(3, k, hd, d)
    b = attn.qkv_proj.bias
    full_b = None
    if b is not None:
        full_b = w.new_zeros(3, n, hd)
        full_b[:, kept] = b.detach().view(3, k, hd)
        full_b = full_b.reshape(-1)
    o = w.new_zeros(d, n, hd)
    o[:, kept] = attn.o_proj.weight.detach().view(d, k, hd)
    return full.reshape(3 * n * hd, d), full_b, o.reshape(d, n * hd)


def _put_qkv(sd: dict, fam: Family, h: str, suffix: str, rows: Tensor, nh: int, nkv: int, hd: int) -> None:
    """headcount's qkv rows [all Q | all K | all V] (weight or bias) under the family's name(s)."""
    if len(fam.qkv) == 3:
        for name, part in zip(fam.qkv, rows.split([nh * hd, nkv * hd, nkv * hd])):
            sd[h + name + suffix] = part
        return
    if fam.qkv_layout == "per_head":  # [3, n_heads, head_dim] -> [n_heads, 3, head_dim]
        rest = rows.shape[1:]
        rows = rows.reshape(3, nh, hd, *rest).transpose(0, 1).reshape(3 * nh * hd, *rest)
    sd[h + fam.qkv[0] + suffix] = rows


def _layer_tensors(fam: Family, model, i: int, h: str, bias: bool, norm, model_cls: str) -> dict[str, Tensor]:
    """Layer i's tensors under the family's names (h: the layer's prefix)."""
    cfg, layer = model.config, model.layers[i]
    attn, x = layer.attn, _dims(cfg)
    if fam.zero_heads:
        nh = nkv = cfg.n_heads
        qkv, qkv_b, o = _zero_padded(attn, i, nh, x.hd, model_cls)
    else:  # head counts from the modules (a pruned or merged model's config keeps the original counts)
        nh, nkv = attn.n_heads, attn.n_kv_heads
        qkv, o = attn.qkv_proj.weight.detach(), attn.o_proj.weight.detach()
        qkv_b = attn.qkv_proj.bias.detach() if attn.qkv_proj.bias is not None else None
    sd: dict[str, Tensor] = {}
    _put_qkv(sd, fam, h, ".weight", qkv, nh, nkv, x.hd)
    if bias:
        _put_qkv(sd, fam, h, ".bias", qkv_b if qkv_b is not None else qkv.new_zeros(qkv.shape[0]), nh, nkv, x.hd)
    if x.qk_norm:
        sd[h + fam.qk_norms[0] + ".weight"] = norm(attn.q_norm.weight)
        sd[h + fam.qk_norms[1] + ".weight"] = norm(attn.k_norm.weight)
    sd[h + fam.o_proj + ".weight"] = o
    if bias and fam.attention_bias != "qkv":
        ob = attn.o_proj.bias
        sd[h + fam.o_proj + ".bias"] = ob.detach() if ob is not None else qkv.new_zeros(x.d)
    if getattr(attn, "sinks", None) is not None:
        sd[h + fam.sinks] = attn.sinks.detach()
    for ours, theirs in fam.norms.items():
        sd[h + theirs + ".weight"] = norm(getattr(layer, ours).weight)
        if fam.norm_bias:
            sd[h + theirs + ".bias"] = getattr(layer, ours).bias.detach()
    if _is_moe_layer(cfg, i):
        sd.update(hf_moe.write_layer(layer.mlp, fam.name, h))
        return sd
    mlp = layer.mlp
    up = mlp.gate_up_proj if x.gated else mlp.up_proj
    mlp_bias = fam.mlp_bias == "always" or x.mlp_bias
    for suffix in (".weight", ".bias") if mlp_bias else (".weight",):
        w = getattr(up, suffix[1:])
        w = w.detach() if w is not None else up.weight.new_zeros(up.weight.shape[0])
        parts = w.split(x.ff) if len(fam.mlp_in) == 2 else (w,)
        for name, part in zip(fam.mlp_in, parts):
            sd[h + name + suffix] = part
        down = getattr(mlp.down_proj, suffix[1:])
        sd[h + fam.mlp_out + suffix] = down.detach() if down is not None else w.new_zeros(x.d)
    return sd


def to_transformers_state_dict(model: Decoder | BidirectionalEncoder | Encoder) -> tuple[dict, dict[str, Tensor]]:
    """(config dict, state dict) in transformers' layout for every family families.py names classes for (see
    the module docstring): the inverse of the reader, used to write the SmolLM2 cache as an ordinary checkpoint,
    to export, and to build the reference model in tests. Decoders are written with layer 0's head counts (the
    caller checks that every layer has them, in even groups); BERT and GPT-NeoX with zero heads."""
    cfg = model.config
    cfg_cls, model_cls = hf_classes(model)  # refuses other families
    refuse_dropped(model, f"transformers' {model_cls} {NO_TRANSFORMERS}")
    fam = FAMILIES[cfg.family]
    bias = _attention_biases(model, fam, model_cls)
    if _dims(cfg).mlp_bias and fam.mlp_bias == "none":
        raise ValueError(f"model: MLP biases; transformers' {fam.name} has none")

    def norm(w: Tensor) -> Tensor:
        w = w.detach()
        return (w.float() - 1.0).to(w.dtype) if fam.one_plus_norms else w

    causal = getattr(cfg, "causal", False)
    top = fam.prefix if causal else ""  # BertModel, Gemma3TextModel: no prefix
    sd: dict[str, Tensor] = {top + fam.embed: model.embed.weight.detach()}
    if fam.pos_embed is not None:
        sd[top + fam.pos_embed] = model.pos_embed.weight.detach()
    for ours, theirs in fam.extra.items():  # BERT's token types, embedding norm and pooler
        module, _, param = ours.rpartition(".")
        if getattr(model, module, None) is not None:
            sd[top + theirs] = getattr(getattr(model, module), param).detach()
    for i in range(len(model.layers)):
        sd.update(_layer_tensors(fam, model, i, top + fam.layer.format(i=i), bias, norm, model_cls))
    if fam.final_norm is not None:
        sd[top + fam.final_norm + ".weight"] = norm(model.norm.weight)
        if fam.norm_bias:
            sd[top + fam.final_norm + ".bias"] = model.norm.bias.detach()
    if causal and not cfg.tie_embeddings:
        sd[fam.lm_head[0]] = model.lm_head.weight.detach()
    attn = model.layers[0].attn
    nh, nkv = (cfg.n_heads, cfg.n_heads) if fam.zero_heads else (attn.n_heads, attn.n_kv_heads)
    return transformers_config(cfg, fam, (cfg_cls, model_cls), nh, nkv, bias), sd


def to_transformers(model: Decoder | BidirectionalEncoder | Encoder, *, attn_implementation: str = "sdpa"):
    """The transformers model of this model's family (hf_classes: its *ForCausalLM, Gemma3TextModel for a
    bidirectional Gemma, BertModel) with this model's weights (needs the transformers package): the reference
    the tests and `headcount bench decode / exactness` compare against."""
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
    cfg._attn_implementation = "eager" if getattr(model.config, "attn_softcap", None) is not None else attn_implementation
    hf = getattr(transformers, model_name)(cfg).to(model.embed.weight.dtype)
    sd = {("lm_head.weight" if k == "embed_out.weight" else k): v for k, v in sd.items()}  # GPT-NeoX in transformers 5
    missing, unexpected = hf.load_state_dict({k: v.clone() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"to_transformers: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings and hasattr(hf, "tie_weights"):
        hf.tie_weights()
    return hf.eval()


# export_transformers: a plain transformers checkpoint of a (pruned) model that loads with no headcount code.
#   The rotary decoders (LlamaForCausalLM and every *ForCausalLM of hf_classes but GPT-NeoX's): every layer must
#     keep the same numbers of query and KV heads, in even
#     groups (kv_head_of[i] == i // (n_heads // n_kv_heads)); head_dim stays 64, written explicitly
#     (transformers honours `head_dim`, so num_attention_heads * head_dim may differ from hidden_size).
#     transformers' LlamaConfig also insists hidden_size % num_attention_heads == 0 (checked at load), so
#     a count that does not divide hidden_size is refused. A compensated o_proj bias is carried with
#     attention_bias=True (transformers then gives q/k/v biases too: written as zeros, exact).
#     Per-layer counts: transformers 5.x `per_layer_config` is accepted by LlamaConfig but
#     LlamaAttention reads the global num_attention_heads (checked on 5.24: every layer is built with
#     the global count), so it cannot carry them; refused with the reason.
#   Phi-3 with LongRoPE: written with zero heads (hf_padding.py), any per-layer pattern. OLMoE: only K/V heads
#     may go (OlmoeForCausalLM sizes its q/k norms by hidden_size).
#   BERT (BertModel) and GPT-NeoX: transformers derives the head size as hidden_size / num_attention_heads, so a
#     pruned layer cannot be written with fewer heads. Removed heads are padded back as ZERO heads
#     (zero Q/K/V rows and biases, zero o_proj columns): their context is 0 (V = 0), so the output is
#     exactly the pruned model's. Works for any per-layer pattern; the file is not smaller.
def _layouts(model) -> list[tuple[int, int, bool]]:
    return [(l.attn.n_heads, l.attn.n_kv_heads, l.attn.is_uniform) for l in model.layers]


def decoder_state_dict(model) -> tuple[dict, dict[str, Tensor]]:
    """(config.json dict, state dict) of a (pruned) decoder of any family in HF_CLASSES (the rotary ones with
    uniform layers, see the notes above): what export_transformers writes."""
    if not isinstance(model, (Decoder, BidirectionalEncoder)) or model.config.family not in HF_CLASSES:
        raise ValueError(f"model: export_transformers writes {' / '.join(HF_CLASSES)} decoders and BERT encoders; "
                         f"this is {type(model).__name__} ({getattr(model.config, 'family', '?')})")
    refuse_dropped(model, f"transformers' {hf_classes(model)[1]} {NO_TRANSFORMERS}")
    if FAMILIES[model.config.family].zero_heads:  # removed heads are padded back as zero heads: any pattern
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
    hf, sd = to_transformers_state_dict(model)
    hf["dtype"] = "float32"
    return hf, sd


def export_transformers(model, directory, *, force: bool = False) -> Path:
    """Write a transformers checkpoint (config.json, model.safetensors, tokenizer.json) that the family's
    class (hf_classes: its *ForCausalLM, Gemma3TextModel, BertModel).from_pretrained loads with no headcount
    code (see the notes above)."""
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
