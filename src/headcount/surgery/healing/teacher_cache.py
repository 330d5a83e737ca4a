"""What a teacher wrote for a heal, kept on disk and read back for the same teacher weights.

    cal = cached_calibration("teacher-answers", teacher, steps, tokens, world, build)   # build() on a miss

The teacher's answers to the calibration stubs take minutes (14 on 2 cores for qwen2.5-coder-0.5b's 108), and
every heal of an edit of the same model asks the same teacher the same questions: a frontier's healed points, a
prune healed after a drop. They are deterministic (greedy answers, or samples drawn with a fixed seed), so they are
kept as JSON under $HEADCOUNT_CACHE/teacher/, keyed by the calibration's name, the teacher's weights hash
(models.fingerprint), the heal's steps, tokens and world size (which set how many windows are drawn), what the
teacher is asked (the calibration stubs and the prompt format with its stops and budget, for a chat teacher) and
CACHE_VERSION (bumped when what a calibration holds changes). Change one weight or one stub and the key changes.
A damaged or unreadable entry is recomputed; an unwritable cache only costs time.

    list[str]       teacher's texts          {"texts": [...]}
    LongTensor      teacher-chat windows     {"ids": [[...]]}
    MaskedWindows   teacher-answers          {"ids": [[...]], "mask": [[...]], "name": ...}
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

CACHE_VERSION = 1


def cache_root() -> Path:
    """$HEADCOUNT_CACHE/teacher (default ~/.cache/headcount/teacher)."""
    from headcount.models.formats.gguf import cache_root as root
    return root() / "teacher"


def to_json(calibration) -> dict:
    import torch

    from headcount.surgery.healing.masked import MaskedWindows

    if isinstance(calibration, MaskedWindows):
        return {"ids": calibration.ids.tolist(), "mask": calibration.mask.tolist(), "name": calibration.name}
    if isinstance(calibration, torch.Tensor):
        return {"ids": calibration.tolist()}
    if isinstance(calibration, list) and all(isinstance(t, str) for t in calibration):
        return {"texts": list(calibration)}
    raise TypeError(f"calibration: expected texts, token windows or MaskedWindows, got {type(calibration).__name__}")


def from_json(data: dict):
    """The calibration to_json wrote; ValueError on anything else (the caller recomputes)."""
    import torch

    from headcount.surgery.healing.masked import MaskedWindows

    if not isinstance(data, dict):
        raise ValueError(f"expected a dict, got {type(data).__name__}")
    if "texts" in data:
        return [str(t) for t in data["texts"]]
    ids = torch.tensor(data["ids"], dtype=torch.long)
    if "mask" in data:
        return MaskedWindows(ids, torch.tensor(data["mask"], dtype=torch.bool), name=str(data["name"]))
    return ids


def cached_calibration(name: str, teacher, steps: int, tokens: int, world: int, build: Callable[[], object], *,
                       root: Path | None = None, progress: bool = True):
    """build()'s calibration, read from the cache when this teacher already wrote it for these settings."""
    from headcount.disk_cache import cache_key, read_or_make
    from headcount.models.fingerprint import weights_hash

    root = Path(root) if root is not None else cache_root()
    key = cache_key(name, weights=weights_hash(teacher), text=_asked(teacher),
                    params={"steps": int(steps), "tokens": int(tokens), "world": int(world), "version": CACHE_VERSION})
    path = root / f"{name}-{key}.json"
    calibration, read_back = read_or_make(path, build, decode=from_json, encode=to_json)
    if read_back and progress:
        print(f"headcount: the teacher's {name} calibration read back from {path}", file=sys.stderr)
    return calibration


def _asked(teacher) -> str:
    """What the teacher is asked, hashed: the calibration stubs and, for a chat teacher, the eval format it is asked
    in (its text, stops and budget)."""
    from headcount.data import function_stubs
    from headcount.disk_cache import text_hash
    from headcount.models.chat import has_chat_template

    fmt = ""
    if has_chat_template(teacher):
        from headcount.tasks.prompts import choose_format
        fmt = repr(choose_format(teacher, "auto"))
    return text_hash([*function_stubs(), fmt])
