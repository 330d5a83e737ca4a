"""Results that took minutes, kept as JSON under $HEADCOUNT_CACHE/report/, keyed by what made them.

    key = sha256(analysis name, model weights hash, text hash, parameters, CACHE_VERSION)

A rerun with the same model, text and parameters reads the file back in milliseconds; change any
weight, any character of the text or any parameter and the key changes. Files are written to a
temporary sibling and renamed, so a killed run never leaves half a result behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from headcount.disk_cache import CACHE_VERSION, atomic_write_text, cache_key, read_or_make, text_hash  # noqa: F401
from headcount.models.fingerprint import weights_hash  # noqa: F401  (re-exported: the cache keys on it)


def cache_dir() -> Path:
    """$HEADCOUNT_CACHE/report (default ~/.cache/headcount/report)."""
    from headcount.models.formats.gguf import cache_root
    return cache_root() / "report"


class ResultCache:
    """get-or-compute for JSON-able results. `enabled=False` computes every time (and stores nothing)."""

    def __init__(self, root: Path | None = None, *, enabled: bool = True):
        self.root = Path(root) if root is not None else cache_dir()
        self.enabled = enabled
        self.hits: list[str] = []

    def path(self, name: str, key: str) -> Path:
        return self.root / f"{name}-{key}.json"

    def get_or_compute(self, name: str, key: str, compute: Callable[[], Any]) -> Any:
        if not self.enabled:
            return compute()
        value, read_back = read_or_make(self.path(name, key), compute)
        if read_back:
            self.hits.append(name)
        return value
