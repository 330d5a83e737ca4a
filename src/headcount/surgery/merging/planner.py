"""merge_plan: which layers to merge, and to how many KV heads, for a KV-cache budget.

    plan = merge_plan(model, 0.67)           # keep at most 67% of the current KV bytes per token
    plan = merge_plan(model, 12_000)         # or at most 12,000 bytes per token (an int)
    merge_kv(model, plan)                    # apply it (plan.kv_heads = {layer: n_kv_heads})

Sensitivity: for every layer l and every smaller KV-head count n, layer l alone is merged (the aware
merge, fit on calibration windows) and the calibration loss is measured on OTHER calibration windows
(decoders: next-token NLL; encoders: 1 - cosine of the mean-pooled sentence embeddings to the
unmodified model's). Only the layers from l up are run for that (the stream below l is unchanged).
The plan then minimises the sum of the loss increases subject to the budget: a multiple-choice
knapsack solved exactly by dynamic programming over the KV bytes per token (a few hundred states).
Summing single-layer increases ignores interactions; the loss of the whole plan is measured when it is
applied (merge_bench prints both).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from headcount.surgery.merging.kv_merge import merge_layer
from headcount.surgery.merging.stream import Stream, calibration_batches, is_decoder, sentence_embeddings


@dataclass
class MergePlan:
    budget: float  # as given: a fraction (float <= 1) or bytes per token (int)
    kv_heads: dict[int, int]  # layer -> n_kv_heads after merging (only layers that change)
    kv_bytes_per_token_before: int
    kv_bytes_per_token_after: int
    predicted_loss_increase: float
    base_loss: float
    sensitivity: dict[int, dict[int, float]] = field(default_factory=dict)  # layer -> {n: loss increase}
    method: str = "aware"

    def to_json(self) -> dict:
        data = asdict(self)
        data["kv_heads"] = {str(k): v for k, v in self.kv_heads.items()}
        data["sensitivity"] = {str(k): {str(n): s for n, s in v.items()} for k, v in self.sensitivity.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> "MergePlan":
        data = dict(data)
        data["kv_heads"] = {int(k): int(v) for k, v in data["kv_heads"].items()}
        data["sensitivity"] = {int(k): {int(n): float(s) for n, s in v.items()}
                               for k, v in data.get("sensitivity", {}).items()}
        return cls(**data)


def _layer_bytes(attn, n: int) -> int:
    itemsize = attn.qkv_proj.weight.element_size()
    return 2 * n * attn.head_dim * itemsize


def _budget_bytes(model, budget) -> int:
    current = sum(_layer_bytes(layer.attn, layer.attn.n_kv_heads) for layer in model.layers)
    floor = sum(_layer_bytes(layer.attn, 1) for layer in model.layers)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"budget: expected a fraction of the KV cache to keep (a float in (0, 1]) or bytes per "
                        f"token (an int), got {budget!r}")
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"budget: expected a fraction in (0, 1] of the current {current} KV bytes per token, "
                             f"got {budget}")
        limit = int(budget * current + 1e-9)
    else:
        limit = budget
    if limit < floor:
        raise ValueError(f"budget: {limit} KV bytes per token is below what every-layer MQA reaches ({floor} of "
                         f"{current}); expected at least {floor} bytes or {floor / current:.3f} of the cache")
    return limit


def sensitivity(model, *, calibration=None, method: str = "aware", n_windows: int = 4, n_eval_windows: int = 2,
                window: int = 512, candidates=None, progress: bool = True, **merge_options) -> tuple[float, dict]:
    """(base loss, {layer: {n: loss increase when only this layer is merged to n KV heads}})."""
    from tqdm.auto import tqdm

    if method not in ("aware", "mean"):
        raise ValueError(f"method: expected 'aware' or 'mean', got {method!r}")
    if is_decoder(model):
        batches = calibration_batches(model, calibration, n_windows=n_windows + n_eval_windows, window=window,
                                      batch_size=2)
        ids = torch.cat([b.ids for b in batches])
        if ids.shape[0] < 2:
            raise ValueError("calibration: need at least 2 windows (one to fit, one to measure)")
        n_fit = max(1, min(n_windows, ids.shape[0] - n_eval_windows))
        fit = calibration_batches(model, ids[:n_fit], batch_size=2)
        evaluate = calibration_batches(model, ids[n_fit:], batch_size=2)
    else:
        batches = calibration_batches(model, calibration, n_sentences=384)
        if len(batches) < 2:
            raise ValueError("calibration: need at least 2 batches of sentences (one to fit, one to measure)")
        n_eval = max(1, len(batches) // 3)
        fit, evaluate = batches[:-n_eval], batches[-n_eval:]
    reference = sentence_embeddings(model, evaluate)
    was_training = model.training
    model.eval()
    fit_stream, eval_stream = Stream(model, fit), Stream(model, evaluate)
    base = eval_stream.tail_loss(reference)
    table: dict[int, dict[int, float]] = {}
    try:
        for i in tqdm(range(len(model.layers)), desc="merge sensitivity", disable=None if progress else True,
                      leave=False):
            layer = model.layers[i]
            original = layer.attn
            n_kv = original.n_kv_heads
            options = [n for n in (candidates or range(1, n_kv)) if 1 <= n < n_kv]
            if method == "mean":
                options = [n for n in options if n_kv % n == 0 and original.is_uniform]
            caps = fit_stream.layer_io(i) if options and method == "aware" else None
            table[i] = {}
            for n in options:
                trial = copy.deepcopy(original)
                if method == "aware":
                    merge_layer(trial, caps, [c["y"] for c in caps], n, **merge_options)
                else:
                    trial.merge_kv_heads(n)
                layer.attn = trial
                try:
                    table[i][n] = eval_stream.tail_loss(reference) - base
                finally:
                    layer.attn = original
            fit_stream.advance(i)
            eval_stream.advance(i)
    finally:
        model.train(was_training)
    return base, table


def _solve(model, table: dict[int, dict[int, float]], limit: int) -> tuple[dict[int, int], float, int]:
    """Minimise the summed loss increase with total KV bytes <= limit (exact DP over byte totals)."""
    states: dict[int, tuple[float, dict]] = {0: (0.0, {})}
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        choices = {attn.n_kv_heads: 0.0, **table.get(i, {})}
        new: dict[int, tuple[float, dict]] = {}
        for total, (cost, picks) in states.items():
            for n, inc in choices.items():
                key = total + _layer_bytes(attn, n)
                value = cost + max(float(inc), 0.0)
                if key not in new or value < new[key][0]:
                    new[key] = (value, {**picks, i: n})
        states = new
    feasible = [(cost, total, picks) for total, (cost, picks) in states.items() if total <= limit]
    if not feasible:
        raise ValueError(f"budget: no plan reaches {limit} KV bytes per token with the candidate head counts")
    cost, total, picks = min(feasible, key=lambda t: (t[0], -t[1]))  # ties: keep more heads
    return {i: n for i, n in picks.items() if n != model.layers[i].attn.n_kv_heads}, cost, total


def merge_plan(model, budget, *, calibration=None, method: str = "aware", sensitivity_from: "MergePlan | None" = None,
               n_windows: int = 4, n_eval_windows: int = 2, window: int = 512, candidates=None,
               progress: bool = True) -> MergePlan:
    """The cheapest set of per-layer KV-head counts (by calibration sensitivity) within `budget`.

    budget: a float in (0, 1] = the fraction of the current KV bytes per token to keep, or an int =
        KV bytes per token. sensitivity_from: a previous plan of the same model whose sensitivity table
        is reused (a curve over budgets measures it once).
    """
    limit = _budget_bytes(model, budget)
    current = sum(_layer_bytes(layer.attn, layer.attn.n_kv_heads) for layer in model.layers)
    if sensitivity_from is not None:
        if not isinstance(sensitivity_from, MergePlan):
            raise TypeError(f"sensitivity_from: expected a MergePlan, got {type(sensitivity_from).__name__}")
        if sensitivity_from.kv_bytes_per_token_before != current:
            raise ValueError("sensitivity_from: that plan was measured on a model with a different KV cache "
                             f"({sensitivity_from.kv_bytes_per_token_before} bytes per token, this one {current})")
        base, table = sensitivity_from.base_loss, sensitivity_from.sensitivity
    else:
        base, table = sensitivity(model, calibration=calibration, method=method, n_windows=n_windows,
                                  n_eval_windows=n_eval_windows, window=window, candidates=candidates,
                                  progress=progress)
    picks, cost, total = _solve(model, table, limit)
    return MergePlan(budget, picks, current, total, cost, base, table, method)
