"""drop_attention: remove whole attention sublayers from a decoder, in place.

    result = drop_attention(model, fraction=0.25)                 # a quarter of the layers, cheapest first
    result = drop_attention(model, layers=[13, 18])               # these layers
    order = drop_order(model, by="loss")                          # measured once ...
    drop_attention(copy, fraction=0.25, order=order)              # ... applied to several copies

Each dropped layer loses every head, its K/V cache and the norms that fed only its attention; its MLP stays and
the residual passes through (models/dropped.py). `fraction` F drops round(F x n_layers) layers (at least one)
among those that still have attention, in the order's sequence; the KV bytes per token before and after are the
caches the model allocates (KVCache.nbytes, as prune's and merge-kv's accounts).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from headcount.arguments import ArgumentError
from headcount.surgery.dropping.choose import N_WINDOWS, DropOrder, _check, drop_order


@dataclass
class DropResult:
    dropped: list[int]  # the layers whose attention this edit removed, ascending
    by: str | None  # the order's measure; None when `layers` named them
    scores: dict[int, float]  # the order's score of every candidate layer (empty when `layers` named them)
    order: list[int]  # the order's layers, cheapest first (empty when `layers` named them)
    kv_bytes_per_token_before: int
    kv_bytes_per_token_after: int
    params_before: int
    params_after: int
    fraction: float | None = None
    seconds: float = 0.0  # the whole edit, the order's measurement included
    order_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        data = asdict(self)
        data["scores"] = {str(k): v for k, v in self.scores.items()}
        data["seconds"] = round(self.seconds, 3)
        data["order_seconds"] = round(self.order_seconds, 3)
        return data

    @property
    def layers(self) -> list[int]:
        """The dropped layers (the name the frontier's rows read)."""
        return self.dropped


def kv_bytes_per_token(model) -> int:
    """KV cache bytes per token (batch 1): the caches the model allocates, a dropped layer's holding none."""
    return sum(cache.nbytes for cache in model.new_cache(1, 1))


def layer_count(n_layers: int, fraction) -> int:
    """How many layers `fraction` of n_layers drops: round half up, at least one."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise ArgumentError("fraction", f"expected a number in (0, 1), the share of the {n_layers} layers whose "
                                        f"attention goes, got {fraction!r}")
    return max(1, math.floor(fraction * n_layers + 0.5))


def check_layers(model, layers) -> list[int]:
    """The layer list, checked: indices the model has, each once, each still with attention."""
    from headcount.models.dropped import dropped_layers

    n = len(model.layers)
    try:
        wanted = [int(i) for i in layers]
    except (TypeError, ValueError):
        raise ArgumentError("layers", f"expected layer indices in 0..{n - 1}, got {layers!r}") from None
    if not wanted:
        raise ArgumentError("layers", f"expected at least one layer index in 0..{n - 1}, got none")
    bad = [i for i in wanted if not 0 <= i < n]
    if bad:
        raise ArgumentError("layers", f"expected layer indices in 0..{n - 1} (the model has {n} layers), "
                                      f"got {bad[0]}")
    if len(set(wanted)) != len(wanted):
        raise ArgumentError("layers", f"expected each layer once, got {sorted(wanted)}")
    gone = sorted(set(wanted) & set(dropped_layers(model)))
    if gone:
        raise ArgumentError("layers", f"layer {gone[0]}'s attention is already dropped")
    if len(set(wanted) | set(dropped_layers(model))) == n:
        raise ArgumentError("layers", f"that would drop the attention of all {n} layers; keep at least one")
    return sorted(wanted)


def plan_drop(model, fraction=None, layers=None, by: str = "similarity", order: DropOrder | None = None,
              calibration=None, n_windows: int = N_WINDOWS, progress: bool = False) -> tuple[list[int], DropOrder | None]:
    """(the layers drop_attention would drop, the order used or measured), changing nothing."""
    from headcount.models.dropped import attention_layers

    _check(model, by)
    if (fraction is None) == (layers is None):
        raise ValueError("fraction, layers: expected exactly one of them (a share of the layers, or which layers)"
                         f", got fraction={fraction!r}, layers={layers!r}")
    if layers is not None:
        return check_layers(model, layers), None
    n = len(model.layers)
    count = layer_count(n, fraction)
    live = attention_layers(model)
    if count >= len(live):
        raise ArgumentError("fraction", f"{fraction} of {n} layers is {count}, and {len(live)} still have attention; "
                                        "keep at least one")
    if order is None:
        order = drop_order(model, by=by, calibration=calibration, n_windows=n_windows, progress=progress)
    elif not isinstance(order, DropOrder):
        raise TypeError(f"order: expected a DropOrder (drop_order's), got {type(order).__name__}")
    elif order.n_layers != n:
        raise ValueError(f"order: measured on a model of {order.n_layers} layers, this one has {n}")
    candidates = [i for i in order.layers if i in set(live)]
    if len(candidates) < count:
        raise ValueError(f"order: ranks {len(candidates)} of the layers that still have attention, {count} wanted")
    return sorted(candidates[:count]), order


def drop_attention(model, fraction=None, layers=None, by: str = "similarity", order: DropOrder | None = None,
                   calibration=None, *, n_windows: int = N_WINDOWS, progress: bool = False) -> DropResult:
    """Drop the attention sublayers of `layers`, or of the cheapest `fraction` of the layers by `order` (measured
    here with drop_order(by=...) when not given), in place. Everything is checked before the first change."""
    start = time.perf_counter()
    chosen, used = plan_drop(model, fraction, layers, by, order, calibration, n_windows, progress)
    order_seconds = used.seconds if used is not None and order is None else 0.0
    kv_before, params_before = kv_bytes_per_token(model), sum(p.numel() for p in model.parameters())
    for i in chosen:
        model.layers[i].drop_attention()
    return DropResult(chosen, used.by if used is not None else None, dict(used.scores) if used is not None else {},
                      list(used.layers) if used is not None else [], kv_before, kv_bytes_per_token(model),
                      params_before, sum(p.numel() for p in model.parameters()),
                      fraction if layers is None else None, time.perf_counter() - start, order_seconds)

