"""Output paths checked before any work: a clear error naming the flag, never a late OSError.

Used by every command that writes a PNG (roles, rank, importance, prune --curve, experiment).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def check_png(path, flag: str = "--png") -> Path:
    """`path` as a Path when a PNG can be written there; else a ValueError naming `flag`."""
    png = Path(path)
    if png.is_dir():
        raise ValueError(f"{flag}: {png} is a directory; give a file name such as {png / 'plot.png'}")
    if png.suffix.lower() != ".png":
        raise ValueError(f"{flag}: expected a file name ending in .png, got {str(png)!r}")
    parent = png.parent if str(png.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{flag}: cannot write {png}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (png.exists() and not os.access(png, os.W_OK)):
        raise ValueError(f"{flag}: cannot write {png}: permission denied")
    return png


def check_out_dir(out: Optional[Path], force: bool, flag: str = "--out") -> Path:
    if out is None:
        raise ValueError(f"{flag}: expected a directory to write the result to")
    if out.exists() and not force:
        raise ValueError(f"{flag}: {out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag}: {out} exists and is not a directory")
    return out
