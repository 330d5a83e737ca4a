"""The frontier's PNG: the share of the unedited model's KV bytes per token saved (x) against the score (y:
pass@1 with its Wilson interval drawn, or held-out perplexity), each row labelled, the KV frontier joined."""

from __future__ import annotations

from pathlib import Path

from headcount.frontier.result import Frontier


def _y(frontier: Frontier, row) -> float | None:
    if frontier.score == "pass_at_1":
        return row.pass_at_1
    s = row.score("perplexity")
    return None if s is None else (-s if row.perplexity else s)


def _labels(ax, points) -> None:
    """Each row's label beside its marker, moved up where rows at the same saving would print over each other
    (a quarter of the KV cache saved three ways lands three labels on one spot): labels at one x, taken in order
    of y, stay at least GAP of the y range apart."""
    low, high = ax.get_ylim()  # after the markers and intervals are drawn: the axis a label's height is read on
    span = (high - low) or 1.0
    gap, width = 0.03 * span, 0.02
    placed: list[tuple[float, float]] = []  # (x, label y) already printed
    for x, y, r in sorted(points, key=lambda p: (p[0], p[1])):
        at = y
        for px, py in sorted(placed, key=lambda q: q[1]):
            if abs(px - x) < width and abs(py - at) < gap:
                at = py + gap
        placed.append((x, at))
        ax.annotate(r.label, (x, y), xytext=(x + 0.005, at + 0.005 * span), textcoords="data", fontsize=7)


def plot(frontier: Frontier, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = frontier.rows[0].kv_bytes_per_token
    fig, ax = plt.subplots(figsize=(8, 5.5))
    points = [(1 - r.kv_bytes_per_token / base, _y(frontier, r), r) for r in frontier.rows]
    points = [p for p in points if p[1] is not None]
    for healed, marker, colour in ((False, "o", "tab:blue"), (True, "s", "tab:orange")):
        mine = [p for p in points if p[2].healed == healed]
        if not mine:
            continue
        xs, ys = [p[0] for p in mine], [p[1] for p in mine]
        if frontier.score == "pass_at_1":
            lo = [p[1] - p[2].pass_at_1_ci95[0] for p in mine]
            hi = [p[2].pass_at_1_ci95[1] - p[1] for p in mine]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=marker, color=colour, capsize=3,
                        label="healed" if healed else "unhealed")
        else:
            ax.plot(xs, ys, marker, color=colour, label="healed" if healed else "unhealed")
    _labels(ax, points)
    edge = sorted((p for p in points if p[2].frontier), key=lambda p: p[0])
    if edge:
        ax.plot([p[0] for p in edge], [p[1] for p in edge], "-", color="black", lw=1, alpha=0.6, label="frontier")
    ax.set_xlabel("KV cache bytes per token saved (share of the unedited model's)")
    if frontier.score == "pass_at_1":
        ax.set_ylabel(f"pass@1 on {frontier.task} (95% interval)")
    else:
        ax.set_ylabel("held-out perplexity (geometric mean over domains; lower is better)")
    ax.set_title(f"{frontier.model}: what each edit saves against what it keeps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
