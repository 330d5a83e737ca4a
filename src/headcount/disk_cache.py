"""Results kept on disk under a key made of what produced them: the hashing and the safe write every cache
shares (the report's, a task's verdicts, a teacher's calibration, a merge plan's sensitivity).

    key = cache_key(name, weights=weights_hash, text=text_hash(texts), params={...})   32 hex digits
    atomic_write_text(path, text)      a temporary sibling, then a rename: a killed run leaves no half file
    value, read_back = read_or_make(path, make, decode=..., encode=...)   the JSON at path, else make() kept there
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

CACHE_VERSION = 1  # bump when a cached result's meaning changes


def text_hash(texts: str | Sequence[str] | None) -> str:
    """sha256 of the texts (None = the default corpus, named as such)."""
    if texts is None:
        return "default-corpus"
    items = [texts] if isinstance(texts, str) else list(texts)
    h = hashlib.sha256()
    for t in items:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def cache_key(name: str, *, weights: str, text: str, params: dict) -> str:
    payload = json.dumps({"analysis": name, "weights": weights, "text": text, "params": params,
                          "version": CACHE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_or_make(path: Path, make: Callable[[], Any], *, decode: Callable[[Any], Any] = lambda data: data,
                 encode: Callable[[Any], Any] = lambda value: value) -> tuple[Any, bool]:
    """(decode(the JSON at path), True) when it reads and decodes; else (make(), False), with encode(value) written
    to path. A damaged entry (unreadable, not JSON, or refused by decode with ValueError, KeyError,
    TypeError or AttributeError) is made again and written over; an unwritable cache only costs time."""
    path = Path(path)
    if path.is_file():
        try:
            return decode(json.loads(path.read_text(encoding="utf-8"))), True
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    value = make()
    try:
        atomic_write_text(path, json.dumps(encode(value), sort_keys=True))
    except OSError:
        pass
    return value, False
