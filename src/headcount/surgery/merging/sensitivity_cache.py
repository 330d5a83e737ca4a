"""merge_plan's sensitivity table, kept on disk for the weights it was measured on.

    base, table, where = cached_sensitivity(root, model, calibration, params, measure)   # measure() on a miss

The table (every layer merged alone to every smaller K/V-head count, each cost measured on held-aside
calibration windows) is the expensive part of a plan: minutes for a 0.5B model on 2 cores, and the same for every
budget. A user who tries `merge-kv --budget 0.75`, then 0.5, then `frontier --point merge:0.9` asks the same
question three times. It is deterministic (a fixed calibration, greedy chat answers for by="kl"), so it is kept as
JSON under $HEADCOUNT_CACHE/merge-sensitivity/, keyed by the model's weights hash (models.fingerprint), the
calibration (its name, texts or token ids), what is measured (by, method, window counts and sizes, candidates) and
CACHE_VERSION. Change one weight or one calibration token and the key changes. A damaged entry is measured again;
an unwritable cache only costs time; a calibration this module cannot name (an iterator, a custom object) is never
cached.

    {"base": float, "table": {"layer": {"n_kv_heads": cost}}}
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Callable

CACHE_VERSION = 1  # bump when what a table's costs mean changes (the merge's fit, the cost's definition)


def cache_root() -> Path:
    """$HEADCOUNT_CACHE/merge-sensitivity (default ~/.cache/headcount/merge-sensitivity)."""
    from headcount.models.formats.gguf import cache_root as root
    return root() / "merge-sensitivity"


def calibration_id(calibration) -> str | None:
    """A name for what the table is measured on: None (the default), a named stream, texts or token windows;
    None for anything else (not cached)."""
    import torch

    from headcount.disk_cache import text_hash

    if calibration is None:
        return "default"
    if isinstance(calibration, str):
        return f"name:{calibration}"
    if isinstance(calibration, (list, tuple)) and calibration and all(isinstance(t, str) for t in calibration):
        return f"texts:{text_hash(list(calibration))}"
    if isinstance(calibration, torch.Tensor) and not calibration.is_floating_point():
        ids = calibration.detach().to("cpu", torch.int64).contiguous()
        return f"ids:{tuple(ids.shape)}:{hashlib.sha256(ids.numpy().tobytes()).hexdigest()}"
    return None


def _decode(data: dict) -> tuple[float, dict]:
    table = {int(layer): {int(n): float(c) for n, c in costs.items()} for layer, costs in data["table"].items()}
    return float(data["base"]), table


def _encode(measured: tuple[float, dict]) -> dict:
    base, table = measured
    return {"base": base, "table": {str(i): {str(n): c for n, c in costs.items()} for i, costs in table.items()}}


def cached_sensitivity(root, model, calibration, params: dict, measure: Callable[[], tuple[float, dict]], *,
                       progress: bool = True) -> tuple[float, dict, Path | None]:
    """(base, table, the file it was read from or None when measured now)."""
    from headcount.disk_cache import cache_key, read_or_make
    from headcount.models.fingerprint import weights_hash

    name = calibration_id(calibration)
    if name is None:
        return (*measure(), None)
    key = cache_key("merge-sensitivity", weights=weights_hash(model), text=name,
                    params={**params, "version": CACHE_VERSION})
    path = Path(root) / f"sensitivity-{key}.json"
    (base, table), read_back = read_or_make(path, measure, decode=_decode, encode=_encode)
    if read_back and progress:
        print(f"headcount: merge sensitivity read back from {path}", file=sys.stderr)
    return base, table, path if read_back else None
