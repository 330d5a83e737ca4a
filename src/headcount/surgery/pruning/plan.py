"""Which heads go: checking a user's head list, and turning an importance order into a removal plan.

Heads are named by (layer, ORIGINAL head index): the index the unpruned model gave the head, which
`attn.kept_heads` keeps across pruning. A plan is {layer: sorted original heads to remove}.

Group mode (whole GQA groups: the query heads that read one KV head, and that KV head):
  - prune(heads=...): the list must cover whole groups; a group listed in part is refused, naming
    the heads missing from it.
  - prune_to(...): a group's score is the SUM of its query heads' importance scores; the
    lowest-scoring groups go first.
"""

from __future__ import annotations

import random
from typing import Mapping

from headcount.arguments import ArgumentError

MODES = ("query", "group")


def layout(model) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per layer: (kept_heads (original indices), kv_head_of (current KV index of each current head))."""
    return [(tuple(layer.attn.kept_heads), tuple(layer.attn.kv_head_of)) for layer in model.layers]


def original_n_heads(model) -> int:
    return int(model.config.n_heads)


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    return mode


def normalize_heads(model, heads) -> dict[int, list[int]]:
    """(layer, head) pairs or {layer: [heads]} (original indices) -> {layer: sorted heads}, checked."""
    n_layers, n_orig = len(model.layers), original_n_heads(model)
    pairs: list[tuple[int, int]] = []
    if isinstance(heads, Mapping):
        for layer, hs in heads.items():
            if isinstance(hs, (int, str)) or not hasattr(hs, "__iter__"):
                raise TypeError(f"heads: expected {{layer: [heads]}}, got {{{layer!r}: {hs!r}}}")
            pairs.extend((layer, h) for h in hs)
    elif hasattr(heads, "__iter__") and not isinstance(heads, (str, bytes)):
        for item in heads:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TypeError(f"heads: expected (layer, head) pairs or {{layer: [heads]}}, got the item {item!r}")
            pairs.append(tuple(item))
    else:
        raise TypeError(f"heads: expected (layer, head) pairs or {{layer: [heads]}}, got {type(heads).__name__}")
    lay = layout(model)
    out: dict[int, list[int]] = {}
    seen: set[tuple[int, int]] = set()
    for layer, head in pairs:
        for name, v in (("layer", layer), ("head", head)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"heads: expected integer {name} indices, got ({layer!r}, {head!r})")
        if not 0 <= layer < n_layers:
            raise ValueError(f"heads: layer {layer} is out of range; the model has {n_layers} layers (0..{n_layers - 1})")
        if not 0 <= head < n_orig:
            raise ValueError(f"heads: head {head} of layer {layer} is out of range; heads are numbered "
                             f"0..{n_orig - 1} (original indices)")
        if (layer, head) in seen:
            raise ValueError(f"heads: ({layer}, {head}) is listed twice")
        if head not in lay[layer][0]:
            raise ValueError(f"heads: head {head} of layer {layer} was already removed "
                             f"(layer {layer} keeps {list(lay[layer][0])})")
        seen.add((layer, head))
        out.setdefault(layer, []).append(head)
    for layer, hs in out.items():
        kept = lay[layer][0]
        if len(hs) >= len(kept):
            raise ValueError(f"heads: removing all {len(kept)} remaining heads of layer {layer} would leave it without "
                             "attention; keep at least one head per layer (or gate them with head_gates)")
    return {layer: sorted(hs) for layer, hs in sorted(out.items())}


def groups_of(model, layer: int) -> dict[int, list[int]]:
    """{current KV head: [original query heads reading it]} for one layer."""
    kept, kv_of = layout(model)[layer]
    out: dict[int, list[int]] = {}
    for h, kv in zip(kept, kv_of):
        out.setdefault(kv, []).append(h)
    return out


def check_groups(model, plan: dict[int, list[int]]) -> None:
    """Group mode: every KV group touched must be listed whole."""
    for layer, hs in plan.items():
        chosen = set(hs)
        for kv, members in groups_of(model, layer).items():
            part = chosen & set(members)
            if part and part != set(members):
                raise ValueError(f"heads: mode='group' removes whole GQA groups; layer {layer}, KV head {kv} is read by "
                                 f"query heads {members}, but only {sorted(part)} are listed "
                                 f"(add {sorted(set(members) - part)} or use mode='query')")


def to_current(model, plan: dict[int, list[int]]) -> dict[int, list[int]]:
    """Original head indices -> current indices (what MultiHeadAttention.prune_heads takes)."""
    lay = layout(model)
    return {layer: sorted(lay[layer][0].index(h) for h in hs) for layer, hs in plan.items()}


# ------------------------------------------------------------------------------------------- scores
def head_scores(model, order) -> dict[tuple[int, int], float]:
    """{(layer, original head): importance} from a HeadScores (higher = more important)."""
    if not hasattr(order, "scores") or not hasattr(order, "kept_heads"):
        raise TypeError(f"order: expected a HeadScores or a method name, got {type(order).__name__}")
    lay = layout(model)
    if order.n_layers != len(lay):
        raise ValueError(f"order: scores cover {order.n_layers} layers, the model has {len(lay)}")
    out = {}
    for layer, row in enumerate(order.kept_heads):
        for j, orig in enumerate(row):
            out[(layer, orig)] = float(order.scores[layer, j])
    missing = [(l, h) for l, (kept, _) in enumerate(lay) for h in kept if (l, h) not in out]
    if missing:
        raise ValueError(f"order: no score for heads {missing[:5]} of the model (scores from another model?)")
    return out


def random_scores(model, seed: int) -> dict[tuple[int, int], float]:
    rng = random.Random(seed)
    return {(l, h): rng.random() for l, (kept, _) in enumerate(layout(model)) for h in kept}


def _check_fraction(fraction) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ArgumentError("fraction", f"expected a number in (0, 1) (the share of query heads to remove), got "
                                        f"{fraction!r}")
    return float(fraction)


def check_max_share(max_share) -> float | None:
    if max_share is None:
        return None
    if isinstance(max_share, bool) or not isinstance(max_share, (int, float)) or not 0 < max_share <= 1:
        raise ValueError(f"max_share: expected None or a number in (0, 1] (the most of a layer's heads one prune "
                         f"removes), got {max_share!r}")
    return float(max_share)


def _layer_limits(counts: list[int], protect, max_share: float | None) -> list[int]:
    """How many units (heads or groups) each layer may lose: protected layers none, else
    floor(max_share x the layer's count), and never the layer's last one."""
    protect = set(protect or ())
    out = []
    for layer, n in enumerate(counts):
        cap = n - 1
        if max_share is not None:
            cap = min(cap, int(max_share * n + 1e-9))
        out.append(0 if layer in protect else max(cap, 0))
    return out


def _take_lowest(units, n: int, limits: list[int], relaxed: list[int]) -> list:
    """The n lowest-scoring units (already sorted) within the per-layer limits; when the limits cannot give n,
    the rest come from the relaxed limits (the cap lifted, protection kept, then protection lifted too)."""
    taken, used = [], [0] * len(limits)
    for limits_now in (limits, *relaxed):
        for unit in units:
            if len(taken) == n:
                return taken
            layer = unit[0]
            if unit not in taken and used[layer] < limits_now[layer]:
                taken.append(unit)
                used[layer] += 1
    return taken


def plan_fraction(model, fraction: float, scores: dict[tuple[int, int], float], *, mode: str = "query",
                  uniform: bool = False, protect=(), max_share: float | None = None) -> dict[int, list[int]]:
    """The heads to remove for `fraction` of the model's current query heads (original indices).

    Global plans (not uniform) take two limits per layer: `protect` (layers that lose nothing, e.g. where the
    residual stream's massive activations form: analysis.outliers) and `max_share` (at most floor(max_share x
    its heads) from one layer). When the limits leave fewer than asked, the cap is lifted, then the protection
    (the fraction asked is what is removed). Uniform plans take neither.

    query, global:    the round(fraction * heads) lowest scores; a layer's last head is skipped.
    query, uniform:   in every GQA group of every layer, its round(fraction * group size) lowest heads
                      (the same count everywhere; needs groups of equal size).
    group, global:    the round(fraction * groups) lowest group sums; a layer's last group is skipped.
    group, uniform:   in every layer, its round(fraction * groups) lowest group sums.
    """
    fraction = _check_fraction(fraction)
    check_mode(mode)
    lay = layout(model)
    if mode == "group" and all(len(groups_of(model, layer)) == 1 for layer in range(len(lay))):
        raise ValueError("mode: 'group' removes whole GQA groups, and every layer of this model has ONE KV head "
                         "(multi-query attention, as Gemma 3 ships): a group is the whole layer's attention. "
                         "Use mode='query' (--mode query), which keeps the one KV head")
    key = lambda lh: (scores[lh], lh)  # noqa: E731  ties broken by (layer, head)
    plan: dict[int, list[int]] = {}
    max_share = check_max_share(max_share)
    if mode == "query" and not uniform:
        total = sum(len(k) for k, _ in lay)
        counts = [len(k) for k, _ in lay]
        units = sorted(((l, h) for l, (k, _) in enumerate(lay) for h in k), key=key)
        relaxed = [_layer_limits(counts, protect, None), _layer_limits(counts, (), None)]
        for layer, head in _take_lowest(units, round(fraction * total), _layer_limits(counts, protect, max_share),
                                        relaxed):
            plan.setdefault(layer, []).append(head)
    elif mode == "query":
        sizes = {len(m) for l in range(len(lay)) for m in groups_of(model, l).values()}
        if len(sizes) != 1:
            raise ValueError(f"uniform: query heads per GQA group differ across the model ({sorted(sizes)}); "
                             "uniform pruning needs equal groups")
        size = sizes.pop()
        k = round(fraction * size)
        if k == 0 or k >= size:
            raise ValueError(f"fraction: uniform query pruning removes the same number of heads from every GQA group "
                             f"of {size}; fraction {fraction} rounds to {k} per group (choose a fraction nearer a "
                             f"multiple of 1/{size}, below {(size - 0.5) / size:.2f})" if k >= size else
                             f"fraction: uniform query pruning removes the same number of heads from every GQA group "
                             f"of {size}; fraction {fraction} rounds to 0 per group (at least {0.5 / size:.2f} needed)")
        for layer in range(len(lay)):
            for members in groups_of(model, layer).values():
                plan.setdefault(layer, []).extend(sorted(((layer, h) for h in members), key=key)[i][1] for i in range(k))
    else:
        groups = [(layer, kv, members) for layer in range(len(lay)) for kv, members in groups_of(model, layer).items()]
        gkey = lambda g: (sum(scores[(g[0], h)] for h in g[2]), g[0], g[1])  # noqa: E731
        if not uniform:
            counts = [len(groups_of(model, layer)) for layer in range(len(lay))]
            units = [(layer, kv, tuple(members)) for layer, kv, members in sorted(groups, key=gkey)]
            relaxed = [_layer_limits(counts, protect, None), _layer_limits(counts, (), None)]
            for layer, kv, members in _take_lowest(units, round(fraction * len(groups)),
                                                   _layer_limits(counts, protect, max_share), relaxed):
                plan.setdefault(layer, []).extend(members)
        else:
            counts = {len(groups_of(model, layer)) for layer in range(len(lay))}
            if len(counts) != 1:
                raise ValueError(f"uniform: layers have different numbers of KV groups ({sorted(counts)})")
            n_kv = counts.pop()
            k = round(fraction * n_kv)
            if k == 0 or k >= n_kv:
                raise ValueError(f"fraction: uniform group pruning removes the same number of the {n_kv} KV groups "
                                 f"from every layer; fraction {fraction} rounds to {k} (need 1..{n_kv - 1})")
            for layer in range(len(lay)):
                mine = sorted((g for g in groups if g[0] == layer), key=gkey)[:k]
                plan[layer] = [h for g in mine for h in g[2]]
    return {layer: sorted(hs) for layer, hs in sorted(plan.items()) if hs}
