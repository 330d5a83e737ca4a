"""Results are data: one ExperimentResult per run, one row dataclass per setting; the CLI only formats.

    ExperimentResult.to_json() -> {"experiment", "claim", "quick", "config", "results": [...], "details",
                                   "notes", "seconds"}

`results` holds one entry per setting with fixed keys, which report/trained.py and the tests read (multi-relation: n_heads, accuracy;
heads-sweep: n_heads, head_dim, ppl_mean, ppl_std; low-rank: head_dim, n, error; write-address:
variant, loss), plus the spread over seeds and anything else worth keeping.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


@dataclass
class ExperimentResult:
    """One experiment's run: its configuration, one row per setting, details and what it showed."""

    experiment: str
    claim: str
    quick: bool
    config: dict
    results: list
    details: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"experiment": self.experiment, "claim": self.claim, "quick": self.quick,
                "config": _plain(self.config), "results": _plain(self.results), "details": _plain(self.details),
                "notes": list(self.notes), "seconds": round(self.seconds, 2)}

    @classmethod
    def from_json(cls, data: dict) -> "ExperimentResult":
        """Rows come back as plain dicts (the keys of to_json)."""
        return cls(data["experiment"], data["claim"], data["quick"], data["config"], list(data["results"]),
                   dict(data.get("details", {})), list(data.get("notes", [])), float(data.get("seconds", 0.0)))

    def rows(self) -> list[dict]:
        """The settings as plain dicts, whether they are row dataclasses or already dicts."""
        return _plain(self.results)


@dataclass
class RelationRow:
    """multi-relation: one head count, accuracy over seeds (exact match on all k values)."""

    n_heads: int
    head_dim: int
    accuracy: float  # mean over seeds
    accuracy_std: float
    accuracy_seeds: list[float]
    slot_accuracy: float  # fraction of the k values right, mean over seeds
    attention_params: int  # headcount.cost
    attention_params_measured: int  # numel of the module's weights
    attention_flops: int
    score_elements: int
    train_seconds: float


@dataclass
class SweepRow:
    """heads-sweep: one head count at fixed d_model; held-out perplexity (bytes) over seeds."""

    n_heads: int
    head_dim: int
    ppl_mean: float
    ppl_std: float
    ppl_seeds: list[float]
    params: int
    seconds_per_step: float
    vaswani_ppl: float | None = None  # Vaswani et al. 2017 Table 3 (A), EN-DE dev, for the same n_heads
    vaswani_bleu: float | None = None


@dataclass
class RankRow:
    """low-rank: the best error one head of width head_dim reaches on full-rank targets of length n."""

    head_dim: int
    n: int
    error: float  # mean total-variation distance per row, mean over targets
    error_std: float
    kl: float  # mean KL(target || fit) per row
    svd_error: float  # the same error of the best rank-min(head_dim, n) logits by SVD (an independent check)
    n_heads: int = 1
    setting: str = "one head"


@dataclass
class AblationRow:
    """write-address (b): the same small model with and without a trained o_proj."""

    variant: str
    loss: float  # held-out NLL per byte, mean over seeds
    loss_std: float
    loss_seeds: list[float]
    ppl: float
    trainable_params: int
