"""`bench serve --png`: measured edit / unedited ratios beside the accounts' predictions, one panel per measure."""

from __future__ import annotations

from pathlib import Path

from headcount.engines.rows import ServeResult
from headcount.engines.table import ratios

PANELS = (("kv", "predicted_kv_ratio", "KV cache bytes (edit / unedited)"),
          ("prefill", "predicted_prefill_speedup", "prefill speed-up"),
          ("decode", "predicted_decode_speedup", "decode speed-up"))


def plot(result: ServeResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edits = [r for r in result.rows if r.edited is not None]
    labels = [f"{r.engine}\n{r.edited.rstrip('/').split('/')[-1]}\n{r.context}x{r.batch}" for r in edits]
    fig, axes = plt.subplots(3, 1, figsize=(max(8.0, 0.75 * len(edits)), 10))
    for ax, (key, pred, title) in zip(axes, PANELS):
        measured = [ratios(result, r)[key] for r in edits]
        predicted = [getattr(r, pred) for r in edits]
        x = range(len(edits))
        ax.bar([i - 0.2 for i in x], [m or 0 for m in measured], width=0.4, label="measured")
        ax.bar([i + 0.2 for i in x], [p or 0 for p in predicted], width=0.4, label="accounts", alpha=0.6)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels if ax is axes[-1] else [], fontsize=7)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"what an edit buys where it is served ({result.cpu})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
