"""prune / prune_to: remove attention heads from a whole model, in place, with compensation.

    prune(model, heads, *, mode="query", compensate="lstsq", calibration=None) -> PruneResult
    prune_to(model, fraction, *, order="reconstruction", mode="query", compensate="lstsq",
             uniform=False, calibration=None) -> PruneResult

heads: (layer, head) pairs or {layer: [heads]}, ORIGINAL head indices (attn.kept_heads maps them).
mode="query": any query heads; a KV head goes when no query head reads it any more.
mode="group": whole GQA groups (query heads with their KV head): shrinks the KV cache.
Removing every remaining head of a layer is refused (ValueError); prune_to never does it.
Compensation and the sequential refit: compensate.py. Which heads: plan.py.

calibration: None = the default: for a decoder "mixed" (half the default corpus's calibration prose, half
code-like text, headcount.data.code_corpus; `calibration_windows` windows of `window` tokens), chosen because
it transfers: at 20% removed on smollm2 it costs prose +7% where prose calibration costs +5%, and code-like
text +7% where prose calibration costs +19% (docs/pruning.md); for an encoder the default corpus's
calibration sentences. "prose" = the default corpus's calibration part alone (the default before); a string
or list of strings; or ready inputs (a LongTensor [N, T] of windows, or [(input_ids, attention_mask), ...]).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from headcount.surgery.pruning import plan as _plan
from headcount.surgery.pruning.compensate import COMPENSATIONS, DEFAULT_RIDGE, DEFAULT_TARGET, prune_sequential
from headcount.surgery.pruning.compensate import refit_bias as _refit_bias

Tensor = torch.Tensor

DEFAULT_MAX_SHARE = None  # prune_to's per-layer cap (docs/pruning.md, "Holding on GQA models")
DEFAULT_PROTECT = "auto"  # prune_to's protected layers: where the massive activations form (docs/pruning.md)
CALIBRATION_WINDOWS = 8  # the curve in docs/pruning.md was measured with 8; 16 doubles the cost
WINDOW = 512
CALIBRATION_SENTENCES = 256
DEFAULT_CALIBRATION = None  # decoders: "mixed"; encoders: the default corpus's calibration sentences

# Forward-pass equivalents per calibration token when the scores do not say (HeadScores.info carries
# "forward_equivalents" for gradient / reconstruction: 1 forward + 1 input-gradient backward through the frozen
# weights + the layers grad_memory recomputed, 2..3); confidence one forward with weights; random none. Ablation runs one forward per head per layer group
# (heads_per_forward at a time) and is not a default anywhere; it is counted by its batches' repeats.
SCORING_PASSES = {"gradient": 2.0, "reconstruction": 2.0, "confidence": 1.0, "random": 0.0}
# The sequential refit calls each layer on the pruned stream twice (unpruned to capture, pruned to move on)
# and, for targets that need it, once on the original stream: 3 (output / residual) or 2 (local).
REFIT_PASSES = {"output": 3.0, "residual": 3.0, "local": 2.0}


@dataclass
class PruneResult:
    """What a prune did: heads removed per layer (original indices) and the before/after accounts."""

    mode: str
    compensate: str
    removed: dict[int, list[int]]
    heads_before: int
    heads_after: int
    kv_heads_before: int
    kv_heads_after: int
    params_before: int
    params_after: int
    kv_bytes_per_token_before: int
    kv_bytes_per_token_after: int
    calibration_tokens: int = 0
    seconds: float = 0.0  # the work forward_equivalents counts: prune's refit, and prune_to's ordering with it
    ridge: float | None = None
    target: str | None = None
    layer_fits: list = field(default_factory=list)  # compensate.LayerFit per pruned layer
    order: str | None = None
    fraction: float | None = None
    uniform: bool | None = None
    # cost in forward passes over the calibration tokens, by construction (machine-independent): scoring
    # (SCORING_PASSES[order] x its tokens / calibration tokens) + the refit's layer calls (REFIT_PASSES)
    forward_equivalents: float = 0.0
    method: str | None = None  # "retraining-free" (prune_to's order), "l0" (trained gates, gates.py), None: given heads
    protected: list | None = None  # prune_to: layers that lost no head (protect), None: not prune_to / uniform
    max_share: float | None = None  # prune_to: the per-layer cap used
    refit_bias: bool | None = None  # lstsq: whether the refit fitted an o_proj bias (False on Gemma 3)
    gates: object | None = None  # the GateResult of method "l0"

    @property
    def heads_removed(self) -> int:
        return sum(len(v) for v in self.removed.values())

    def to_json(self) -> dict:
        return {
            "mode": self.mode, "compensate": self.compensate, "order": self.order, "fraction": self.fraction,
            "uniform": self.uniform, "heads_removed": self.heads_removed,
            "removed": {str(k): v for k, v in self.removed.items()},
            "heads_before": self.heads_before, "heads_after": self.heads_after,
            "kv_heads_before": self.kv_heads_before, "kv_heads_after": self.kv_heads_after,
            "params_before": self.params_before, "params_after": self.params_after,
            "kv_bytes_per_token_before": self.kv_bytes_per_token_before,
            "kv_bytes_per_token_after": self.kv_bytes_per_token_after,
            "calibration_tokens": self.calibration_tokens, "seconds": round(self.seconds, 3),
            "forward_equivalents": round(self.forward_equivalents, 2),
            "ridge": self.ridge, "target": self.target,
            "layer_fits": [f.to_json() for f in self.layer_fits], "method": self.method,
            "protected": self.protected, "max_share": self.max_share, "refit_bias": self.refit_bias,
            **({"gates": self.gates.to_json()} if self.gates is not None else {}),
        }


# ------------------------------------------------------------------------------------------ accounts
def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def kv_bytes_per_token(model) -> int:
    """KV cache bytes per token (batch 1), summed over layers, from each layer's KVCache.nbytes."""
    return sum(layer.attn.new_cache(1, 1).nbytes for layer in model.layers)


def count_heads(model) -> tuple[int, int]:
    return (sum(layer.attn.n_heads for layer in model.layers), sum(layer.attn.n_kv_heads for layer in model.layers))


# --------------------------------------------------------------------------------------- calibration
def calibration_batches(model, calibration=DEFAULT_CALIBRATION, *, calibration_windows: int = CALIBRATION_WINDOWS,
                        window: int = WINDOW, batch_size: int = 4) -> list[tuple[Tensor, Tensor | None]]:
    """Calibration inputs as [(input_ids [B, T], attention_mask [B, T] or None), ...]: prune's argument names
    for the one calibration path, headcount.analysis.batches.calibration_batches."""
    from headcount.analysis.batches import calibration_batches as batches

    if isinstance(calibration_windows, bool) or not isinstance(calibration_windows, int) or calibration_windows < 1:
        raise ValueError(f"calibration_windows: expected a positive int, got {calibration_windows!r}")
    calibration = resolve_default(model, calibration)
    return batches(model, calibration, n_windows=calibration_windows, window=window, batch_size=batch_size,
                   n_sentences=CALIBRATION_SENTENCES * calibration_windows // CALIBRATION_WINDOWS)


def resolve_default(model, calibration):
    """None -> "mixed" for a decoder (see the module doc); "prose" -> the default corpus alone (None below)."""
    if calibration is None:
        return "mixed" if hasattr(model, "lm_head") else None
    if isinstance(calibration, str) and calibration == "prose":
        return None
    return calibration


# ---------------------------------------------------------------------------------------------- prune
def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {tuple(allowed)}, got {value!r}")


def prune(model, heads, *, mode: str = "query", compensate: str = "lstsq", calibration=DEFAULT_CALIBRATION,
          calibration_windows: int = CALIBRATION_WINDOWS, window: int = WINDOW, ridge: float = DEFAULT_RIDGE,
          target: str = DEFAULT_TARGET, prior: str = "original", progress: bool = True, group=None,
          bias: bool | None = None) -> PruneResult:
    """Remove `heads` (original indices) from `model` in place, compensating; see the module doc.

    bias: may the lstsq refit add an o_proj bias? None = yes, except for Gemma 3, whose llama.cpp graph has
    no place for one (compensate.refit_bias); False = the bias stays what it was (none on the zoo's models).

    Everything is checked before the first weight changes: a bad head list leaves the model as it was.
    """
    _plan.check_mode(mode)
    _check_choice("compensate", compensate, COMPENSATIONS)
    removed = _plan.normalize_heads(model, heads)
    if mode == "group":
        _plan.check_groups(model, removed)
    start = time.perf_counter()
    heads_before, kv_before = count_heads(model)
    params_before, kv_bytes_before = n_params(model), kv_bytes_per_token(model)
    fits, tokens = [], 0
    if removed and compensate == "none":
        for layer, current in _plan.to_current(model, removed).items():
            model.layers[layer].attn.prune_heads(current)
    elif removed:
        batches = calibration_batches(model, calibration, calibration_windows=calibration_windows, window=window)
        batches = _shard(model, batches, group)
        was_training = model.training
        model.eval()
        try:
            fits = prune_sequential(model, removed, batches, compensate=compensate, ridge=ridge, target=target,
                                    prior=prior, progress=progress, group=group, bias=bias)
        finally:
            model.train(was_training)
        tokens = fits[0].tokens if fits else 0
    heads_after, kv_after = count_heads(model)
    refit = 0.0 if not removed or compensate == "none" else (REFIT_PASSES.get(target, 3.0) if compensate == "lstsq"
                                                             else 2.0)
    return PruneResult(mode, compensate, removed, heads_before, heads_after, kv_before, kv_after, params_before,
                       n_params(model), kv_bytes_before, kv_bytes_per_token(model), tokens,
                       time.perf_counter() - start, ridge if compensate == "lstsq" else None,
                       target if compensate == "lstsq" else None, fits, forward_equivalents=refit,
                       refit_bias=(None if compensate != "lstsq" else
                                   _refit_bias(model) if bias is None else bool(bias)))


def _shard(model, batches, group):
    """This rank's calibration batches under data parallelism: windows r::world (decoders, re-batched by 4)
    or sentence batches r::world (encoders)."""
    from headcount.distributed import DataParallel

    dp = DataParallel(group)
    if dp.world == 1:
        return batches
    if hasattr(model, "lm_head") and all(mask is None for _, mask in batches):
        ids = dp.shard(torch.cat([ids for ids, _ in batches]))
        return [(ids[i:i + 4], None) for i in range(0, ids.shape[0], 4)]
    return dp.shard(batches, "calibration sentence batches")


def resolve_scores(model, order, *, calibration=DEFAULT_CALIBRATION, seed: int = 0,
                   calibration_windows: int = CALIBRATION_WINDOWS, window: int = WINDOW,
                   group=None) -> tuple[dict, str]:
    """({(layer, original head): score}, a name) from a HeadScores, a method name, or "random".

    A method is scored on the SAME calibration inputs the refit uses (the one calibration path), so
    `calibration="mixed"` or a user's text chooses the heads as well as fitting o_proj."""
    scores, name, _ = _scores_and_cost(model, order, calibration=calibration, seed=seed,
                                       calibration_windows=calibration_windows, window=window, group=group)
    return scores, name


def _scores_and_cost(model, order, *, calibration, seed, calibration_windows, window, group):
    """resolve_scores plus the scoring's cost in forward equivalents of the calibration tokens."""
    if isinstance(order, str):
        if order == "random":
            return _plan.random_scores(model, seed), f"random(seed={seed})", 0.0
        from headcount.analysis import importance
        hs = importance(model, method=order, progress=False, group=group, **scoring_inputs(
            model, calibration, calibration_windows=calibration_windows, window=window))
        return _plan.head_scores(model, hs), order, hs.info.get("forward_equivalents", SCORING_PASSES.get(order, 0.0))
    return _plan.head_scores(model, order), getattr(order, "method", "scores"), 0.0


def scoring_inputs(model, calibration, *, calibration_windows: int = CALIBRATION_WINDOWS,
                   window: int = WINDOW) -> dict:
    """importance() keywords for the calibration batches: windows [N, T] for a decoder, batches for an encoder."""
    batches = calibration_batches(model, calibration, calibration_windows=calibration_windows, window=window)
    if hasattr(model, "lm_head"):
        ids = torch.cat([ids for ids, _ in batches])
        return {"windows": ids, "max_windows": None, "window": ids.shape[1]}
    return {"windows": [(ids, mask) for ids, mask in batches], "max_sentences": 10**9}


def prune_to(model, fraction: float, *, order="reconstruction", mode: str = "query", compensate: str = "lstsq",
             uniform: bool = False, calibration=DEFAULT_CALIBRATION, seed: int = 0, protect=DEFAULT_PROTECT,
             max_share=DEFAULT_MAX_SHARE, **kwargs) -> PruneResult:
    """Remove `fraction` of the query heads (or of the GQA groups, mode="group"), least important first.

    order: a HeadScores (headcount.analysis.importance), a method name computed here on the
    calibration text, or "random" (seeded by `seed`). uniform=True: the same number from every
    layer, and in query mode the same number from every GQA group. Other keywords go to prune().
    protect: layers that lose no head. "auto" (decoders, when something calibrates): the layers up to the one
        where the residual stream's massive activations form (headcount.analysis.outliers, first batch);
        an order measures each layer's error alone, and an error there is not small downstream
        (qwen2.5-coder-0.5b lost 79% at 10% removed, 8 of layer 0's 14 heads among them). () = none.
    max_share: at most floor(max_share x a layer's heads) from one layer (None: no cap). Both limits are
    lifted, cap first, only when they leave fewer heads than `fraction` asks; neither applies to uniform.
    """
    from headcount.models.dropped import refuse_dropped
    refuse_dropped(model, "prune_to scores the heads of every layer: prune before dropping attention "
                   "(frontier: prune:F+drop:F), or name the heads to remove (prune)")
    _plan.check_mode(mode)
    _check_choice("compensate", compensate, COMPENSATIONS)
    _plan._check_fraction(fraction)
    max_share = _plan.check_max_share(max_share)
    if not (isinstance(protect, str) and protect == "auto"):
        if isinstance(protect, (str, bytes)) or not hasattr(protect, "__iter__") or any(
                isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < len(model.layers) for l in protect):
            raise ValueError(f"protect: expected 'auto' or layer indices in [0, {len(model.layers)}), got {protect!r}")
        protect = sorted(set(protect))
    calibration_windows = kwargs.get("calibration_windows", CALIBRATION_WINDOWS)
    window = kwargs.get("window", WINDOW)
    ready = isinstance(calibration, Tensor) or (isinstance(calibration, list) and calibration
                                                and isinstance(calibration[0], tuple))
    needs = compensate != "none" or (isinstance(order, str) and order != "random")
    if not ready and needs:  # texts (or None, "mixed"): batch once, then score and refit on the same batches
        calibration = calibration_batches(model, calibration, calibration_windows=calibration_windows, window=window)
    start = time.perf_counter()
    scores, name, scoring = _scores_and_cost(model, order, calibration=calibration, seed=seed,
                                             calibration_windows=calibration_windows, window=window,
                                             group=kwargs.get("group"))
    if isinstance(protect, str):  # "auto": where the massive activations form (decoders; encoders: none), read on
        # the calibration batches; with order "random" and compensate "none" nothing calibrates: none protected
        protect = [] if uniform or not needs or not hasattr(model, "lm_head") else \
            _protected_layers(model, calibration)
    ordering_seconds = time.perf_counter() - start
    chosen = _plan.plan_fraction(model, fraction, scores, mode=mode, uniform=bool(uniform), protect=protect,
                                 max_share=max_share)
    result = prune(model, chosen, mode=mode, compensate=compensate, calibration=calibration, **kwargs)
    result.order, result.fraction, result.uniform = name, float(fraction), bool(uniform)
    result.protected, result.max_share = (None, None) if uniform else (list(protect), max_share)
    result.method = "retraining-free"
    result.forward_equivalents += scoring
    result.seconds += ordering_seconds  # seconds and forward_equivalents cover the same work: order + refit
    return result


def _protected_layers(model, calibration) -> list[int]:
    """prune_to's protect="auto": analysis.outliers on the first calibration batch (a [B, T] of ids)."""
    from headcount.analysis.outliers import residual_outliers

    if isinstance(calibration, Tensor):
        ids = calibration[:4]
    elif isinstance(calibration, list) and calibration and isinstance(calibration[0], tuple):
        ids = calibration[0][0]
    else:
        ids = calibration_batches(model, calibration)[0][0]
    return residual_outliers(model, ids, stop_when_formed=True).protected  # the layers past it are not needed
