"""pruning_curve: quality against the share of heads removed, for several orders and compensations.

    pruning_curve(model, *, fractions=(0.1, ..., 0.5), orders=("gradient", "random"),
                  compensations=("none", "mean", "lstsq"), calibration=None, held_out=None, ...)
        -> PruningCurve, to_json() = {"model", "base_ppl", "points": [{"fraction", "order", "compensate",
                                      "mode", "heads_removed", "ppl", ...}], ...}

Orders are scored ONCE on the unpruned model from calibration text; every point prunes a fresh copy.
Quality is measured on held-out text only:
  decoders  perplexity on `eval_windows` windows of `window` tokens of each held-out text ("ppl" is
            the first text's; "ppl_by_text" has them all when `held_out` is a dict of named texts)
  encoders  embedding fidelity on held-out sentences: "cosine" = mean cosine between each sentence's
            pruned and unmodified embedding; "spearman" = Spearman correlation of all pairwise
            cosine similarities, pruned vs unmodified ("ppl" is null)
"random" orders are repeated over `seeds`; each point then carries its "seed".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from headcount.analysis.batches import is_decoder
from headcount.models.copying import attention_copy
from headcount.surgery.held_out import EVAL_WINDOWS, embed, evaluate, held_out_sets
from headcount.surgery.pruning import plan as _plan
from headcount.surgery.pruning.removal import (CALIBRATION_WINDOWS, DEFAULT_MAX_SHARE, DEFAULT_PROTECT, WINDOW,
                                              _protected_layers,
                                              calibration_batches, prune, prune_to, resolve_scores)

FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)


@dataclass
class PruningCurve:
    model: str
    base_ppl: float | None
    points: list[dict]
    base_by_text: dict = field(default_factory=dict)
    calibration: str = "default corpus: calibration"
    held_out: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"model": self.model, "base_ppl": self.base_ppl, "points": self.points,
                "base_by_text": self.base_by_text, "calibration": self.calibration, "held_out": self.held_out,
                "seconds": round(self.seconds, 1)}

    @classmethod
    def from_json(cls, data: dict) -> "PruningCurve":
        return cls(data["model"], data.get("base_ppl"), list(data["points"]), dict(data.get("base_by_text") or {}),
                   data.get("calibration", ""), list(data.get("held_out") or []), float(data.get("seconds", 0.0)))


def pruning_curve(model, *, fractions=FRACTIONS, orders=("gradient", "random"), compensations=("none", "mean", "lstsq"),
                  mode: str = "query", uniform: bool = False, calibration=None, held_out=None, seeds=(0, 1, 2),
                  eval_windows: int = EVAL_WINDOWS, window: int = WINDOW,
                  calibration_windows: int = CALIBRATION_WINDOWS, scores: dict | None = None, progress: bool = True,
                  log=None, protect=DEFAULT_PROTECT, max_share=DEFAULT_MAX_SHARE, **prune_kwargs) -> PruningCurve:
    """Prune fresh copies of `model` at each fraction x order x compensation; see the module doc.

    protect, max_share: prune_to's per-layer limits ("auto": the layers where the massive activations form,
    found once on the unpruned model), so the curve's points are what prune_to gives.

    scores: {order name: HeadScores} computed elsewhere (skips scoring them here).
    log: called with each finished point (a dict), for progress reporting.
    """
    start = time.perf_counter()
    _plan.check_mode(mode)
    fractions = [_plan._check_fraction(f) for f in fractions]
    if not orders or not compensations:
        raise ValueError("orders, compensations: expected at least one of each")
    sets = held_out_sets(model, held_out, eval_windows, window)
    references = None
    if not is_decoder(model):
        references = {name: embed(model, s) for name, s in sets.items()}
    base = evaluate(model, sets, references)
    first = next(iter(sets))
    points: list[dict] = []
    resolved = []
    for name in orders:
        if name == "random":
            resolved += [(name, seed, _plan.random_scores(model, seed)) for seed in seeds]
        else:
            given = (scores or {}).get(name)
            s, _ = resolve_scores(model, given if given is not None else name, calibration=calibration)
            resolved.append((name, None, s))
    if isinstance(protect, str):
        protect = [] if uniform or not is_decoder(model) else _protected_layers(
            model, calibration_batches(model, calibration, calibration_windows=calibration_windows, window=window))
    for name, seed, s in resolved:
        for comp in compensations:
            for frac in fractions:
                pruned = attention_copy(model)
                plan = _plan.plan_fraction(pruned, frac, s, mode=mode, uniform=uniform, protect=protect,
                                           max_share=max_share)
                result = prune(pruned, plan, mode=mode, compensate=comp, calibration=calibration,
                               calibration_windows=calibration_windows, window=window, progress=progress,
                               **prune_kwargs)
                q = evaluate(pruned, sets, references)
                point = {"fraction": frac, "order": name, "compensate": comp, "mode": mode,
                         "heads_removed": result.heads_removed}
                if seed is not None:
                    point["seed"] = seed
                if is_decoder(model):
                    point["ppl"] = q[first]
                    point["ppl_by_text"] = q
                else:
                    point["ppl"] = None
                    point["cosine"], point["spearman"] = q[first]
                    point["fidelity_by_text"] = {k: {"cosine": v[0], "spearman": v[1]} for k, v in q.items()}
                points.append(point)
                if log is not None:
                    log(point)
                del pruned
    cal_name = calibration if isinstance(calibration, str) and len(calibration) < 40 else \
        ("default corpus: calibration" if calibration is None else "given calibration")
    if is_decoder(model):
        return PruningCurve(getattr(model, "name", None) or "model", base[first], points, base, cal_name, list(sets),
                            time.perf_counter() - start)
    return PruningCurve(getattr(model, "name", None) or "model", None, points,
                        {k: {"cosine": v[0], "spearman": v[1]} for k, v in base.items()}, cal_name, list(sets),
                        time.perf_counter() - start)


def prune_to_copy(model, fraction: float, **kwargs):
    """A pruned deep copy of `model` (the original is left alone) and its PruneResult."""
    pruned = attention_copy(model)
    return pruned, prune_to(pruned, fraction, **kwargs)
