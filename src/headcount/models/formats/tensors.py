"""Tensor files and weight assignment shared by every format: safetensors read with checks against the
file's size, copies into a model's parameters, and building modules without a wasted random init."""

from __future__ import annotations

import contextlib
import json
import math
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from headcount.models.formats.errors import CheckpointError

Tensor = torch.Tensor


def check_finite(t: Tensor, name: str, source: str) -> None:
    """Damaged bytes inside a tensor's data almost always decode to some NaN / inf somewhere.

    One sum first (a NaN or inf anywhere makes it non-finite: one vectorised pass, ~20x faster than building a
    [numel] bool tensor); the elementwise check only when the sum is not finite (which an overflowing sum of
    huge but finite weights could also cause: then the elementwise check decides)."""
    if t.numel() and bool(torch.isfinite(t.sum())):
        return
    if not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"{source}: tensor {name!r} holds NaN or infinite values (a corrupted file?)")


def assign(model: torch.nn.Module, values: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]], source: str, *,
           fresh: bool = False) -> None:
    """Put `values` (a mapping, or (name, tensor) pairs produced one at a time) into the model's parameters;
    every parameter must be covered.

    fresh=False: copies (the values may belong to someone else: a live transformers model, a memory map
    that would crash the process with SIGBUS if its file were truncated later). fresh=True: the values
    were made for this call (read by SafetensorsFile, or concatenated), so one of the right dtype is used
    as it is: with pairs produced lazily, loading holds the model plus one tensor at a time.
    `p.data =` keeps each Parameter object, so tied weights stay tied."""
    params = dict(model.named_parameters())
    items = values.items() if isinstance(values, Mapping) else values
    if isinstance(values, Mapping):
        missing = sorted(set(params) - set(values))
        if missing:
            raise CheckpointError(f"{source}: no weights for {missing[:5]}")
    seen = set()
    with torch.no_grad():
        for name, value in items:
            p = params[name]
            if p.shape != value.shape:  # a converter bug rather than a bad file, but say which
                raise CheckpointError(f"{source}: {name} would get shape {list(value.shape)}, expected {list(p.shape)}")
            new = value.detach().to(device=p.device, dtype=p.dtype)
            if not fresh and new.data_ptr() == value.data_ptr():  # .to() made no copy: make one
                new = new.clone(memory_format=torch.contiguous_format)
            p.data = new.contiguous()
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise CheckpointError(f"{source}: no weights for {missing[:5]}")


@contextlib.contextmanager
def no_init():
    """Build modules without initialising their weights (they are about to be overwritten): the
    random init of 135M parameters costs more than reading them from disk."""
    saved = {name: getattr(torch.nn.init, name) for name in
             ("kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "uniform_", "normal_",
              "zeros_", "ones_", "constant_", "trunc_normal_")}

    def skip(tensor, *args, **kwargs):
        return tensor

    try:
        for name in saved:
            setattr(torch.nn.init, name, skip)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)



_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _checked_header(path: Path) -> tuple[dict, int]:
    """(the tensors' header entries, the byte offset where the data starts), checked against the file's
    size, so a truncated or corrupted file gets an error naming the file and the first tensor it cannot hold."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100_000_000):
            raise CheckpointError(f"{path}: not a safetensors file, or truncated (header of {header_len} bytes, "
                                  f"file of {size})")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: corrupted safetensors header ({e.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupted safetensors header (not a JSON object)")
    data_len = size - 8 - header_len
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            expected = math.prod(info["shape"]) * _ITEMSIZE.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupted safetensors header at tensor {name!r}") from None
        if end > data_len or start < 0 or start > end:
            raise CheckpointError(f"{path}: truncated: tensor {name!r} needs bytes {start}..{end} of the data, "
                                  f"the file holds {data_len}")
        if info["dtype"] in _ITEMSIZE and end - start != expected:
            raise CheckpointError(f"{path}: corrupted: tensor {name!r} has {end - start} bytes for shape "
                                  f"{info['shape']} of {info['dtype']}")
        entries[name] = info
    return entries, 8 + header_len


class SafetensorsFile(Mapping):
    """A .safetensors file read one tensor at a time: `file[name]` reads that tensor's bytes into fresh
    memory (no memory map: the page cache is not counted against the process, and nothing points into a
    file that could be truncated later). Loading a model through it holds the model plus one tensor,
    never a second full copy of the weights. The header is checked on opening (see _checked_header)."""

    fresh = True  # every lookup is a new tensor that nobody else holds: assign() need not copy it

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries, self.data_start = _checked_header(self.path)

    def __getitem__(self, name: str) -> Tensor:
        info = self.entries[name]
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {info['dtype']}, which headcount does "
                                  f"not read (expected one of {', '.join(_DTYPES)})")
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == start:
            return torch.empty(shape, dtype=dtype)
        buf = bytearray(end - start)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + start)
            if f.readinto(buf) != len(buf):
                raise CheckpointError(f"{self.path}: truncated while reading tensor {name!r}")
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])


class ShardedTensors(Mapping):
    """Several SafetensorsFile shards (a model.safetensors.index.json) seen as one lazy mapping."""

    fresh = True

    def __init__(self, files: list[SafetensorsFile]):
        self.where = {name: f for f in files for name in f}

    def __getitem__(self, name: str) -> Tensor:
        return self.where[name][name]

    def __iter__(self):
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


class SafetensorsWriter:
    """A .safetensors file written tensor by tensor: the header (names, dtypes, shapes, offsets) first, computed
    from the shapes, then each tensor's bytes as they are produced. The format of safetensors' save_file
    (8-byte little-endian header length, JSON header padded with spaces to 8 bytes, data in header order),
    which holds a bytes copy of every tensor at once: saving a 1.5B bf16 model with it peaked 2 GB above the
    model; this holds at most one tensor's contiguous copy.

        w = SafetensorsWriter(path, [(name, shape, torch dtype), ...], {"format": "pt"})
        w.write(chunks)      # the next tensor: Tensors or numpy arrays, in order, of its dtype
        w.close()"""

    def __init__(self, path: str | Path, entries: list[tuple[str, tuple[int, ...], torch.dtype | str]],
                 metadata: dict[str, str] | None = None):
        names = {v: k for k, v in _DTYPES.items()}
        header: dict = {"__metadata__": dict(metadata or {})}
        offset = 0
        self.sizes: list[tuple[str, int]] = []
        for name, shape, dtype in entries:  # dtype: a torch dtype or its safetensors name ("F32", "BF16", ...)
            code = dtype if isinstance(dtype, str) and dtype in _ITEMSIZE else names.get(dtype)
            if code is None:
                raise ValueError(f"{name}: dtype {dtype} has no safetensors name (expected one of "
                                 f"{', '.join(str(d) for d in names)})")
            n = math.prod(shape) * _ITEMSIZE[code]
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            self.sizes.append((name, n))
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(blob)))
        self.f.write(blob)
        self.i = 0

    def write(self, chunks) -> None:
        name, expected = self.sizes[self.i]
        n = 0
        for c in chunks:
            if isinstance(c, Tensor):
                c = c.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            view = memoryview(c).cast("B")
            self.f.write(view)
            n += view.nbytes
        if n != expected:
            raise CheckpointError(f"internal: tensor {name!r} produced {n} bytes, expected {expected}")
        self.i += 1

    def close(self) -> None:
        self.f.close()
        if self.i != len(self.sizes):
            raise CheckpointError(f"internal: {len(self.sizes) - self.i} tensor(s) of the header never written")


def write_safetensors(path: str | Path, tensors: Mapping[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to one .safetensors file, one tensor at a time (SafetensorsWriter); loads with
    safetensors' own load_file, as save_file's output does."""
    writer = SafetensorsWriter(path, [(k, tuple(v.shape), v.dtype) for k, v in tensors.items()], metadata)
    try:
        for v in tensors.values():
            writer.write([v])
    except BaseException:
        writer.f.close()  # the error that stopped the writing is the one to see, not close()'s count
        raise
    writer.close()


def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """All tensors of a .safetensors file (checked like SafetensorsFile), read into memory at once."""
    from safetensors.torch import load_file

    path = Path(path)
    _checked_header(path)
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors' own checks (overlaps, bad dtypes)
        raise CheckpointError(f"{path}: cannot read safetensors ({e})") from None
