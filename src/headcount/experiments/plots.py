"""--png FILE: one figure per experiment (matplotlib, Agg backend; each experiment draws on one axes)."""

from __future__ import annotations

from pathlib import Path

from headcount.experiments.results import ExperimentResult
from headcount.paths import check_png


def save_plot(result: ExperimentResult, path, draw) -> Path:
    """Draw `result` with draw(result, ax) and write a PNG to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = check_png(path)
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
