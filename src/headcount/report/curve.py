"""The report's pruning section: the pruning curve with the project's default order and compensation, and C11's
point, prune_to(copy, 0.2) with prune_to's defaults.

    calibration_input(model, cal, sizes, n_windows, window=None) -> what every calibrating step gets
    pruning_section(model, *, calibration, meter, sizes, seed, scores, progress) -> report.json's "pruning"
    default_order() / default_compensation() -> prune_to's defaults (the report follows the project's)
"""

from __future__ import annotations

import inspect

from headcount.analysis.batches import calibration_batches
from headcount.models.copying import attention_copy
from headcount.report.meter import ReportMeter
from headcount.surgery import prune_to, pruning_curve

C11_FRACTION = 0.2  # the share of heads the report removes with prune_to's defaults (claim C11)


def prune_to_default(name: str):
    """prune_to's default for its parameter `name` (a KeyError if prune_to no longer has it: a real failure)."""
    return inspect.signature(prune_to).parameters[name].default


def calibration_input(model, cal, sizes, n_windows: int, window: int | None = None):
    """What every calibrating step gets as `calibration=`: for a decoder, `n_windows` token windows
    [N, window] of prune_to's DEFAULT calibration (or of the user's text), batched once through the one
    calibration path (analysis.batches.calibration_batches), so the order, the refit, the merge and the gates
    see the same tokens; for an encoder, the calibration sentences."""
    if not hasattr(model, "lm_head"):
        return cal
    import torch

    if cal is None:
        cal = prune_to_default("calibration")
    w = min(window or sizes.window, model.config.max_position)
    batches = calibration_batches(model, cal, n_windows=n_windows, window=w)
    return torch.cat([b[0] for b in batches])


def _point(model, fraction: float, order, comp, result: dict, quality) -> dict:
    point = {"fraction": fraction, "order": order, "compensate": comp, "mode": result.get("mode"),
             "heads_removed": result.get("heads_removed"), "heads_before": result.get("heads_before")}
    if hasattr(model, "lm_head"):
        point["ppl"] = quality
    else:
        point["ppl"], (point["cosine"], point["spearman"]) = None, quality
    return point


def pruning_section(model, *, calibration, meter: ReportMeter, sizes, seed: int, scores: dict | None,
                    progress: bool) -> dict:
    """The pruning curve and claim C11, both with the project's DEFAULT order and compensation:
    - C11: prune_to(copy, C11_FRACTION) with nothing but the calibration and its size given (the default order,
      mode and compensation are prune_to's own, whatever they become);
    - the curve: pruning_curve at the other fractions with prune_to's default order and compensation, scored
      ONCE (the importance step's scores when they are that order), and a random order with no compensation
      as the baseline (prune_to(order="random", compensate="none"): no scoring, no refit).
    -> PruningCurve JSON + {"default": the C11 point, "default_order", "default_compensate"} + the meter's domain
    keys for the C11 point (the three held-out domains before / after it, or why not)."""
    order, comp = prune_to_default("order"), prune_to_default("compensate")
    common = dict(calibration=calibration, held_out=meter.held, eval_windows=sizes.eval_windows, window=meter.window,
                  calibration_windows=sizes.importance_windows, progress=progress)
    if not hasattr(model, "lm_head"):
        common["calibration_windows"] = max(1, sizes.encoder_sentences // 16)
    points = []
    others = [f for f in sizes.pruning_fractions if abs(f - C11_FRACTION) > 1e-9]
    data = {}
    if others and isinstance(order, str):
        given = {order: scores[order]} if scores and order in scores else None
        data = pruning_curve(model, fractions=others, orders=(order,), compensations=(comp,), scores=given,
                             **common).to_json()
        points += data["points"]
        meter.know_base(data)
    for f in sizes.random_fractions:  # the baseline: a random order, nothing refit (no scoring, no calibration)
        pruned = attention_copy(model)
        r = prune_to(pruned, f, order="random", compensate="none", seed=seed, calibration=calibration,
                     progress=progress).to_json()
        points.append(_point(model, f, "random", "none", r, meter.headline(pruned)) | {"seed": seed})
        del pruned
    pruned = attention_copy(model)
    r = prune_to(pruned, C11_FRACTION, calibration=calibration, calibration_windows=common["calibration_windows"],
                 window=min(sizes.window, model.config.max_position), progress=progress).to_json()
    after = meter.quality(pruned)
    del pruned
    point = _point(model, C11_FRACTION, r.get("order") or order, r.get("compensate") or comp, r, after.headline) | {
        "via": "prune_to", "calibration_tokens": r.get("calibration_tokens"),
        "forward_equivalents": r.get("forward_equivalents")}
    points.append(point)
    return {"model": data.get("model", getattr(model, "name", None)),
            "base_ppl": meter.base.headline if hasattr(model, "lm_head") else None,
            "points": sorted(points, key=lambda p: (str(p["order"]), str(p["compensate"]), p["fraction"])),
            "calibration": data.get("calibration"), "held_out": data.get("held_out"), "default": point,
            "default_order": order, "default_compensate": comp, **meter.domains(after)}
