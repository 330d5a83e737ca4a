"""HeadScores: one importance number per attention head, higher = more important.

    scores            [n_layers, max_heads] float tensor; a pruned layer with fewer heads is padded
                      with NaN past heads_per_layer[layer]
    method, source    how and on what text ("default corpus: calibration" or the caller's description)
    n_tokens          tokens the scores were computed on
    heads_per_layer   the current number of heads in each layer
    kept_heads        per layer, the ORIGINAL index of each current head (column j of layer l is the
                      head the unpruned model called kept_heads[l][j])
    normalized        True when each layer's scores were divided by their L2 norm
    order()           least important first, (layer, head) with CURRENT head indices (what
                      MultiHeadAttention.prune_heads takes); ties broken by (layer, head)
    to_json() -> dict (JSON-serialisable; NaN padding as null), from_json(dict | str): exact round trip
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch

Tensor = torch.Tensor


@dataclass
class HeadScores:
    scores: Tensor
    method: str
    source: str = "default corpus: calibration"
    n_tokens: int = 0
    heads_per_layer: tuple[int, ...] | None = None
    kept_heads: tuple[tuple[int, ...], ...] | None = None
    normalized: bool = False
    model: str | None = None
    info: dict = field(default_factory=dict)  # method-specific extras (all JSON-serialisable)

    def __post_init__(self):
        if not isinstance(self.scores, torch.Tensor) or self.scores.dim() != 2:
            raise ValueError(f"scores: expected a tensor [n_layers, n_heads], got "
                             f"{getattr(self.scores, 'shape', type(self.scores).__name__)}")
        self.scores = self.scores.detach().to("cpu", torch.float64)
        n_layers, width = self.scores.shape
        if self.heads_per_layer is None:
            self.heads_per_layer = tuple(width for _ in range(n_layers))
        self.heads_per_layer = tuple(int(n) for n in self.heads_per_layer)
        if len(self.heads_per_layer) != n_layers or any(not 0 <= n <= width for n in self.heads_per_layer):
            raise ValueError(f"heads_per_layer: expected {n_layers} counts in [0, {width}], got {self.heads_per_layer}")
        if self.kept_heads is None:
            self.kept_heads = tuple(tuple(range(n)) for n in self.heads_per_layer)
        self.kept_heads = tuple(tuple(int(h) for h in row) for row in self.kept_heads)
        if tuple(len(row) for row in self.kept_heads) != self.heads_per_layer:
            raise ValueError("kept_heads: expected one original index per current head in every layer")

    # ------------------------------------------------------------------------------------ shape
    @property
    def n_layers(self) -> int:
        return self.scores.shape[0]

    @property
    def n_heads(self) -> int:
        """The widest layer's head count (the padded width of `scores`)."""
        return self.scores.shape[1]

    def valid(self) -> Tensor:
        """[n_layers, n_heads] bool: True where a real head is (False on the NaN padding)."""
        cols = torch.arange(self.n_heads)
        return cols[None, :] < torch.tensor(self.heads_per_layer)[:, None]

    def values(self) -> Tensor:
        """The scores of every real head, flattened layer by layer (padding left out)."""
        return self.scores[self.valid()]

    def heads(self) -> list[tuple[int, int]]:
        """Every real head as (layer, current head), in the order of values()."""
        return [(l, h) for l, n in enumerate(self.heads_per_layer) for h in range(n)]

    # ------------------------------------------------------------------------------------ order
    def order(self, *, original: bool = False) -> list[tuple[int, int]]:
        """Least important first; ties broken by (layer, head). original=True gives original head indices."""
        items = [(float(self.scores[l, h]), l, h) for l, h in self.heads()]
        items.sort(key=lambda t: (math.inf if math.isnan(t[0]) else t[0], t[1], t[2]))
        if original:
            return [(l, self.kept_heads[l][h]) for _, l, h in items]
        return [(l, h) for _, l, h in items]

    def normalize(self) -> "HeadScores":
        """A copy with each layer's scores divided by their L2 norm (Michel et al.'s normalisation)."""
        s = self.scores.clone()
        for l, n in enumerate(self.heads_per_layer):
            norm = torch.linalg.vector_norm(s[l, :n])
            if n and norm > 0:
                s[l, :n] = s[l, :n] / norm
        return HeadScores(s, self.method, self.source, self.n_tokens, self.heads_per_layer, self.kept_heads,
                          True, self.model, dict(self.info))

    def spearman(self, other: "HeadScores") -> float:
        """Spearman rank correlation over all real heads (both must cover the same heads)."""
        from scipy.stats import spearmanr
        if not isinstance(other, HeadScores):
            raise TypeError(f"other: expected HeadScores, got {type(other).__name__}")
        if other.heads_per_layer != self.heads_per_layer:
            raise ValueError(f"other: expected the same heads per layer {self.heads_per_layer}, "
                             f"got {other.heads_per_layer}")
        return float(spearmanr(self.values().numpy(), other.values().numpy()).statistic)

    # ------------------------------------------------------------------------------------- json
    def to_json(self) -> dict:
        rows = [[None if math.isnan(v) else v for v in row] for row in self.scores.tolist()]
        return {"method": self.method, "source": self.source, "n_tokens": int(self.n_tokens),
                "model": self.model, "normalized": bool(self.normalized), "n_layers": self.n_layers,
                "heads_per_layer": list(self.heads_per_layer), "kept_heads": [list(r) for r in self.kept_heads],
                "scores": rows, "order": [list(p) for p in self.order()], "info": self.info}

    @classmethod
    def from_json(cls, data: dict | str) -> "HeadScores":
        if isinstance(data, str):
            data = json.loads(data)
        if not isinstance(data, dict) or "scores" not in data or "method" not in data:
            raise ValueError("data: expected HeadScores JSON (a dict with 'scores' and 'method')")
        rows = [[math.nan if v is None else float(v) for v in row] for row in data["scores"]]
        return cls(torch.tensor(rows, dtype=torch.float64), data["method"], data.get("source", ""),
                   int(data.get("n_tokens", 0)), data.get("heads_per_layer"), data.get("kept_heads"),
                   bool(data.get("normalized", False)), data.get("model"), dict(data.get("info") or {}))

    def __repr__(self) -> str:
        return (f"HeadScores(method={self.method!r}, {self.n_layers} layers x {self.n_heads} heads, "
                f"{sum(self.heads_per_layer)} heads, {self.n_tokens:,} tokens, source={self.source!r})")
