"""Tensor files and weight assignment shared by every format: safetensors read with checks against the
file's size, copies into a model's parameters, and building modules without a wasted random init."""

from __future__ import annotations

import contextlib
import json
import math
import struct
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


def assign(model: torch.nn.Module, values: dict[str, Tensor], source: str) -> None:
    """Put copies of `values` into the model's parameters; every parameter must be covered.

    Always a copy: safetensors memory-maps the file, and a parameter left pointing into the map
    would crash the process (SIGBUS) if the file were truncated or rewritten in place later.
    `p.data =` keeps each Parameter object, so tied weights stay tied."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(values))
    if missing:
        raise CheckpointError(f"{source}: no weights for {missing[:5]}")
    with torch.no_grad():
        for name, value in values.items():
            p = params[name]
            if p.shape != value.shape:  # a converter bug rather than a bad file, but say which
                raise CheckpointError(f"{source}: {name} would get shape {list(value.shape)}, expected {list(p.shape)}")
            p.data = value.detach().to(device=p.device, dtype=p.dtype).clone(memory_format=torch.contiguous_format)


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



def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """All tensors of a .safetensors file, after checking its header against the file's size, so a
    truncated or corrupted file gets an error naming the file and the first tensor it cannot hold."""
    from safetensors.torch import load_file

    path = Path(path)
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
    data_len = size - 8 - header_len
    itemsize = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            expected = math.prod(info["shape"]) * itemsize.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupted safetensors header at tensor {name!r}") from None
        if end > data_len:
            raise CheckpointError(f"{path}: truncated: tensor {name!r} needs bytes {start}..{end} of the data, "
                                  f"the file holds {data_len}")
        if info["dtype"] in itemsize and end - start != expected:
            raise CheckpointError(f"{path}: corrupted: tensor {name!r} has {end - start} bytes for shape "
                                  f"{info['shape']} of {info['dtype']}")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors' own checks (overlaps, bad dtypes)
        raise CheckpointError(f"{path}: cannot read safetensors ({e})") from None
