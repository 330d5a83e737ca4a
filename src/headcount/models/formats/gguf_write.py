"""What every GGUF writer shares: llama.cpp's GQA layout, the tokenizer fields copied from the source GGUF,
the file's name checks, and the atomic write. The architectures' own tensors and metadata live in
gguf_deci.py (`deci`: llama and, per-layer, qwen2) and gguf_own.py (qwen2 and gemma3 as themselves);
export_gguf (gguf_deci.py) chooses between them.

Groups. llama.cpp reads K/V by broadcasting: query head i of a layer reads KV head i // (n_head / n_head_kv),
so each layer needs contiguous, equal-size groups. Two exact layouts for a layer whose groups are not:
  - copy (`group_layout`): query heads reordered group by group (Q rows and o_proj columns move together: the
    same sum in another order), and KV head k, read by s_k query heads, written s_k / g times (identical
    copies), g = gcd of the group sizes. KV heads written: n / g (n = sum of s_k); query heads: n.
  - pad (`padded_group_layout`): every group filled up to the layer's largest, m = max s_k, with zero query
    heads (zero Q rows and q bias, zero o_proj columns: the head's context meets zero columns and adds exactly
    nothing), each KV head written once. KV heads written: K (the groups); query heads: K * m.
Since every s_k / g >= 1, K <= n / g, equal only when the groups are equal: padding never writes a larger KV
cache, and copying never runs more query heads. `layer_layout(kv_head_of, groups)` picks per layer ("copy",
"pad", or "auto": the smaller KV cache, on a tie the fewer parameters). Uniform layers are unchanged in every
mode.

Tokenizer. llama.cpp needs the tokenizer.ggml.* fields; they are COPIED from the GGUF the model came from
(`source_gguf`), or from `tokenizer_from=`, never rebuilt from a tokenizer.json: llama.cpp's pre-tokenizer name
("smollm", "qwen2", ...) selects a regex that cannot be derived reliably from the tokenizers library's pipeline.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from headcount.arguments import one_of
from headcount.models.formats.gguf import GGUFError, open_reader

DTYPES = ("f32", "f16")
F16_MAX = 65504.0


# --------------------------------------------------------------------------------------- layout
def group_layout(kv_head_of) -> tuple[list[int], list[int]]:
    """(query order, KV head written in each slot) for llama.cpp's contiguous equal groups.

    query order: the original query heads in the order they are written (group by group);
    slots: for each written KV head, which original KV head it copies. With g = gcd(group sizes),
    written query head j reads slot j // g, and slots[j // g] == kv_head_of[order[j]] (exact).
    """
    readers = _readers(kv_head_of)
    g = math.gcd(*(len(r) for r in readers.values()))
    order, slots = [], []
    for k in sorted(readers):  # KV heads no query reads are dropped (nothing reads them: exact)
        order += readers[k]
        slots += [k] * (len(readers[k]) // g)
    return order, slots


def _readers(kv_head_of) -> dict[int, list[int]]:
    """KV head -> the query heads that read it, in order (KV heads no query reads are absent)."""
    kv_head_of = [int(k) for k in kv_head_of]
    if not kv_head_of:
        raise ValueError("model: a layer with no query heads cannot be written")
    readers: dict[int, list[int]] = {}
    for i, k in enumerate(kv_head_of):
        readers.setdefault(k, []).append(i)
    return readers


def padded_group_layout(kv_head_of) -> tuple[list[int | None], list[int]]:
    """(query order, KV heads) with every group padded to the largest: query order holds the original query
    heads group by group, each group followed by None (a zero query head) up to m = the largest group's size;
    KV heads: each KV head some query reads, once, in order. Written query head j reads slot j // m, and
    slots[j // m] == kv_head_of[order[j]] wherever order[j] is not None (exact)."""
    readers = _readers(kv_head_of)
    m = max(len(r) for r in readers.values())
    order: list[int | None] = []
    for k in sorted(readers):  # KV heads no query reads are dropped, as group_layout does
        order += readers[k] + [None] * (m - len(readers[k]))
    return order, sorted(readers)


GROUPS = ("copy", "pad", "auto")


def layer_layout(kv_head_of, groups: str = "copy") -> tuple[str, list[int | None], list[int]]:
    """(layout written, query order, KV slots) of one layer: "uniform" (equal groups: no copies, no zero heads,
    the same in every mode), "copy" (group_layout) or "pad" (padded_group_layout). groups="auto" picks the
    layout with the smaller KV cache, on a tie the fewer parameters (in head units: copied K and V rows,
    zero Q rows and o_proj columns)."""
    one_of("groups", groups, GROUPS)
    order, slots = group_layout(kv_head_of)
    if len(set(len(r) for r in _readers(kv_head_of).values())) == 1:
        return "uniform", list(order), slots
    if groups == "copy":
        return "copy", list(order), slots
    padded, kv = padded_group_layout(kv_head_of)
    if groups == "pad":
        return "pad", padded, kv
    # auto: (KV heads written, extra heads written) for each; the extra are K+V copies or zero Q+O heads
    n, k = len(order), len(kv)
    copy_cost, pad_cost = (len(slots), len(slots) - k), (k, len(padded) - n)
    return ("pad", padded, kv) if pad_cost < copy_cost else ("copy", list(order), slots)


def heads_of(a: np.ndarray, order, dh: int, axis: int = 0) -> np.ndarray:
    """The head blocks (dh wide along `axis`) of `a` in `order`; None writes a block of zeros (a zero head)."""
    a = np.moveaxis(a, axis, 0)
    blocks = [a[h * dh:(h + 1) * dh] if h is not None else np.zeros_like(a[:dh]) for h in order]
    return np.ascontiguousarray(np.moveaxis(np.concatenate(blocks), 0, axis))


def rows(heads: list[int], dh: int, offset: int = 0) -> list[int]:
    """The rows of these heads (head_dim dh each) in a [heads * dh, ...] weight, from row `offset`."""
    return [offset + h * dh + j for h in heads for j in range(dh)]


def numpy32(t) -> np.ndarray:
    """A tensor as a float32 numpy array on the CPU (torch order [out, in])."""
    import torch

    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def mlp_tensors(out: dict[str, np.ndarray], prefix: str, layer, ff: int) -> None:
    """A layer's gated MLP under llama.cpp's names (the same in llama, deci, qwen2 and gemma3 files)."""
    gu = layer.mlp.gate_up_proj.weight
    out[prefix + "ffn_norm.weight"] = numpy32(layer.mlp_norm.weight)
    out[prefix + "ffn_gate.weight"] = numpy32(gu[:ff])
    out[prefix + "ffn_up.weight"] = numpy32(gu[ff:])
    out[prefix + "ffn_down.weight"] = numpy32(layer.mlp.down_proj.weight)


def output_tensors(out: dict[str, np.ndarray], model) -> None:
    """The final norm and, unless it is tied to the embedding, the output matrix."""
    out["output_norm.weight"] = numpy32(model.norm.weight)
    if not model.config.tie_embeddings:
        out["output.weight"] = numpy32(model.lm_head.weight)


def finish(out: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """f16: 2-D weights rounded to float16 (norms and biases stay F32, as llama.cpp's converter does);
    every tensor checked finite."""
    if dtype == "f16":
        for name, a in out.items():
            if a.ndim == 2:
                if np.abs(a).max(initial=0.0) > F16_MAX:
                    raise ValueError(f"dtype: tensor {name} has values beyond float16's range ({F16_MAX}); use f32")
                out[name] = a.astype(np.float16)
    for name, a in out.items():
        if not np.isfinite(a).all():
            raise ValueError(f"model: tensor {name} holds NaN or infinite values")
    return out


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


def tokenizer_fields(model, source: Path) -> list[tuple[str, object, object, object]]:
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
        # SentencePiece vocabularies (tokenizer model "llama", Gemma's) hold a few literal-space pieces that the
        # tokenizers library spells with U+2581, as it spells every space
        spm = dict((k, v) for k, v, _, _ in fields)["tokenizer.ggml.model"] == "llama"
        spelled = (lambda t: t.replace(" ", "\u2581")) if spm else (lambda t: t)  # noqa: E731
        bad = next((i for i, t in enumerate(tokens) if backend.id_to_token(i) != spelled(t)), None)
        if bad is not None:
            raise ValueError(f"tokenizer_from: token {bad} is {tokens[bad]!r} in {source} but "
                             f"{backend.id_to_token(bad)!r} in the model's tokenizer (not the model's source)")
    return fields


def tokenizer_source(model, tokenizer_from) -> Path:
    """The GGUF file to copy the tokenizer fields from, checked to exist."""
    source = Path(tokenizer_from).expanduser() if tokenizer_from is not None else source_gguf(model)
    if source is None:
        raise ValueError(f"model: no GGUF file to copy the tokenizer metadata from (model.name={model.name!r} "
                         "leads to none); llama.cpp needs tokenizer.ggml.*, which headcount copies from the model's "
                         "source GGUF rather than rebuilding it. Export a model loaded from a zoo GGUF or a .gguf file "
                         "(or a save of one), or pass tokenizer_from=FILE.gguf")
    if not source.is_file():
        raise ValueError(f"tokenizer_from: {source}: no such file")
    return source


# ------------------------------------------------------------------------------------------ file
def display_name(model) -> str:
    """A name for general.name: the zoo name, or the last part of the path it was loaded from (a local
    directory layout is nobody else's business)."""
    name = getattr(model, "name", None)
    if not name:
        return "headcount export"
    path = Path(str(name))
    return path.stem if path.suffix == ".gguf" else path.name or str(name)


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


def write_gguf(path: Path, arch: str, metadata: list[tuple], tok_fields: list[tuple], tensors: dict[str, np.ndarray],
               *, model, dtype: str) -> Path:
    """general.* (name, file type), then `metadata` as (key, value[, gguf.GGUFValueType]) in order, the copied
    tokenizer fields and the tensors, written to a temporary sibling of `path` and renamed (never half-written).
    A list value is an array (ints: INT32); a value with no type is written as gguf's writer infers it."""
    import gguf

    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(display_name(model))  # the model's name, never a local path
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    T = gguf.GGUFValueType
    for key, value, *kind in metadata:
        if isinstance(value, (list, tuple)):
            writer.add_key_value(key, list(value), T.ARRAY, sub_type=kind[0] if kind else T.INT32)
        elif kind:
            writer.add_key_value(key, value, kind[0])
        elif isinstance(value, bool):
            writer.add_key_value(key, value, T.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(key, value, T.UINT32)
        elif isinstance(value, float):
            writer.add_key_value(key, value, T.FLOAT32)
        else:
            writer.add_key_value(key, str(value), T.STRING)
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
