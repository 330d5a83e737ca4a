"""Results that took minutes, kept as JSON under $HEADCOUNT_CACHE/report/, keyed by what made them.

    key = sha256(analysis name, model weights hash, text hash, parameters, CACHE_VERSION)

A rerun with the same model, text and parameters reads the file back in milliseconds; change any
weight, any character of the text or any parameter and the key changes. Files are written to a
temporary sibling and renamed, so a killed run never leaves half a result behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from headcount.models.fingerprint import weights_hash  # noqa: F401  (re-exported: the cache keys on it)

CACHE_VERSION = 1  # bump when a cached result's meaning changes


def cache_dir() -> Path:
    """$HEADCOUNT_CACHE/report (default ~/.cache/headcount/report)."""
    from headcount.models.formats.gguf import cache_root
    return cache_root() / "report"


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


class ResultCache:
    """get-or-compute for JSON-able results. `enabled=False` computes every time (and stores nothing)."""

    def __init__(self, root: Path | None = None, *, enabled: bool = True):
        self.root = Path(root) if root is not None else cache_dir()
        self.enabled = enabled
        self.hits: list[str] = []

    def path(self, name: str, key: str) -> Path:
        return self.root / f"{name}-{key}.json"

    def get_or_compute(self, name: str, key: str, compute: Callable[[], Any]) -> Any:
        if self.enabled:
            p = self.path(name, key)
            if p.is_file():
                try:
                    value = json.loads(p.read_text(encoding="utf-8"))
                    self.hits.append(name)
                    return value
                except (OSError, json.JSONDecodeError):
                    pass  # a damaged entry is recomputed and overwritten
        value = compute()
        if self.enabled:
            try:
                atomic_write_text(self.path(name, key), json.dumps(value, sort_keys=True))
            except OSError:
                pass  # an unwritable cache only costs time next run
        return value
