"""PNG figures for `headcount roles --png` and `headcount rank --png` (matplotlib, Agg). Plain dicts in
(the to_json() of RoleScores / RankResult), so the report can reuse them."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def roles_png(roles: dict, path: str | Path, title: str = "") -> None:
    """One [layers x heads] heatmap per role, labelled heads outlined."""
    import numpy as np

    plt = _plt()
    names = [r for r in roles if r != "meta"]
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    first = roles[names[0]]["scores"]
    n_layers, n_heads = len(first), max(len(r) for r in first)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * (1.0 + 0.32 * n_heads), rows * (1.2 + 0.16 * n_layers)),
                             squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        entry = roles[name]
        data = np.full((n_layers, n_heads), np.nan)
        for layer, row in enumerate(entry["scores"]):
            data[layer, :len(row)] = row
        im = ax.imshow(data, aspect="auto", cmap="magma", interpolation="nearest")
        for head in entry["heads"]:
            ax.add_patch(plt.Rectangle((head[1] - 0.5, head[0] - 0.5), 1, 1, fill=False, ec="cyan", lw=1.2))
        rule = ">" if name in ("previous_token", "duplicate_token", "induction") else ">="  # role_scores.STRICT
        ax.set_title(f"{name} ({rule}{entry['threshold']:g}: {len(entry['heads'])})", fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
        fig.colorbar(im, ax=ax, fraction=0.05)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rank_png(rank: dict, path: str | Path, title: str = "") -> None:
    """Each head's numerical rank at each length, the bound min(head_dim, n), the mean."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    heads = rank["heads"]
    ax.scatter([h["length"] for h in heads], [h["rank"] for h in heads], s=10, alpha=0.4, label="one head")
    s = rank["summary"]
    ax.plot([r["length"] for r in s], [r["bound"] for r in s], "k--", label="bound min(head_dim, n)")
    ax.plot([r["length"] for r in s], [r["mean_rank"] for r in s], "o-", color="C3", label="mean rank")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("numerical rank of Q K^T")
    ax.set_title(title or "per-head rank of the score matrix", fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, rank["tolerance"], fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
