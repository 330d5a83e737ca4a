"""build_report: run the analyses (cached), write DIR/index.html and DIR/report.json, never half-written.

    build_report(model, texts=None, out=None, *, force=False, seed=0, quick=False, sample=None,
                 progress=True, use_cache=True) -> Report
    write_report(report, out, *, force=False) -> Path          (the page from report.json alone)
    check_out(out, force) -> Path                              (the --out rules, checked before any work)

The output folder is written as a temporary sibling and renamed into place, so a failed or killed
run leaves either the old folder or nothing, never a page without its JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


class OutputExistsError(ValueError):
    """--out names a folder that exists (and --force was not given)."""


@dataclass(frozen=True)
class Report:
    out: Path
    data: dict
    timings: dict = field(default_factory=dict)  # seconds per step (not in report.json)
    cached: tuple[str, ...] = ()  # steps read back from $HEADCOUNT_CACHE

    @property
    def index(self) -> Path:
        return self.out / "index.html"

    @property
    def json_path(self) -> Path:
        return self.out / "report.json"

    def summary(self) -> list[str]:
        from headcount.report.summary import summary_lines
        return summary_lines(self.data)


def default_out(model_name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(str(model_name)).name) or "model"
    return Path("out") / f"report-{safe}"


def check_out(out: str | Path, force: bool) -> Path:
    """The output folder, checked: refuse an existing path without force, an unwritable parent always."""
    if not isinstance(out, (str, Path)) or not str(out).strip():
        raise ValueError(f"out: expected a folder path, got {out!r}")
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise OutputExistsError(f"out: {out} exists; pass --force (force=True) to replace it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file, not a folder")
    parent = out.absolute().parent
    probe = parent
    while not probe.exists():  # the nearest existing ancestor decides whether we can create the folder
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"out: cannot write under {probe} (permission denied)")
    return out


def dumps(report: dict) -> str:
    """report.json's exact bytes: sorted keys, fixed separators, a final newline."""
    return json.dumps(report, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_report(report: dict, out: str | Path, *, force: bool = False) -> Path:
    """Write report.json and index.html into `out` atomically (a temporary sibling, then a rename)."""
    from headcount.report.html import render_html

    out = check_out(out, force)
    page = render_html(report)  # before touching the disk: a failure here writes nothing
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "report.json").write_text(dumps(report), encoding="utf-8")
        (tmp / "index.html").write_text(page, encoding="utf-8")
        os.chmod(tmp, 0o755)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            old.rmdir()
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def build_report(model, texts: str | Sequence[str] | None = None, out: str | Path | None = None, *,
                 force: bool = False, seed: int = 0, quick: bool = False, sample: str | None = None,
                 progress: bool = True, use_cache: bool = True) -> Report:
    """The head report of `model` (a headcount model or a zoo name / path for headcount.models.load).

    texts: None = the calibration part of the default corpus. out: default out/report-<model>.
    Results that take minutes are cached under $HEADCOUNT_CACHE/report (use_cache=False recomputes).
    """
    from headcount.report.cache import ResultCache
    from headcount.report.collect import collect

    name = model if isinstance(model, (str, Path)) else (getattr(model, "name", None) or type(model).__name__)
    out = check_out(default_out(str(name)) if out is None else out, force)  # refuse before any work
    if isinstance(model, (str, Path)):
        from headcount.models import load
        model = load(model)
    cache = ResultCache(enabled=use_cache)
    timings: dict = {}
    data = collect(model, texts, seed=seed, quick=quick, sample=sample, progress=progress, cache=cache,
                   timings=timings)
    write_report(data, out, force=force)
    return Report(out, data, timings, tuple(cache.hits))
