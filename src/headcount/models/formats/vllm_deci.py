"""What vLLM serves: the writer (`export_vllm`) and the reader (`read_deci`) of one format.

vLLM builds every layer of a Llama-like model with ONE query-head count and ONE K/V-head count
(`LlamaAttention(num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads)`), so:

- a model whose layers all keep the same counts in even groups is written as its family's own transformers
  checkpoint (hf.export_transformers: LlamaForCausalLM, Qwen2ForCausalLM, ...), which vLLM reads as it is;
- a model whose layers keep different K/V-head counts (`merge-kv` of some layers) is written as vLLM's
  Nemotron-NAS architecture (vllm/model_executor/models/nemotron_nas.py, `DeciLMForCausalLM`): one
  `num_attention_heads`, and per layer `block_configs[i].attention.n_heads_in_group`, from which vLLM takes
  num_kv_heads = num_attention_heads // n_heads_in_group. vLLM reads each block config as an OBJECT
  (`block_config.attention.no_op`), so the directory carries the configuration code (configuration_decilm.py,
  a LlamaConfig subclass whose block configs are dataclasses) that `trust_remote_code=True` loads; config.json's
  auto_map points AutoConfig at it.

DeciLM's block is Llama's (RMSNorm, rotary, SwiGLU), with q/k/v biases when `qkv_bias` (Qwen2) and an o_proj
bias when `attention_bias`, so the llama and qwen2 families fit. What vLLM cannot hold is refused before anything
is written, in one line naming what vLLM lacks and the closest form that works: per-layer QUERY-head counts (vLLM's
DeciLM has one num_attention_heads), K/V counts that do not divide the query heads, uneven group sizes, sliding
windows, other families. Query heads are reordered (their q rows and o_proj columns together: exact) where a
prune left groups of equal size out of order.

A layer whose attention was dropped (drop-attention) is a block with `attention: {no_op: true}`: vLLM builds no
self_attn, no input_layernorm and no K/V cache for it, and passes the residual to the block's MLP (its
DeciLMDecoderLayer.forward), which is headcount's attention-free layer. The file has no self_attn / input_layernorm
tensors for it. vLLM's forward takes the residual from the first block's attention, so a model whose layer 0 is
attention-free is refused (its first MLP would get no residual).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch

from headcount.models.dropped import dropped_layers
from headcount.models.formats.errors import CheckpointError

Tensor = torch.Tensor

DECI_FAMILIES = ("llama", "qwen2")  # what DeciLM's block (Llama attention, RMSNorm, SwiGLU, optional qkv bias) is
REMOTE_CODE_FILE = "configuration_decilm.py"

# The configuration code `trust_remote_code=True` runs: a LlamaConfig whose block configs are objects with the
# attributes nemotron_nas.py reads (attention.no_op / n_heads_in_group, ffn.no_op / intermediate_size; no ffn_mult:
# vLLM takes ffn_mult when the attribute exists).
REMOTE_CODE = '''"""DeciLM / Nemotron-NAS configuration written by headcount: per-layer K/V head counts for vLLM."""

from dataclasses import asdict, dataclass

from transformers import LlamaConfig


@dataclass
class AttentionConfig:
    no_op: bool = False
    replace_with_linear: bool = False
    n_heads_in_group: int = 1  # num_kv_heads = num_attention_heads // n_heads_in_group


@dataclass
class FFNConfig:
    no_op: bool = False
    replace_with_linear: bool = False
    intermediate_size: int = 0


@dataclass
class BlockConfig:
    attention: AttentionConfig
    ffn: FFNConfig

    @classmethod
    def from_dict(cls, d):
        return cls(attention=AttentionConfig(**d["attention"]), ffn=FFNConfig(**d["ffn"]))


class DeciLMConfig(LlamaConfig):
    model_type = "nemotron-nas"

    def __init__(self, block_configs=None, **kwargs):
        self.block_configs = [b if isinstance(b, BlockConfig) else BlockConfig.from_dict(b)
                              for b in (block_configs or [])]
        super().__init__(**kwargs)

    def to_dict(self):
        out = super().to_dict()
        out["block_configs"] = [asdict(b) for b in self.block_configs]
        return out
'''


class VllmExportError(ValueError):
    """An edit vLLM cannot hold: one line naming what vLLM lacks and the closest form that works."""


def _counts(model) -> list[tuple[int, int]]:
    """(n_heads, n_kv_heads) per layer; (0, 0) where the attention was dropped."""
    return [(layer.attn.n_heads, layer.attn.n_kv_heads) for layer in model.layers]


@contextmanager
def _placeholders(model, n_heads: int):
    """Zero attention and attention norms in the dropped layers for the duration, so the family's writer
    (hf.to_transformers_state_dict) walks every layer; the caller removes their tensors from what it writes."""
    from headcount.attention import MultiHeadAttention
    from headcount.models.decoder import RMSNorm

    cfg, saved = model.config, {}
    for i in dropped_layers(model):
        layer = model.layers[i]
        saved[i] = (layer.attn, layer.attn_norm)
        weight = layer.mlp_norm.weight
        layer.attn = MultiHeadAttention(cfg.d_model, n_heads, n_kv_heads=1, head_dim=cfg.head_dim, bias=False,
                                        dtype=weight.dtype, device=weight.device)
        layer.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype=weight.dtype, device=weight.device)
    try:
        yield
    finally:
        for i, (attn, norm) in saved.items():
            model.layers[i].attn, model.layers[i].attn_norm = attn, norm


def _group_order(attn, i: int) -> list[int]:
    """Query heads in KV-group order (a permutation; the identity for even groups). Refuses unequal groups."""
    nh, nkv, of = attn.n_heads, attn.n_kv_heads, list(attn.kv_head_of)
    sizes = [of.count(k) for k in range(nkv)]
    if len(set(sizes)) != 1:
        raise VllmExportError(
            f"model: layer {i} has K/V groups of {sorted(set(sizes))} query heads; vLLM's attention needs every K/V "
            "head to serve the same number (num_attention_heads // num_kv_heads): prune with --mode group or --uniform, "
            "or export --to gguf (llama.cpp's deci copies K/V heads to make equal groups)")
    return sorted(range(nh), key=lambda h: (of[h], h))


def plan_vllm_export(model) -> dict:
    """Which form vLLM gets and why; raises VllmExportError (nothing written) for what vLLM cannot hold."""
    from headcount.models.decoder import Decoder

    family = getattr(model.config, "family", None)
    if not isinstance(model, Decoder) or not model.config.causal:
        raise VllmExportError(f"model: vLLM serves causal decoders; this is {type(model).__name__}: "
                              "export --to transformers")
    counts = _counts(model)
    gone = dropped_layers(model)
    query = sorted({nh for nh, _ in counts if nh})
    kv = [nkv for _, nkv in counts]
    even = all(layer.attn.is_uniform for layer in model.layers)
    if 0 in gone:
        raise VllmExportError(
            "model: layer 0's attention was dropped; vLLM's Nemotron-NAS takes the residual stream from the first "
            "block's attention (DeciLMDecoderLayer.forward), so its first MLP would get none: keep layer 0's "
            "attention (drop-attention --layers without 0; the similarity order never picks it first), or export "
            "--to gguf (llama.cpp's deci passes the residual through)")
    if len(set(counts)) == 1 and even:
        return {"form": "family", "architecture": None, "family": family, "query_heads": query[0], "kv_heads": kv,
                "reason": f"every layer keeps {counts[0][0]} query and {counts[0][1]} K/V heads: the {family} "
                          "family's own transformers checkpoint, which vLLM reads as it is"}
    if len(query) != 1:
        raise VllmExportError(
            f"model: layers keep {query[0]}..{query[-1]} query heads; vLLM has one query-head count for every layer "
            "(num_attention_heads; its DeciLM varies only the K/V heads): prune with --uniform (one count per layer), "
            "or export --to gguf (llama.cpp's deci reads per-layer query counts)")
    if family not in DECI_FAMILIES:
        raise VllmExportError(
            f"model: {'attention-free layers' if gone else 'per-layer K/V head counts'} reach vLLM only through its DeciLM (Llama's block: {', '.join(DECI_FAMILIES)}); "
            f"this is {family}: merge every layer to the same K/V count (one count: the family's own checkpoint), "
            "or export --to gguf")
    cfg = model.config
    if cfg.sliding_window is not None or cfg.rope_type not in ("default", "linear", "llama3", "yarn") \
            or cfg.nope_layers or cfg.qk_norm or cfg.mlp_bias:
        raise VllmExportError(
            f"model: vLLM's DeciLM is Llama's block (full attention, rotary on every layer, no q/k norms, no MLP "
            f"biases); this {family} has something else: merge every layer to one K/V count instead (the family's own "
            "checkpoint), or export --to gguf")
    nh = query[0]
    bad = [i for i, n in enumerate(kv) if n and nh % n]
    if bad:
        raise VllmExportError(
            f"model: layer {bad[0]} keeps {kv[bad[0]]} K/V heads for {nh} query heads; vLLM's DeciLM takes "
            f"num_kv_heads = num_attention_heads // n_heads_in_group, so each count must divide {nh}: merge to "
            f"{', '.join(str(d) for d in range(1, nh + 1) if nh % d == 0)} K/V heads, or export --to gguf")
    for i, layer in enumerate(model.layers):
        if i not in gone:
            _group_order(layer.attn, i)  # refuses unequal groups
    live = [n for n in kv if n]
    why = (f"layers keep {min(live)}..{max(live)} K/V heads" + (f", layers {list(gone)} none (attention: no_op)"
                                                                 if gone else ""))
    return {"form": "deci", "architecture": "DeciLMForCausalLM", "family": family, "query_heads": nh, "kv_heads": kv,
            "n_heads_in_group": [nh // n if n else None for n in kv], "dropped_layers": list(gone),
            "reason": f"{why}: vLLM's Nemotron-NAS (DeciLMForCausalLM) reads one K/V count per layer "
                      "(block_configs[i].attention.n_heads_in_group) and attention-free blocks (attention.no_op); its "
                      f"configuration code travels in {REMOTE_CODE_FILE} (load with trust_remote_code=True)"}


def deci_state_dict(model) -> tuple[dict, dict[str, Tensor]]:
    """(config.json, state dict) of DeciLMForCausalLM: Llama's tensor names, each layer's own K/V rows."""
    from headcount.models.formats.hf import to_transformers_state_dict
    from headcount.models.formats.hf_config_write import with_version

    plan = plan_vllm_export(model)
    cfg = model.config
    nh, hd = plan["query_heads"], cfg.head_dim
    gone = set(plan["dropped_layers"])
    with _placeholders(model, nh):  # everything but q/k/v (and o_proj) is per-layer already
        hf, sd = to_transformers_state_dict(model)
    live = [layer for i, layer in enumerate(model.layers) if i not in gone]
    qkv_bias = any(layer.attn.qkv_proj.bias is not None for layer in live) or cfg.family == "qwen2"
    o_bias = any(layer.attn.o_proj.bias is not None for layer in live)
    for i, layer in enumerate(model.layers):
        attn, p = layer.attn, f"model.layers.{i}.self_attn."
        if i in gone:  # an attention-free block: no self_attn, no input_layernorm
            for key in [k for k in sd if k.startswith((p, f"model.layers.{i}.input_layernorm."))]:
                del sd[key]
            continue
        nkv = attn.n_kv_heads
        order = torch.tensor(_group_order(attn, i))
        w = attn.qkv_proj.weight.detach()
        sd[p + "q_proj.weight"] = w[: nh * hd].view(nh, hd, -1)[order].reshape(nh * hd, -1)
        sd[p + "k_proj.weight"] = w[nh * hd:(nh + nkv) * hd]
        sd[p + "v_proj.weight"] = w[(nh + nkv) * hd:]
        o = attn.o_proj.weight.detach()
        sd[p + "o_proj.weight"] = o.view(o.shape[0], nh, hd)[:, order].reshape(o.shape[0], nh * hd)
        for key in ("q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"):
            sd.pop(p + key, None)
        if qkv_bias:
            b = attn.qkv_proj.bias
            b = b.detach() if b is not None else w.new_zeros(w.shape[0])
            sd[p + "q_proj.bias"] = b[: nh * hd].view(nh, hd)[order].reshape(-1)
            sd[p + "k_proj.bias"] = b[nh * hd:(nh + nkv) * hd]
            sd[p + "v_proj.bias"] = b[(nh + nkv) * hd:]
        if o_bias:
            ob = attn.o_proj.bias
            sd[p + "o_proj.bias"] = ob.detach() if ob is not None else w.new_zeros(cfg.d_model)
    blocks = [{"attention": {"no_op": g is None, "replace_with_linear": False, "n_heads_in_group": g or 1},
               "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": cfg.d_ff}}
              for g in plan["n_heads_in_group"]]
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "intermediate_size",
            "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act")
    out = {k: hf[k] for k in keep if k in hf}
    out.update({
        "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas",
        "auto_map": {"AutoConfig": f"{REMOTE_CODE_FILE[:-3]}.DeciLMConfig"},
        "hidden_act": "silu", "num_key_value_heads": nh,  # the real counts are per layer, in block_configs
        "attention_bias": o_bias, "qkv_bias": qkv_bias, "mlp_bias": False, "block_configs": blocks,
        "headcount_family": cfg.family, "headcount_n_kv_heads": cfg.n_kv_heads,  # the model the edit came from
        "dtype": "float32", "torch_dtype": "float32",
    })
    with_version(out)
    if "rope_parameters" not in out:
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        if cfg.rope_scaling != 1.0:
            out["rope_parameters"].update(rope_type="linear", factor=cfg.rope_scaling)
    return out, sd


def export_vllm(model, directory, *, force: bool = False) -> dict:
    """Write what vLLM serves (see the module doc) to `directory`; returns the plan with the KV bytes vLLM holds."""
    from headcount.models.formats.hf import export_transformers
    from headcount.models.formats.native import check_out, tokenizer_writer, write_dir

    directory = Path(directory).expanduser()
    plan = plan_vllm_export(model)  # refuses before anything is written
    check_out(directory, force)
    if plan["form"] == "family":
        export_transformers(model, directory, force=force)
    else:
        hf, sd = deci_state_dict(model)
        files: dict[str, object] = {"config.json": hf, "model.safetensors": sd,
                                    REMOTE_CODE_FILE: lambda path: path.write_text(REMOTE_CODE)}
        writer = tokenizer_writer(model)
        if writer is not None:
            files["tokenizer.json"] = writer
        write_dir(directory, files)
    hd = model.config.head_dim
    plan["kv_bytes_per_token_fp32"] = sum(2 * n * hd * 4 for n in plan["kv_heads"])
    plan["directory"] = str(directory)
    return plan


# ------------------------------------------------------------------------------------------- read
def is_deci_dir(directory: str | Path) -> bool:
    """True when `directory`'s config.json is a Nemotron-NAS / DeciLM one."""
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text()).get("model_type") == "nemotron-nas"
    except (OSError, ValueError, AttributeError):
        return False


def read_deci(directory: str | Path, *, dtype: torch.dtype = torch.float32):
    """A Nemotron-NAS / DeciLM checkpoint (per-layer K/V heads, one query-head count) -> a headcount Decoder."""
    from headcount.models.decoder import Decoder
    from headcount.models.formats.hf import _add_bos, read_checkpoint_tensors
    from headcount.models.formats.hf_config import decoder_config
    from headcount.models.formats.native import attention_from_layout
    from headcount.models.formats.tensors import no_init
    from headcount.models.tokenizer import Tokenizer

    directory = Path(directory)
    source = str(directory / "config.json")
    cfg = json.loads((directory / "config.json").read_text())
    blocks = cfg.get("block_configs")
    n_layers = cfg.get("num_hidden_layers")
    if not isinstance(blocks, list) or len(blocks) != n_layers:
        raise CheckpointError(f"{source}: block_configs must list one block per layer ({n_layers})")
    nh = int(cfg["num_attention_heads"])
    groups, gone = [], []
    for i, b in enumerate(blocks):
        att, ffn = b.get("attention", {}), b.get("ffn", {})
        if att.get("replace_with_linear") or ffn.get("no_op") or ffn.get("replace_with_linear") \
                or "ffn_mult" in ffn or ffn.get("intermediate_size") != cfg["intermediate_size"]:
            raise CheckpointError(f"{source}: block {i}: headcount reads attention blocks with per-layer K/V heads or "
                                  "none (attention no_op) and one MLP width only (no ffn no_op / replace_with_linear / "
                                  "ffn_mult)")
        if att.get("no_op"):
            gone.append(i)
            groups.append(1)
            continue
        g = int(att.get("n_heads_in_group", 1))
        if g < 1 or nh % g:
            raise CheckpointError(f"{source}: block {i}: n_heads_in_group {g} does not divide {nh} query heads")
        groups.append(g)
    family = cfg.get("headcount_family", "llama")
    qkv_bias = bool(cfg.get("qkv_bias", cfg.get("attention_bias", False)))
    o_bias = bool(cfg.get("attention_bias", False))
    plain = {k: v for k, v in cfg.items() if k not in ("block_configs", "auto_map", "architectures")}
    plain.update(model_type=family, num_key_value_heads=nh)
    dcfg = decoder_config(plain, source)
    tensors, weights_source = read_checkpoint_tensors(directory)
    hd = dcfg.head_dim
    with no_init():
        model = Decoder(dcfg, dtype=dtype)
        for i, layer in enumerate(model.layers):
            if i in gone:
                layer.drop_attention()
                continue
            nkv = nh // groups[i]
            layout = {"n_heads": nh, "n_kv_heads": nkv, "kv_head_of": [h // groups[i] for h in range(nh)],
                      "kept_heads": list(range(nh)), "qkv_bias": qkv_bias, "o_bias": o_bias}
            layer.attn = attention_from_layout(layout, d_model=dcfg.d_model, head_dim=hd, source=source, index=i,
                                               dtype=dtype, **dcfg.attention_kwargs(i))

    def get(name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in tensors:
            raise CheckpointError(f"{weights_source}: tensor {name!r} is missing")
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{weights_source}: tensor {name!r} has shape {list(t.shape)}, the config "
                                  f"expects {list(shape)}")
        return t

    d, ff = dcfg.d_model, dcfg.d_ff
    values = {"embed.weight": get("model.embed_tokens.weight", (dcfg.vocab_size, d)),
              "norm.weight": get("model.norm.weight", (d,))}
    if not dcfg.tie_embeddings:
        values["lm_head.weight"] = get("lm_head.weight", (dcfg.vocab_size, d))
    for i, layer in enumerate(model.layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        values[q + "mlp.gate_up_proj.weight"] = torch.cat([get(p + "mlp.gate_proj.weight", (ff, d)),
                                                           get(p + "mlp.up_proj.weight", (ff, d))])
        values[q + "mlp.down_proj.weight"] = get(p + "mlp.down_proj.weight", (d, ff))
        values[q + "mlp_norm.weight"] = get(p + "post_attention_layernorm.weight", (d,))
        if i in gone:
            continue
        nkv = layer.attn.n_kv_heads
        values[q + "attn.qkv_proj.weight"] = torch.cat([get(p + "self_attn.q_proj.weight", (nh * hd, d)),
                                                        get(p + "self_attn.k_proj.weight", (nkv * hd, d)),
                                                        get(p + "self_attn.v_proj.weight", (nkv * hd, d))])
        if qkv_bias:
            values[q + "attn.qkv_proj.bias"] = torch.cat([get(p + "self_attn.q_proj.bias", (nh * hd,)),
                                                          get(p + "self_attn.k_proj.bias", (nkv * hd,)),
                                                          get(p + "self_attn.v_proj.bias", (nkv * hd,))])
        values[q + "attn.o_proj.weight"] = get(p + "self_attn.o_proj.weight", (d, nh * hd))
        if o_bias:
            values[q + "attn.o_proj.bias"] = get(p + "self_attn.o_proj.bias", (d,))
        values[q + "attn_norm.weight"] = get(p + "input_layernorm.weight", (d,))
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(values) - ({"lm_head.weight"} if dcfg.tie_embeddings else set()))
    if missing:
        raise CheckpointError(f"{weights_source}: no tensor for {missing[0]}")
    with torch.no_grad():
        for name, value in values.items():
            params[name].data = value.to(dtype).contiguous()
    tok_path = directory / "tokenizer.json"
    if tok_path.is_file():
        model.tokenizer = Tokenizer.from_file(tok_path, bos_token_id=dcfg.bos_token_id, eos_token_id=dcfg.eos_token_id,
                                              pad_token_id=dcfg.pad_token_id,
                                              add_special_tokens=_add_bos(directory, plain))
    model.name = str(directory)
    return model.eval()
