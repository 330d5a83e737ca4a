"""save(model, dir) and export_transformers(model, dir): pruned models leave headcount.

save: headcount's own format (headcount.models.saved): any layout, per-layer heads, uneven groups;
`headcount.models.load(dir)` reads it back bit-identically.

export_transformers: a plain transformers checkpoint that loads with no headcount code.
  Llama (LlamaForCausalLM): every layer must keep the same numbers of query and KV heads, in even
    groups (kv_head_of[i] == i // (n_heads // n_kv_heads)); head_dim stays 64, written explicitly
    (transformers honours `head_dim`, so num_attention_heads * head_dim may differ from hidden_size).
    transformers' LlamaConfig also insists hidden_size % num_attention_heads == 0 (checked at load), so
    a count that does not divide hidden_size is refused. A compensated o_proj bias is carried with
    attention_bias=True (transformers then gives q/k/v biases too: written as zeros, exact).
    Per-layer counts: transformers 5.x `per_layer_config` is accepted by LlamaConfig but
    LlamaAttention reads the global num_attention_heads (checked on 5.24: every layer is built with
    the global count), so it cannot carry them; refused with the reason.
  BERT (BertModel): transformers derives the head size as hidden_size / num_attention_heads, so a
    pruned layer cannot be written with fewer heads. Removed heads are padded back as ZERO heads
    (zero Q/K/V rows and biases, zero o_proj columns): their context is 0 (V = 0), so the output is
    exactly the pruned model's. Works for any per-layer pattern; the file is not smaller.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from headcount.models import saved
from headcount.models.convert import to_transformers_state_dict

Tensor = torch.Tensor


def save(model, directory, *, force: bool = False) -> Path:
    """Write `model` (pruned or not) to `directory` in headcount's format (refuses an existing one
    unless force; written to a temporary sibling and renamed). Reload: headcount.models.load(directory)."""
    return saved.write(model, directory, force=force)


def _layouts(model) -> list[tuple[int, int, bool]]:
    return [(l.attn.n_heads, l.attn.n_kv_heads, l.attn.is_uniform) for l in model.layers]


def _check_out(directory: Path, force: bool) -> None:
    if directory.exists() and not force:
        raise ValueError(f"out: {directory} already exists; pass force=True (--force) to replace it")
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"out: {directory} exists and is not a directory")


def _write_dir(directory: Path, files: dict[str, object]) -> Path:
    """files: name -> dict of tensors (.safetensors) | dict (JSON) | callable(path) writer."""
    from safetensors.torch import save_file

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        for name, content in files.items():
            if name.endswith(".safetensors"):
                save_file({k: v.detach().cpu().contiguous().clone() for k, v in content.items()}, str(tmp / name),
                          metadata={"format": "pt"})
            elif callable(content):
                content(tmp / name)
            else:
                (tmp / name).write_text(json.dumps(content, indent=2) + "\n")
        saved.replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def _tokenizer_writer(model):
    tok = model.tokenizer
    return None if tok is None else (lambda path: tok.backend.save(str(path)))


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
    _check_out(directory, force)
    hf, sd = bert_state_dict(model) if isinstance(model, Encoder) else llama_state_dict(model)
    files: dict[str, object] = {"config.json": hf, "model.safetensors": sd}
    writer = _tokenizer_writer(model)
    if writer is not None:
        files["tokenizer.json"] = writer
    return _write_dir(directory, files)
