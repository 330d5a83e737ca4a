"""--png FILE: one figure per experiment (matplotlib, Agg backend; each experiment draws on one axes)."""

from __future__ import annotations

import os
from pathlib import Path

from headcount.experiments.results import ExperimentResult


def check_png_path(path) -> Path:
    """Fail before any training when the plot could not be written: a ValueError naming --png."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--png: {p} is a directory; give a file name such as {p / 'plot.png'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"--png: cannot write {p}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"--png: cannot write {p}: permission denied")
    return p


def save_plot(result: ExperimentResult, path, draw) -> Path:
    """Draw `result` with draw(result, ax) and write a PNG to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = check_png_path(path)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    try:
        draw(result, ax)
        fig.tight_layout()
        fig.savefig(p, format="png", dpi=120)
    except OSError as err:
        raise ValueError(f"--png: cannot write {p}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
    return p
