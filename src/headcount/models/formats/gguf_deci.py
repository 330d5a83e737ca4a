"""llama.cpp's `deci` GGUF architecture, read and written: a decoder whose layers keep different head counts.

Writing: export_gguf(model, path), a pruned / merged Llama decoder as a llama.cpp GGUF file with
per-layer head counts. Reading: load_deci(path) builds the Decoder directly from the file (a transformers
checkpoint cannot hold per-layer counts, so there is no safetensors cache for these files).

What can carry per-layer head counts (issue 7):
  - transformers (checked on 5.x): `per_layer_config` is accepted by LlamaConfig, but LlamaAttention reads
    the global num_attention_heads, so every layer is built with one count (formats/hf.py refuses).
  - llama.cpp's GGUF: `{arch}.attention.head_count` / `head_count_kv` may be arrays with one entry per
    layer (llama_model_loader::get_key_or_arr), and the `deci` architecture (DeciLM / Nemotron-NAS,
    Llama-3_1-Nemotron-51B) builds each layer's Q/K/V/O with that layer's counts. This module writes
    `deci`: the Llama graph (RMSNorm, rotary on interleaved pairs, gated SiLU) with per-layer heads.

The file:
  general.architecture = "deci"; deci.block_count, context_length, embedding_length,
  feed_forward_length, vocab_size, rope.freq_base, rope.dimension_count (= head_dim: llama.cpp requires
  n_rot == key_length for deci), attention.layer_norm_rms_epsilon, attention.key_length and value_length
  (always written: llama.cpp's default is embedding_length / head_count[0], wrong once heads are pruned),
  attention.head_count and attention.head_count_kv as int32 arrays of block_count entries.
  Tensors use gguf's own names for MODEL_ARCH.DECI (token_embd, output_norm, output when untied,
  blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down,
  and blk.N.attn_output.bias when compensation gave o_proj a bias). attn_q / attn_k rows are permuted
  for llama.cpp's rotary layout with formats.gguf.permute (the inverse of what the loader undoes).
  dtype "f32": every tensor F32. "f16": 2-D weights F16, norms and biases F32 (what llama.cpp's
  converter does); general.file_type says which.

Groups. llama.cpp reads K/V by broadcasting: query head i of a layer reads KV head i // (n_head / n_head_kv),
so each layer needs contiguous, equal-size groups. A layer pruned unevenly (group sizes 3, 2, 3) or merged
into non-contiguous groups (kv_head_of 0 0 0 1 1 1 0 0 0) is still written EXACTLY:
  1. its query heads are reordered group by group (the Q rows and the matching o_proj columns move
     together, so the layer's output is the same sum in another order);
  2. KV head k, read by s_k query heads, is written s_k / g times (identical copies), g = gcd of the
     group sizes, so every group has g query heads. That is the smallest exact expansion with K/V copies:
     a written group can only hold queries of one original KV head, so its size must divide every s_k.
  Cost: the layer's KV cache in llama.cpp grows from n_kv to n_heads / g heads (sizes 3, 2, 3: 3 -> 8,
  8/3 x; sizes 6, 3: 2 -> 3, 1.5 x); weights grow by the copied K/V rows. Uniform layers are unchanged.
  (Padding the small groups with zero query heads would keep the KV cache and cost query compute
  instead; not done: the brief asks for K/V duplication, and a reader would then see dummy heads.)
  headcount.models.load reads the file back with the file's counts (the copies stay separate KV heads).
A layer with no query heads cannot arise (MultiHeadAttention and prune_heads refuse it); export refuses
one anyway rather than write llama.cpp's attention-free block, whose semantics differ when o_proj has a bias.

Tokenizer. llama.cpp needs the tokenizer.ggml.* fields; they are COPIED from the GGUF the model came
from (its `name`: "smollm2" -> the shipped SmolLM2 GGUF; a path to a .gguf file; a headcount save or
GGUF cache directory -> the name / source recorded inside it), or from `tokenizer_from=`. They are not
rebuilt from a tokenizer.json: llama.cpp's pre-tokenizer name ("smollm", "llama-bpe", ...) selects a
regex that cannot be derived reliably from the tokenizers library's pipeline. No source: a clear error.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from headcount.models.formats.gguf import (GGUFError, dequantized, field, open_reader, permute, reverse_permute,
                                          token_ids, tokenizer_backend, tokenizer_info)

DTYPES = ("f32", "f16")
ARCH = "deci"
F16_MAX = 65504.0


# --------------------------------------------------------------------------------------- layout
def group_layout(kv_head_of) -> tuple[list[int], list[int]]:
    """(query order, KV head written in each slot) for llama.cpp's contiguous equal groups.

    query order: the original query heads in the order they are written (group by group);
    slots: for each written KV head, which original KV head it copies. With g = gcd(group sizes),
    written query head j reads slot j // g, and slots[j // g] == kv_head_of[order[j]] (exact).
    """
    kv_head_of = [int(k) for k in kv_head_of]
    if not kv_head_of:
        raise ValueError("model: a layer with no query heads cannot be written")
    readers: dict[int, list[int]] = {}
    for i, k in enumerate(kv_head_of):
        readers.setdefault(k, []).append(i)
    g = math.gcd(*(len(r) for r in readers.values()))
    order, slots = [], []
    for k in sorted(readers):  # KV heads no query reads are dropped (nothing reads them: exact)
        order += readers[k]
        slots += [k] * (len(readers[k]) // g)
    return order, slots


# ------------------------------------------------------------------------------------------ reading
def _per_layer(reader, key: str, path: Path, n_layers: int, default=None) -> list[int]:
    """A llama.cpp hparam that is one number or an array with one entry per layer (get_key_or_arr)."""
    value = field(reader, key, path, default)
    if isinstance(value, (list, tuple)):
        if len(value) != n_layers:
            raise GGUFError(f"{path}: {key} has {len(value)} entries; block_count is {n_layers}")
        return [int(v) for v in value]
    return [int(value)] * n_layers


def read_deci(path: str | Path) -> tuple[dict, list[dict], dict[str, np.ndarray], dict]:
    """(DecoderConfig fields, per-layer layouts, headcount name -> float32 array, tokenizer info) from a
    llama.cpp `deci` GGUF file. Query head i of layer l reads KV head i // (n_head[l] / n_head_kv[l])."""
    path = Path(path)
    reader = open_reader(path)
    arch = field(reader, "general.architecture", path)
    if arch != "deci":
        raise GGUFError(f"{path}: architecture {arch!r}, expected 'deci'")
    n_layers = int(field(reader, "deci.block_count", path))
    d_model = int(field(reader, "deci.embedding_length", path))
    heads = _per_layer(reader, "deci.attention.head_count", path, n_layers)
    kv_heads = _per_layer(reader, "deci.attention.head_count_kv", path, n_layers, heads)
    for i, (nh, nkv) in enumerate(zip(heads, kv_heads)):
        if nh == 0:
            raise GGUFError(f"{path}: layer {i} has head_count 0 (an attention-free deci block, as in "
                            "Nemotron-51B); a headcount Decoder keeps at least one head per layer")
        if nkv == 0:
            raise GGUFError(f"{path}: layer {i} has head_count_kv 0 with {nh} heads (deci's 'linear attention' "
                            "block); headcount has no such layer")
        if nh % nkv:
            raise GGUFError(f"{path}: layer {i}: head_count {nh} is not a multiple of head_count_kv {nkv}")
    head_dim = int(field(reader, "deci.attention.key_length", path, d_model // heads[0]))
    value_dim = int(field(reader, "deci.attention.value_length", path, d_model // heads[0]))
    rot = int(field(reader, "deci.rope.dimension_count", path, head_dim))
    if value_dim != head_dim or rot != head_dim:
        raise GGUFError(f"{path}: key_length={head_dim}, value_length={value_dim}, rope.dimension_count={rot}; "
                        "headcount needs all three equal (full rotary, equal K/V widths)")
    ffn = _per_layer(reader, "deci.feed_forward_length", path, n_layers)
    if len(set(ffn)) != 1 or ffn[0] == 0:
        raise GGUFError(f"{path}: feed_forward_length {ffn} varies by layer or is 0; a headcount Decoder has one "
                        "MLP width")
    if reader.fields.get("deci.rope.scaling.type") is not None and \
            str(field(reader, "deci.rope.scaling.type", path)) not in ("none", "linear"):
        raise GGUFError(f"{path}: rope scaling {field(reader, 'deci.rope.scaling.type', path)!r} is not supported")
    if float(field(reader, "deci.rope.scaling.factor", path, 1.0)) not in (0.0, 1.0):
        raise GGUFError(f"{path}: rope scaling is not supported")
    tokens = list(field(reader, "tokenizer.ggml.tokens", path))
    tok = tokenizer_info(reader, path, tokens)
    tok.update(token_ids(reader, path))
    tok["add_bos_token"] = bool(field(reader, "tokenizer.ggml.add_bos_token", path, False))

    names = {t.name for t in reader.tensors}
    cfg = {
        "vocab_size": int(field(reader, "deci.vocab_size", path, len(tokens))), "d_model": d_model,
        "n_layers": n_layers, "n_heads": heads[0], "n_kv_heads": kv_heads[0], "head_dim": head_dim,
        "d_ff": ffn[0], "max_position": int(field(reader, "deci.context_length", path)),
        "norm": "rms", "norm_eps": float(field(reader, "deci.attention.layer_norm_rms_epsilon", path)),
        "mlp": "gated_silu", "position": "rotary",
        "rope_theta": float(field(reader, "deci.rope.freq_base", path, 10000.0)),
        "qkv_bias": any(f"blk.{i}.attn_{p}.bias" in names for i in range(n_layers) for p in "qkv"),
        "o_bias": any(f"blk.{i}.attn_output.bias" in names for i in range(n_layers)),
        "mlp_bias": False, "tie_embeddings": "output.weight" not in names,
        "bos_token_id": tok["bos_token_id"], "eos_token_id": tok["eos_token_id"],
        "pad_token_id": tok["pad_token_id"], "family": "llama",
    }
    layouts = [{"n_heads": nh, "n_kv_heads": nkv, "kv_head_of": [h // (nh // nkv) for h in range(nh)],
                "kept_heads": list(range(nh)),
                "qkv_bias": any(f"blk.{i}.attn_{p}.bias" in names for p in "qkv"),
                "o_bias": f"blk.{i}.attn_output.bias" in names}
               for i, (nh, nkv) in enumerate(zip(heads, kv_heads))]

    raw: dict[str, np.ndarray] = {}
    for name, w in dequantized(reader, path):
        if name.startswith("rope_") or name.endswith(".rope_freqs.weight"):
            continue  # rope frequency factors: only used with rope scaling, refused above
        raw[name] = w
    return cfg, layouts, _deci_tensors(raw, cfg, layouts, path), tok


_DECI_BLOCK = {"attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "mlp_norm.weight",
               "attn_output.weight": "attn.o_proj.weight", "attn_output.bias": "attn.o_proj.bias",
               "ffn_down.weight": "mlp.down_proj.weight"}


def _deci_tensors(raw: dict[str, np.ndarray], cfg: dict, layouts: list[dict], path: Path) -> dict[str, np.ndarray]:
    """GGUF names -> a headcount Decoder's state dict (fused qkv_proj and gate_up_proj), shapes checked."""
    d, hd, ff, vocab = cfg["d_model"], cfg["head_dim"], cfg["d_ff"], cfg["vocab_size"]
    used: set[str] = set()

    def take(name: str, shape: tuple, why: str = "", required: bool = True):
        if name not in raw:
            if required:
                raise GGUFError(f"{path}: tensor {name!r} is missing{why}")
            return None
        w = raw[name]
        if tuple(w.shape) != tuple(shape):
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(w.shape)} (torch order), expected "
                            f"{list(shape)}{why}")
        used.add(name)
        return w

    out = {"embed.weight": take("token_embd.weight", (vocab, d), " (vocab_size x embedding_length)"),
           "norm.weight": take("output_norm.weight", (d,))}
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = take("output.weight", (vocab, d))
    for i, lay in enumerate(layouts):
        nh, nkv, b, o = lay["n_heads"], lay["n_kv_heads"], f"blk.{i}.", f"layers.{i}."
        why = f" (layer {i}: head_count {nh}, head_count_kv {nkv}, key_length {hd})"
        q = reverse_permute(take(b + "attn_q.weight", (nh * hd, d), why), nh)
        k = reverse_permute(take(b + "attn_k.weight", (nkv * hd, d), why), nkv)
        v = take(b + "attn_v.weight", (nkv * hd, d), why)
        out[o + "attn.qkv_proj.weight"] = np.concatenate([q, k, v])  # rows [Q heads | K heads | V heads]
        if lay["qkv_bias"]:
            parts = []
            for p, n in (("q", nh), ("k", nkv), ("v", nkv)):
                bias = take(b + f"attn_{p}.bias", (n * hd,), why, required=False)
                bias = np.zeros(n * hd, np.float32) if bias is None else bias
                parts.append(reverse_permute(bias, n) if p in "qk" else bias)
            out[o + "attn.qkv_proj.bias"] = np.concatenate(parts)
        out[o + "attn.o_proj.weight"] = take(b + "attn_output.weight", (d, nh * hd), why)
        if lay["o_bias"]:
            out[o + "attn.o_proj.bias"] = take(b + "attn_output.bias", (d,))
        out[o + "attn_norm.weight"] = take(b + "attn_norm.weight", (d,))
        out[o + "mlp_norm.weight"] = take(b + "ffn_norm.weight", (d,))
        gate = take(b + "ffn_gate.weight", (ff, d), f" (feed_forward_length {ff})")
        up = take(b + "ffn_up.weight", (ff, d), f" (feed_forward_length {ff})")
        out[o + "mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
        out[o + "mlp.down_proj.weight"] = take(b + "ffn_down.weight", (d, ff), f" (feed_forward_length {ff})")
    extra = sorted(set(raw) - used)
    if extra:
        raise GGUFError(f"{path}: unexpected tensor {extra[0]!r} for a deci model headcount can build"
                        + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    return out


def load_deci(path: str | Path, *, dtype=None):
    """A `deci` GGUF file -> headcount Decoder (eval mode, with its tokenizer), each layer with the file's
    head counts. Logits equal those of the model export_gguf wrote (same float32 weights)."""
    import torch

    from headcount.models.formats.tensors import no_init
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.models.formats.native import attention_from_layout
    from headcount.models.tokenizer import Tokenizer

    path = Path(path)
    dtype = dtype or torch.float32
    cfg, layouts, arrays, tok = read_deci(path)
    config = DecoderConfig(**cfg)
    with no_init():
        model = Decoder(config, dtype=dtype)
        for i, (layer, layout) in enumerate(zip(model.layers, layouts)):
            if (layout["n_heads"], layout["n_kv_heads"], layout["qkv_bias"], layout["o_bias"]) != \
                    (config.n_heads, config.n_kv_heads, config.qkv_bias, config.o_bias):
                layer.attn = attention_from_layout(layout, d_model=config.d_model, head_dim=config.head_dim,
                                                   source=str(path), index=i, dtype=dtype)
    state = model.state_dict()
    expected = {n for n in state if not (n == "lm_head.weight" and config.tie_embeddings)}
    if set(arrays) != expected:  # a reader bug, not a bad file: _deci_tensors checked every name
        raise GGUFError(f"{path}: internal mismatch, missing {sorted(expected - set(arrays))[:3]}, "
                        f"unexpected {sorted(set(arrays) - expected)[:3]}")
    with torch.no_grad():
        for name, w in arrays.items():
            w = np.ascontiguousarray(w)  # memory-mapped F32 tensors are read-only views: copy those
            state[name].copy_(torch.from_numpy(w if w.flags.writeable else w.copy()))
    model.tokenizer = Tokenizer(tokenizer_backend(tok), bos_token_id=tok["bos_token_id"], eos_token_id=tok["eos_token_id"],
                                pad_token_id=tok["pad_token_id"], add_special_tokens=tok["add_bos_token"])
    model.name = str(path)
    return model.eval()


# ------------------------------------------------------------------------------------------ writing
def _rows(heads: list[int], dh: int, offset: int = 0) -> list[int]:
    return [offset + h * dh + j for h in heads for j in range(dh)]


def _check_model(model) -> None:
    from headcount.models.decoder import Decoder

    if not isinstance(model, Decoder):
        raise ValueError(f"model: export_gguf writes Llama-family decoders; this is {type(model).__name__}")
    cfg = model.config
    if (cfg.family, cfg.norm, cfg.mlp, cfg.position) != ("llama", "rms", "gated_silu", "rotary"):
        raise ValueError(f"model: family={cfg.family!r} (norm {cfg.norm}, mlp {cfg.mlp}, positions {cfg.position}); "
                         "llama.cpp's deci graph is Llama's (RMSNorm, gated SiLU, rotary), so only llama decoders "
                         "are written")
    if cfg.mlp_bias:
        raise ValueError("model: MLP biases are not written (Llama checkpoints have none)")
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if attn.n_heads < 1:
            raise ValueError(f"model: layer {i} has no query heads; llama.cpp's deci would read n_head 0 as an "
                             "attention-free block (x passes through), which drops an o_proj bias: refused")
        if attn.head_dim != cfg.head_dim:
            raise ValueError(f"model: layer {i} has head_dim {attn.head_dim}, the config {cfg.head_dim}; a GGUF file "
                             "has one key_length")
        if not math.isclose(attn.softmax_scale, 1.0 / math.sqrt(attn.head_dim), rel_tol=1e-6):
            raise ValueError(f"model: layer {i} has softmax_scale {attn.softmax_scale}; llama.cpp's deci uses "
                             f"1/sqrt(head_dim) = {1 / math.sqrt(attn.head_dim)}")
        bias = attn.qkv_proj.bias
        if bias is not None and attn.n_heads * attn.head_dim != cfg.d_model and \
                bool(bias[: attn.n_heads * attn.head_dim].detach().abs().max() > 0):
            raise ValueError(f"model: layer {i} has a query bias with {attn.n_heads} heads x {attn.head_dim} != "
                             f"d_model {cfg.d_model}; llama.cpp creates blk.N.attn_q.bias with embedding_length "
                             "entries, so it cannot hold it")


# -------------------------------------------------------------------------------------- tokenizer
def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def source_gguf(model) -> Path | None:
    """The GGUF file `model` was loaded from (`model.source_gguf`, which headcount.models.load sets on models
    born from a GGUF and headcount saves keep), else followed through `model.name` to a .gguf file, a save or
    a GGUF cache directory; None when there is none."""
    given = getattr(model, "source_gguf", None)
    if given is not None and Path(given).is_file():
        return Path(given)
    name, seen = getattr(model, "name", None), set()
    while name is not None and str(name) not in seen and len(seen) < 16:
        seen.add(str(name))
        path = Path(str(name)).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            return path
        meta = _json(path / "headcount.json") if path.is_dir() else None
        if meta is None:
            return None
        if meta.get("format") == "headcount" and meta.get("source_gguf"):
            return Path(meta["source_gguf"])
        # a headcount save records the model's name; a GGUF cache directory its source file
        name = meta.get("name") if meta.get("format") == "headcount" else meta.get("source")
    return None


def _tokenizer_fields(model, source: Path) -> list[tuple[str, object, object, object]]:
    """(key, value, type, array sub-type) of every tokenizer.* field of `source`, checked against the model."""
    import gguf

    try:
        reader = open_reader(source)
    except GGUFError as e:
        raise ValueError(f"tokenizer_from: {e}") from None
    fields = []
    for key, entry in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = entry.types[0]
        sub = entry.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        fields.append((key, entry.contents(), vtype, sub))
    tokens = dict((k, v) for k, v, _, _ in fields).get("tokenizer.ggml.tokens")
    if not tokens or "tokenizer.ggml.model" not in dict((k, v) for k, v, _, _ in fields):
        raise ValueError(f"tokenizer_from: {source} has no tokenizer.ggml.model / tokens to copy")
    vocab = model.config.vocab_size
    if len(tokens) != vocab:
        raise ValueError(f"tokenizer_from: {source} has {len(tokens)} tokens, the model's embedding {vocab} rows; "
                         "llama.cpp needs them equal (is this the model's source?)")
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        backend = tok.backend
        bad = next((i for i, t in enumerate(tokens) if backend.id_to_token(i) != t), None)
        if bad is not None:
            raise ValueError(f"tokenizer_from: token {bad} is {tokens[bad]!r} in {source} but "
                             f"{backend.id_to_token(bad)!r} in the model's tokenizer (not the model's source)")
    return fields


# ------------------------------------------------------------------------------------------ write
def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _tensors(model, dtype: str) -> tuple[dict[str, np.ndarray], list[int], list[int]]:
    """GGUF name -> array (numpy order [out, in]; the writer reverses it to ggml's ne), per-layer counts."""

    cfg = model.config
    d, dh, ff = cfg.d_model, cfg.head_dim, cfg.d_ff
    out: dict[str, np.ndarray] = {"token_embd.weight": _numpy(model.embed.weight)}
    heads, kv_heads = [], []
    for i, layer in enumerate(model.layers):
        attn, b = layer.attn, f"blk.{i}."
        nh, nkv = attn.n_heads, attn.n_kv_heads
        order, slots = group_layout(attn.kv_head_of)
        w = attn.qkv_proj.weight
        q_rows = _rows(order, dh)
        k_rows, v_rows = _rows(slots, dh, nh * dh), _rows(slots, dh, (nh + nkv) * dh)
        n_slots = len(slots)
        out[b + "attn_norm.weight"] = _numpy(layer.attn_norm.weight)
        out[b + "attn_q.weight"] = permute(_numpy(w[q_rows]), nh)
        out[b + "attn_k.weight"] = permute(_numpy(w[k_rows]), n_slots)
        out[b + "attn_v.weight"] = _numpy(w[v_rows])
        out[b + "attn_output.weight"] = _numpy(attn.o_proj.weight[:, q_rows])
        bias = attn.qkv_proj.bias
        if bias is not None:
            qb = _numpy(bias[q_rows])
            if nh * dh == d or np.any(qb):
                out[b + "attn_q.bias"] = permute(qb, nh)
            out[b + "attn_k.bias"] = permute(_numpy(bias[k_rows]), n_slots)
            out[b + "attn_v.bias"] = _numpy(bias[v_rows])
        if attn.o_proj.bias is not None:
            out[b + "attn_output.bias"] = _numpy(attn.o_proj.bias)
        gu = layer.mlp.gate_up_proj.weight
        out[b + "ffn_norm.weight"] = _numpy(layer.mlp_norm.weight)
        out[b + "ffn_gate.weight"] = _numpy(gu[:ff])
        out[b + "ffn_up.weight"] = _numpy(gu[ff:])
        out[b + "ffn_down.weight"] = _numpy(layer.mlp.down_proj.weight)
        heads.append(nh)
        kv_heads.append(n_slots)
    out["output_norm.weight"] = _numpy(model.norm.weight)
    if not cfg.tie_embeddings:
        out["output.weight"] = _numpy(model.lm_head.weight)
    if dtype == "f16":
        for name, a in out.items():
            if a.ndim == 2:
                if np.abs(a).max(initial=0.0) > F16_MAX:
                    raise ValueError(f"dtype: tensor {name} has values beyond float16's range ({F16_MAX}); use f32")
                out[name] = a.astype(np.float16)
    for name, a in out.items():
        if not np.isfinite(a).all():
            raise ValueError(f"model: tensor {name} holds NaN or infinite values")
    return out, heads, kv_heads


def display_name(model) -> str:
    """A name for general.name: the zoo name, or the last part of the path it was loaded from (a local
    directory layout is nobody else's business)."""
    name = getattr(model, "name", None)
    if not name:
        return "headcount export"
    path = Path(str(name))
    return path.stem if path.suffix == ".gguf" else path.name or str(name)


def plan_gguf_export(model, dtype: str = "f32") -> dict:
    """What llama.cpp will hold for this model once exported, against what headcount holds now, computed
    before writing: per-layer query / KV heads as written (uneven groups cost copied KV heads), KV-cache
    bytes per token (both in f16, llama.cpp's default cache type, so the two compare), and parameters.
    `grows` is True when the exported KV cache per token is larger than the model's (a warning to print)."""
    dh = model.config.head_dim
    heads, kv_written, kv_model = [], [], []
    for layer in model.layers:
        attn = layer.attn
        _, slots = group_layout(attn.kv_head_of)
        heads.append(attn.n_heads)
        kv_written.append(len(slots))
        kv_model.append(attn.n_kv_heads)
    kv_model_bytes = sum(2 * n * dh * 2 for n in kv_model)
    kv_llama_bytes = sum(2 * n * dh * 2 for n in kv_written)  # llama.cpp caches K and V in f16 by default
    extra = sum(2 * (w - m) * dh * model.config.d_model for w, m in zip(kv_written, kv_model))  # copied K/V rows
    params = sum(p.numel() for p in model.parameters())
    return {"architecture": ARCH, "dtype": dtype, "query_heads": heads, "kv_heads_model": kv_model,
            "kv_heads_written": kv_written, "kv_bytes_per_token_model": kv_model_bytes,
            "kv_bytes_per_token_llama_cpp": kv_llama_bytes,
            "kv_heads_copied": sum(kv_written) - sum(kv_model), "params_model": params,
            "params_written": params + extra,
            "grows": sum(kv_written) > sum(kv_model)}


def check_gguf_path(path, force: bool, flag: str = "out") -> Path:
    """The path export_gguf will write: a .gguf file name, not a directory, not existing unless force."""
    if path is None:
        raise ValueError(f"{flag}: expected a FILE.gguf to write the model to")
    path = Path(path).expanduser()
    if path.suffix != ".gguf":
        raise ValueError(f"{flag}: {path} does not end in .gguf")
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; expected a .gguf file name")
    if path.exists() and not force:
        raise ValueError(f"{flag}: {path} already exists; pass force=True (--force) to replace it")
    return path


def export_gguf(model, path, *, dtype: str = "f32", force: bool = False, tokenizer_from=None) -> Path:
    """Write `model` (a llama Decoder, pruned or merged, any per-layer heads) to `path` as a llama.cpp
    `deci` GGUF file; see the module doc for the format, the group expansion and its KV-cache cost.

    dtype: "f32" (exact) or "f16" (2-D weights rounded to float16).
    force: replace an existing `path` (otherwise refused). Written to a temporary sibling and renamed.
    tokenizer_from: a .gguf file to copy the tokenizer.* fields from (default: the model's source GGUF).
    Read back with headcount.models.load(path).
    """
    import gguf

    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    path = check_gguf_path(path, force)
    _check_model(model)
    source = Path(tokenizer_from).expanduser() if tokenizer_from is not None else source_gguf(model)
    if source is None:
        raise ValueError(f"model: no GGUF file to copy the tokenizer metadata from (model.name={model.name!r} "
                         "leads to none); llama.cpp needs tokenizer.ggml.*, which headcount copies from the model's "
                         "source GGUF rather than rebuilding it. Export a model loaded from smollm2 or a .gguf file "
                         "(or a save of one), or pass tokenizer_from=FILE.gguf")
    if not source.is_file():
        raise ValueError(f"tokenizer_from: {source}: no such file")
    tok_fields = _tokenizer_fields(model, source)
    tensors, heads, kv_heads = _tensors(model, dtype)

    cfg = model.config
    writer = gguf.GGUFWriter(None, ARCH)
    writer.add_name(display_name(model))  # the model's name, never a local path
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_context_length(cfg.max_position)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(heads)  # a list: an int32 array, one entry per layer
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    for key, value, vtype, sub in tok_fields:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for name, array in tensors.items():
        writer.add_tensor(name, array)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path
