"""llama.cpp's `deci` GGUF architecture, read and written, and `export_gguf`, which chooses the architecture.

export_gguf(model, path) writes a (pruned / merged) decoder as a llama.cpp GGUF file:
  - llama decoders: `deci` (below);
  - qwen2: its own `qwen2` when llama.cpp's qwen2 graph holds it (every layer keeps all its query heads and
    the same KV count, no o_proj bias: gguf_own.py), else `deci`, whose Llama graph with q/k/v biases is
    Qwen2's math (rotary: headcount's halves permuted to llama.cpp's interleaved pairs, as for Llama);
  - gemma3: its own `gemma3` (gguf_own.py) with the same head counts in every layer; per-layer counts are
    refused with the alternatives (no llama.cpp architecture has Gemma 3's graph with per-layer heads).
`choose_architecture` says which and why; `plan_gguf_export` what llama.cpp will hold, before writing.
Reading: load_deci(path) builds the Decoder directly from a deci file (a transformers checkpoint cannot hold
per-layer counts, so there is no safetensors cache for these files); qwen2 / gemma3 files are read by gguf.py.

What can carry per-layer head counts (what a pruned model needs: its layers keep different numbers of heads):
  - transformers (checked on 5.x): `per_layer_config` is accepted by LlamaConfig, but LlamaAttention reads
    the global num_attention_heads, so every layer is built with one count (formats/hf.py refuses).
  - llama.cpp's GGUF: `{arch}.attention.head_count` / `head_count_kv` may be arrays with one entry per
    layer (llama_model_loader::get_key_or_arr), and the `deci` architecture (DeciLM / Nemotron-NAS,
    Llama-3_1-Nemotron-51B) builds each layer's Q/K/V/O with that layer's counts (qwen2 and gemma3 read the
    arrays too but build every layer with layer 0's counts). This module writes `deci`: the Llama graph
    (RMSNorm, rotary on interleaved pairs, gated SiLU) with per-layer heads and optional biases.

The file:
  general.architecture = "deci"; deci.block_count, context_length, embedding_length,
  feed_forward_length, vocab_size, rope.freq_base, rope.dimension_count (= head_dim: llama.cpp requires
  n_rot == key_length for deci), attention.layer_norm_rms_epsilon, attention.key_length and value_length
  (always written: llama.cpp's default is embedding_length / head_count[0], wrong once heads are pruned),
  attention.head_count and attention.head_count_kv as int32 arrays of block_count entries.
  Tensors use gguf's own names for MODEL_ARCH.DECI (token_embd, output_norm, output when untied,
  blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down,
  blk.N.attn_q / attn_k / attn_v.bias (qwen2; llama.cpp's deci creates them optionally, sized by the layer's
  own head counts), and blk.N.attn_output.bias when compensation gave o_proj a bias). attn_q / attn_k rows
  (and their biases) are permuted for llama.cpp's rotary layout with formats.gguf.permute (the inverse of
  what the loader undoes). dtype "f32": every tensor F32. "f16": 2-D weights F16, norms and biases F32 (what
  llama.cpp's converter does); general.file_type says which.

Groups (gguf_write.layer_layout, export_gguf's `groups=`). llama.cpp needs each layer's groups contiguous and
equal. A layer pruned unevenly (group sizes 3, 2, 3) or merged into non-contiguous groups (kv_head_of
0 0 0 1 1 1 0 0 0) is still written EXACTLY, in one of two layouts, its query heads reordered group by group:
  - groups="copy" (the default; group_layout): KV head k, read by s_k query heads, is written s_k / g times
    (identical copies), g = gcd of the group sizes: the smallest exact expansion with K/V copies. The layer's
    KV cache in llama.cpp grows from n_kv to n_heads / g heads (sizes 3, 2, 3: 3 -> 8, 8/3 x; sizes 6, 3:
    2 -> 3, 1.5 x); weights grow by the copied K/V rows.
  - groups="pad" (padded_group_layout): every group is filled up to the layer's largest with zero query heads
    (zero Q rows and q bias, zero o_proj columns: the head's context meets zero columns and adds exactly
    nothing), each KV head written once. The KV cache is the model's; llama.cpp runs the zero heads (sizes
    3, 2, 3: 9 query heads for 8, KV 3; sizes 6, 5: 12 for 11, KV 2); weights grow by their Q rows and O columns.
  - groups="auto": per layer, the smaller KV cache (on a tie the fewer parameters). Padding writes K KV heads
    against copying's n_heads / g >= K, equal only for equal groups, so auto pads every uneven layer.
Uniform layers are unchanged in every mode. A qwen2 whose layers are padded no longer fills d_model with query
heads, so it is written as deci. Gemma 3 has its own padding (gguf_own.gemma3_layout) and ignores `groups`.
headcount.models.load reads the file back with the file's counts (copies stay separate KV heads, zero query heads
stay heads with zero weights).
A layer whose attention sublayer was dropped (drop-attention, models/dropped.py) is written as llama.cpp's
attention-free deci block (Nemotron-51B's): head_count 0 and head_count_kv 0 for the layer, no attn_* tensors and
no attn_norm; llama.cpp's deci graph then passes the residual to the block's FFN (`if (n_head == 0) cur = inpL`,
no residual add) and its K/V cache holds nothing for it: headcount's attention-free layer exactly. load_deci reads
such a block back as a dropped layer. A MultiHeadAttention with no query heads cannot arise (MultiHeadAttention
and prune_heads refuse it); export refuses one anyway (its o_proj bias would be lost).

Tokenizer: the tokenizer.ggml.* fields are copied from the model's source GGUF (gguf_write.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from headcount.arguments import one_of
from headcount.models.dropped import dropped_layers, is_dropped
from headcount.models.formats.gguf import (GGUFError, dequantized, field, open_reader, permute, reverse_permute,
                                          token_ids, tokenizer_backend, tokenizer_info)
from headcount.models.formats.gguf_own import (check_gemma3, gemma3_layout, gemma3_zero_heads, own_file, qwen2_misfit,
                                               window_layers)
from headcount.models.formats.gguf_write import (DTYPES, GROUPS, check_gguf_path, display_name, finish, group_layout,
                                                 heads_of, layer_layout, mlp_tensors, numpy32, output_tensors,
                                                 padded_group_layout, source_gguf, tokenizer_fields,
                                                 tokenizer_source, write_gguf)

__all__ = ["ARCH", "DTYPES", "GROUPS", "check_gguf_path", "choose_architecture", "display_name", "export_gguf",
           "group_layout", "layer_layout", "load_deci", "padded_group_layout", "plan_gguf_export", "read_deci",
           "source_gguf"]

ARCH = "deci"


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
        if nh == 0 and nkv == 0:  # an attention-free block (Nemotron-51B's; drop-attention's)
            continue
        if nh == 0:
            raise GGUFError(f"{path}: layer {i} has head_count 0 with head_count_kv {nkv}; an attention-free block "
                            "has both 0")
        if nkv == 0:
            raise GGUFError(f"{path}: layer {i} has head_count_kv 0 with {nh} heads (deci's 'linear attention' "
                            "block); headcount has no such layer")
        if nh % nkv:
            raise GGUFError(f"{path}: layer {i}: head_count {nh} is not a multiple of head_count_kv {nkv}")
    first = next((i for i, nh in enumerate(heads) if nh), None)
    if first is None:
        raise GGUFError(f"{path}: every layer has head_count 0; a headcount Decoder keeps attention in one at least")
    head_dim = int(field(reader, "deci.attention.key_length", path, d_model // heads[first]))
    value_dim = int(field(reader, "deci.attention.value_length", path, d_model // heads[first]))
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
        "n_layers": n_layers, "n_heads": heads[first], "n_kv_heads": kv_heads[first], "head_dim": head_dim,
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
    layouts = [{"dropped": True} if nh == 0 else
               {"n_heads": nh, "n_kv_heads": nkv, "kv_head_of": [h // (nh // nkv) for h in range(nh)],
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
        b, o = f"blk.{i}.", f"layers.{i}."
        if lay.get("dropped"):  # no attention tensors, no attn_norm
            _ffn_tensors(out, take, b, o, ff, d)
            continue
        nh, nkv = lay["n_heads"], lay["n_kv_heads"]
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
        _ffn_tensors(out, take, b, o, ff, d)
    extra = sorted(set(raw) - used)
    if extra:
        raise GGUFError(f"{path}: unexpected tensor {extra[0]!r} for a deci model headcount can build"
                        + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    return out


def _ffn_tensors(out: dict, take, b: str, o: str, ff: int, d: int) -> None:
    """A block's FFN and its norm (every deci block has them) into headcount's names."""
    out[o + "mlp_norm.weight"] = take(b + "ffn_norm.weight", (d,))
    gate = take(b + "ffn_gate.weight", (ff, d), f" (feed_forward_length {ff})")
    up = take(b + "ffn_up.weight", (ff, d), f" (feed_forward_length {ff})")
    out[o + "mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
    out[o + "mlp.down_proj.weight"] = take(b + "ffn_down.weight", (d, ff), f" (feed_forward_length {ff})")


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
            if layout.get("dropped"):
                layer.drop_attention()
            elif (layout["n_heads"], layout["n_kv_heads"], layout["qkv_bias"], layout["o_bias"]) != \
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
    from headcount.models.formats.gguf import chat_template

    model.tokenizer.chat_template = chat_template(path)
    model.name = str(path)
    return model.eval()


# ------------------------------------------------------------------------------------------ choosing
WRITTEN_FAMILIES = ("llama", "qwen2", "gemma3")


def _check_common(model) -> None:
    from headcount.models.decoder import Decoder

    if not isinstance(model, Decoder):
        raise ValueError(f"model: export_gguf writes decoders ({', '.join(WRITTEN_FAMILIES)}); this is "
                         f"{type(model).__name__}")
    cfg = model.config
    if cfg.family not in WRITTEN_FAMILIES:
        raise ValueError(f"model: family={cfg.family!r} (norm {cfg.norm}, mlp {cfg.mlp}, positions {cfg.position}); "
                         f"export_gguf writes {', '.join(WRITTEN_FAMILIES)} decoders (llama.cpp's deci, qwen2 and "
                         "gemma3 graphs)")
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if is_dropped(attn):
            continue
        if attn.n_heads < 1:
            raise ValueError(f"model: layer {i} has no query heads; llama.cpp's deci would read n_head 0 as an "
                             "attention-free block (x passes through), which drops an o_proj bias: refused")
        if attn.head_dim != cfg.head_dim:
            raise ValueError(f"model: layer {i} has head_dim {attn.head_dim}, the config {cfg.head_dim}; a GGUF file "
                             "has one key_length")


def _check_deci(model) -> None:
    """What llama.cpp's deci graph (Llama's, with optional biases) needs of a llama / qwen2 model."""
    cfg = model.config
    if (cfg.norm, cfg.mlp, cfg.position) != ("rms", "gated_silu", "rotary"):
        raise ValueError(f"model: family={cfg.family!r} with norm {cfg.norm}, mlp {cfg.mlp}, positions {cfg.position}; "
                         "llama.cpp's deci graph is Llama's (RMSNorm, gated SiLU, rotary)")
    if cfg.mlp_bias:
        raise ValueError("model: MLP biases are not written (Llama and Qwen2 checkpoints have none)")
    for key, plain in (("sliding_window", None), ("qk_norm", False), ("post_norms", False), ("embed_scale", None),
                       ("rope_scaling", 1.0), ("causal", True), ("rope_type", "default"),
                       ("rotary_dim", None)):
        if getattr(cfg, key) != plain:
            raise ValueError(f"model: {key}={getattr(cfg, key)!r}; llama.cpp's deci graph has none "
                             f"(it needs {key}={plain!r})")
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if is_dropped(attn):
            continue
        if not math.isclose(attn.softmax_scale, 1.0 / math.sqrt(attn.head_dim), rel_tol=1e-6):
            raise ValueError(f"model: layer {i} has softmax_scale {attn.softmax_scale}; llama.cpp's deci uses "
                             f"1/sqrt(head_dim) = {1 / math.sqrt(attn.head_dim)}")


def choose_architecture(model, groups: str = "copy") -> tuple[str, str]:
    """(llama.cpp architecture export_gguf writes for `model`, why), or a one-line ValueError naming what no
    llama.cpp architecture can run (and the alternatives). groups: how uneven layers are written (layer_layout);
    a qwen2 whose layers get zero query heads no longer fills d_model, so it is written as deci. Gemma 3 is
    padded its own way (gemma3_layout) whatever `groups` says."""
    one_of("groups", groups, GROUPS)
    _check_common(model)
    family = model.config.family
    gone = dropped_layers(model)
    if gone and family == "gemma3":
        raise ValueError(f"model: layers {list(gone)} have no attention (drop-attention); llama.cpp's gemma3 builds "
                         "attention in every layer and its deci graph is Llama's, not Gemma 3's: keep it in "
                         "headcount's format (save)")
    if family == "gemma3":
        check_gemma3(model)
        zq, zkv = gemma3_zero_heads(model)
        if zq or zkv:
            return "gemma3", (f"Gemma 3's own architecture, which builds every layer with one head count: the layers "
                              f"are padded with {zq} exact zero query heads" + (f" and {zkv} zero KV heads" if zkv
                                                                               else "") +
                              " (the same logits), which llama.cpp computes all the same: it saves no compute for "
                              "the heads pruned. Prune with --uniform for a GGUF that runs faster")
        return "gemma3", "Gemma 3's own architecture: the same head counts in every layer"
    _check_deci(model)
    if gone:
        return "deci", (f"llama.cpp's deci: the Llama graph with per-layer head counts; layers {list(gone)} are "
                        "attention-free blocks (head_count 0)" + (", with q/k/v biases, which is Qwen2's math"
                                                                   if family == "qwen2" else ""))
    if family == "qwen2":
        why = qwen2_misfit(model)
        padded = [i for i, layer in enumerate(model.layers) if layer_layout(layer.attn.kv_head_of, groups)[0] == "pad"]
        if why is None and padded:
            why = (f"groups={groups!r} pads layer {padded[0]}'s uneven groups with zero query heads, and llama.cpp's "
                   "qwen2 builds attn_q / attn_output as d_model x d_model")
        if why is None:
            return "qwen2", "Qwen2's own architecture: every layer keeps its query heads and one KV count"
        return "deci", (f"llama.cpp's qwen2 cannot hold it ({why}); deci is the Llama graph with per-layer head "
                        "counts and q/k/v biases, which is Qwen2's math")
    return "deci", "llama.cpp's deci: the Llama graph with per-layer head counts"


# ------------------------------------------------------------------------------------------ writing
def _written_tensors(model, dtype: str, groups: str = "copy") -> tuple[dict[str, np.ndarray], list[int], list[int]]:
    """GGUF name -> array (numpy order [out, in]; the writer reverses it to ggml's ne), per-layer counts as
    written (layer_layout: K/V copies, or zero query heads: zero Q rows, q bias and o_proj columns)."""
    cfg = model.config
    dh, ff = cfg.head_dim, cfg.d_ff
    out: dict[str, np.ndarray] = {"token_embd.weight": numpy32(model.embed.weight)}
    heads, kv_heads = [], []
    for i, layer in enumerate(model.layers):
        attn, b = layer.attn, f"blk.{i}."
        if is_dropped(attn):  # llama.cpp's attention-free block: the FFN alone
            mlp_tensors(out, b, layer, ff)
            heads.append(0)
            kv_heads.append(0)
            continue
        nh, nkv = attn.n_heads, attn.n_kv_heads
        _, order, slots = layer_layout(attn.kv_head_of, groups)
        n_q, n_slots = len(order), len(slots)
        w = numpy32(attn.qkv_proj.weight)  # rows [Q heads | K heads | V heads]
        q, k, v = w[:nh * dh], w[nh * dh:(nh + nkv) * dh], w[(nh + nkv) * dh:]
        out[b + "attn_norm.weight"] = numpy32(layer.attn_norm.weight)
        out[b + "attn_q.weight"] = permute(heads_of(q, order, dh), n_q)
        out[b + "attn_k.weight"] = permute(heads_of(k, slots, dh), n_slots)
        out[b + "attn_v.weight"] = heads_of(v, slots, dh)
        out[b + "attn_output.weight"] = heads_of(numpy32(attn.o_proj.weight), order, dh, axis=1)
        if attn.qkv_proj.bias is not None:  # llama.cpp's deci: optional, sized by the layer's own counts
            bias = numpy32(attn.qkv_proj.bias)
            out[b + "attn_q.bias"] = permute(heads_of(bias[:nh * dh], order, dh), n_q)
            out[b + "attn_k.bias"] = permute(heads_of(bias[nh * dh:(nh + nkv) * dh], slots, dh), n_slots)
            out[b + "attn_v.bias"] = heads_of(bias[(nh + nkv) * dh:], slots, dh)
        if attn.o_proj.bias is not None:
            out[b + "attn_output.bias"] = numpy32(attn.o_proj.bias)
        mlp_tensors(out, b, layer, ff)
        heads.append(n_q)
        kv_heads.append(n_slots)
    output_tensors(out, model)
    return finish(out, dtype), heads, kv_heads


def _deci_file(model, dtype: str, groups: str = "copy") -> tuple[list[tuple], dict[str, np.ndarray]]:
    cfg = model.config
    tensors, heads, kv_heads = _written_tensors(model, dtype, groups)
    p = f"{ARCH}."
    meta = [(p + "vocab_size", cfg.vocab_size), (p + "context_length", cfg.max_position),
            (p + "embedding_length", cfg.d_model), (p + "block_count", cfg.n_layers),
            (p + "feed_forward_length", cfg.d_ff),
            (p + "attention.head_count", heads), (p + "attention.head_count_kv", kv_heads),  # int32 arrays
            (p + "attention.key_length", cfg.head_dim), (p + "attention.value_length", cfg.head_dim),
            (p + "rope.dimension_count", cfg.head_dim), (p + "rope.freq_base", float(cfg.rope_theta)),
            (p + "attention.layer_norm_rms_epsilon", float(cfg.norm_eps))]
    return meta, tensors


def _layouts(model, arch: str, groups: str) -> list[tuple[str, int, int]]:
    """Per layer (layout written, query heads written, KV heads written) in the file export_gguf writes."""
    if arch == "gemma3":
        return [("pad" if any(k is None or None in qs for k, qs in slots) else "uniform",
                 sum(len(qs) for _, qs in slots), len(slots)) for slots in gemma3_layout(model)]
    out = []
    for layer in model.layers:  # llama.cpp's own qwen2 is written with copies (it was chosen because it fits)
        if is_dropped(layer.attn):
            out.append(("dropped", 0, 0))
            continue
        kind, order, slots = layer_layout(layer.attn.kv_head_of, groups if arch == ARCH else "copy")
        out.append((kind, len(order), len(slots)))
    return out


def plan_gguf_export(model, dtype: str = "f32", groups: str = "copy") -> dict:
    """What llama.cpp will hold for this model once exported, against what headcount holds now, computed
    before writing: the architecture chosen and why, per-layer query / KV heads as written (uneven groups cost
    copied KV heads, or zero query heads with groups="pad"; `layouts` says which per layer), KV-cache bytes
    (both in f16, llama.cpp's default cache type, so the two compare) and parameters. KV bytes per token count
    the layers whose cache grows with the context; Gemma 3's sliding-window layers stop at their window in both
    runtimes (llama.cpp keeps the window plus one batch of cells), so they are a fixed `kv_bytes_window_*` at a
    full window. `grows` is True when the exported KV cache is larger than the model's (a warning to print).
    Raises what export_gguf would raise for the model."""
    one_of("dtype", dtype, DTYPES)
    arch, why = choose_architecture(model, groups)
    dh = model.config.head_dim
    layouts = _layouts(model, arch, groups)
    heads = [layer.attn.n_heads for layer in model.layers]
    kv_model = [layer.attn.n_kv_heads for layer in model.layers]
    heads_written = [q for _, q, _ in layouts]
    kv_written = [k for _, _, k in layouts]
    local = window_layers(model)
    window = model.config.sliding_window if any(local) else None

    def kv_bytes(counts, sliding: bool) -> int:  # K and V, f16 (llama.cpp's default cache type)
        return sum(2 * n * dh * 2 for n, w in zip(counts, local) if w == sliding)

    extra = sum(2 * (w - m) * dh * model.config.d_model for w, m in zip(kv_written, kv_model))  # copied K/V rows
    extra += sum(2 * (w - m) * dh * model.config.d_model for w, m in zip(heads_written, heads))  # zero Q rows, O cols
    params = sum(p.numel() for p in model.parameters())
    return {"architecture": arch, "reason": why, "dtype": dtype, "query_heads": heads,
            "query_heads_written": heads_written, "zero_query_heads": sum(heads_written) - sum(heads),
            "kv_heads_model": kv_model,
            "kv_heads_written": kv_written, "kv_bytes_per_token_model": kv_bytes(kv_model, False),
            "kv_bytes_per_token_llama_cpp": kv_bytes(kv_written, False),
            "sliding_window": window, "sliding_layers": sum(local),
            "kv_bytes_window_model": kv_bytes(kv_model, True) * (window or 0),
            "kv_bytes_window_llama_cpp": kv_bytes(kv_written, True) * (window or 0),
            "kv_heads_copied": sum(kv_written) - sum(kv_model), "params_model": params,
            "params_written": params + extra,
            "grows": sum(kv_written) > sum(kv_model),
            "groups": groups, "layouts": [kind for kind, _, _ in layouts],
            "zero_query_heads_per_layer": [w - m for w, m in zip(heads_written, heads)],
            "kv_heads_copied_per_layer": [w - m for w, m in zip(kv_written, kv_model)]}


def export_gguf(model, path, *, dtype: str = "f32", force: bool = False, tokenizer_from=None,
                groups: str = "copy") -> Path:
    """Write `model` (a llama, qwen2 or gemma3 Decoder, pruned or merged) to `path` as a llama.cpp GGUF file:
    `deci` for llama (any per-layer heads), `qwen2` or `deci` for qwen2, `gemma3` for gemma3 with the same
    counts in every layer (choose_architecture says which and why; see the module doc).

    dtype: "f32" (exact) or "f16" (2-D weights rounded to float16).
    groups: how a layer with unequal GQA groups is written (both exact; see the module doc's "Groups"):
      "copy" K/V heads copied until the groups are equal (the KV cache grows), "pad" zero query heads added
      until they are (the layer keeps its KV heads), "auto" per layer whichever writes the smaller KV cache.
    force: replace an existing `path` (otherwise refused). Written to a temporary sibling and renamed.
    tokenizer_from: a .gguf file to copy the tokenizer.* fields from (default: the model's source GGUF).
    Read back with headcount.models.load(path).
    """
    one_of("dtype", dtype, DTYPES)
    one_of("groups", groups, GROUPS)
    path = check_gguf_path(path, force)
    arch, _ = choose_architecture(model, groups)
    tok_fields = tokenizer_fields(model, tokenizer_source(model, tokenizer_from))
    meta, tensors = _deci_file(model, dtype, groups) if arch == ARCH else own_file(model, arch, dtype)
    return write_gguf(path, arch, meta, tok_fields, tensors, model=model, dtype=dtype)
