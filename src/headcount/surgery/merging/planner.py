"""merge_plan: which layers to merge, and to how many KV heads, for a KV-cache budget.

    plan = merge_plan(model, 0.67)           # keep at most 67% of the current KV bytes per token
    plan = merge_plan(model, 12_000)         # or at most 12,000 bytes per token (an int)
    plan = merge_plan(model, parse_budget("12KiB"))   # what --budget and the frontier's merge:B read
    merge_kv(model, plan)                    # apply it (plan.kv_heads = {layer: n_kv_heads})

Sensitivity: for every layer l and every smaller KV-head count n, layer l alone is merged (the aware
merge, fit on calibration windows) and its cost is measured on OTHER calibration windows. Only the layers
from l up are run for that (the stream below l is unchanged). What the cost is (`by`):
  "loss" (decoders): the increase of the next-token NLL on the calibration windows (default: the default
      corpus's calibration prose);
  "kl" (decoders): the mean per-token KL(unedited || merged) of the next-token distributions, by default on
      the model's own chat answers to function stubs of the calibration source interleaved with calibration
      prose (healing's teacher-chat windows: what a chat model is judged by is what it answers, and the KL
      weighs every token by how the unedited model spreads its probability, not by how right it is);
  encoders: 1 - cosine of the mean-pooled sentence embeddings to the unmodified model's (either `by`).
drops=True (decoders) adds each layer's cost of dropping its whole attention sublayer ({0: cost}: no K/V cache at
all, models/dropped.py), measured the same way, so the plan may drop a layer where that costs less than merging
(apply_plan: the drops, then the merges). The plan then minimises the sum of the costs subject to the budget: a multiple-choice knapsack solved
exactly by dynamic programming over the KV bytes per token (a few hundred states). Summing single-layer
costs ignores interactions; the loss of the whole plan is measured when it is applied (merge_bench prints
both). The table is the expensive part: merge_plan(..., sensitivity_from=plan) reuses one across budgets.

Budgets (parse_budget, shared by `merge-kv --budget` and the frontier's `merge:B`): a fraction in (0, 1] of
the current KV bytes per token ("0.75", "75%") or bytes per token ("12288", "12KiB", "12kB"); never below what
one K/V head in every layer holds (check_budget).
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field

BY = ("loss", "kl")
AUTO = "auto"  # merge_plan's default: resolve_by
# bytes: binary units are powers of 1024 (KiB), decimal ones powers of 1000 (kB)
_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
_BUDGET = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([-+]?[0-9]+))?\s*([A-Za-z%]*)$")
_EXPECTED = "a fraction in (0, 1] of the KV bytes per token to keep (0.75, 75%) or bytes per token (12288, 12KiB)"


def check_by(by, flag: str = "by") -> str:
    """What a layer's sensitivity measures: one of BY or "auto" (the commands' --sensitivity)."""
    from headcount.arguments import one_of
    return one_of(flag, by, BY + (AUTO,))


def resolve_by(model, by: str) -> str:
    """"auto" -> "kl" for a decoder with a chat template, else "loss"; "loss" and "kl" stay. kl is the default
    where it can measure because its plans kept more of held-out text at every budget tried (smollm2, merge
    0.9 / 0.75 / 0.5: docs/merging.md, "Which sensitivity is the default")."""
    check_by(by)
    if by != AUTO:
        return by
    from headcount.models.chat import has_chat_template
    from headcount.surgery.merging.stream import is_decoder

    return "kl" if is_decoder(model) and has_chat_template(model) else "loss"


def parse_budget(text, flag: str = "--budget") -> float | int:
    """'0.75' / '75%' -> 0.75 (a fraction of the KV bytes per token to keep); '12288' / '12KiB' / '12kB' -> an
    int of bytes per token. Numbers pass through (a float: a fraction, an int: bytes). Bad text: ValueError naming
    `flag`. Whether the model can reach it is check_budget's question."""
    if isinstance(text, bool):
        raise ValueError(f"{flag}: expected {_EXPECTED}, got {text!r}")
    if isinstance(text, (int, float)):
        value = text
    elif isinstance(text, str):
        m = _BUDGET.match(text.strip())
        if not m:
            raise ValueError(f"{flag}: expected {_EXPECTED}, got {text!r}")
        number, exponent, unit = m.group(1), m.group(2), m.group(3)
        whole = "." not in number and exponent is None
        amount = float(number + (f"e{exponent}" if exponent else ""))
        if unit == "%":
            value = amount / 100
        elif unit:
            if unit.lower() not in _UNITS or unit[-1] == "b" and unit.lower() != "b":  # 12Kb: kilobits
                raise ValueError(f"{flag}: expected a unit of bytes (B, KiB, MiB, GiB, kB, MB, GB), got {unit!r} in "
                                 f"{text!r}")
            value = amount * _UNITS[unit.lower()]
            if value != int(value):
                raise ValueError(f"{flag}: expected a whole number of bytes per token, got {text!r} = {value:g} bytes")
            value = int(value)
        else:
            value = int(number) if whole else amount
    else:
        raise ValueError(f"{flag}: expected {_EXPECTED}, got {type(text).__name__} {text!r}")
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ValueError(f"{flag}: expected a fraction in (0, 1] of the KV bytes per token to keep, got {text!r}")
    if isinstance(value, int) and value <= 0:
        raise ValueError(f"{flag}: expected a positive number of KV bytes per token, got {text!r}")
    return value


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
    by: str = "loss"  # what the sensitivity measured: "loss" or "kl" (see the module doc)
    drops: bool = False  # whether the plan may drop a layer's attention (kv_heads 0; sensitivity's drops=True)

    @property
    def dropped(self) -> list[int]:
        """The layers whose attention the plan drops (kv_heads 0), ascending."""
        return sorted(i for i, n in self.kv_heads.items() if n == 0)

    @property
    def merged(self) -> dict[int, int]:
        """{layer: n_kv_heads} of the layers the plan merges (what merge_kv takes)."""
        return {i: n for i, n in sorted(self.kv_heads.items()) if n}

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
    if n == 0:  # a dropped attention sublayer (models.dropped.NoAttention): no K/V cache, nothing to merge
        return 0
    itemsize = attn.qkv_proj.weight.element_size()
    return 2 * n * attn.head_dim * itemsize


def kv_bytes(model, drops: bool = False) -> tuple[int, int]:
    """(current KV bytes per token, the least any plan reaches: one K/V head in every layer; with drops, one K/V
    head in the one layer that keeps its attention)."""
    current = sum(_layer_bytes(layer.attn, layer.attn.n_kv_heads) for layer in model.layers)
    ones = [_layer_bytes(layer.attn, min(1, layer.attn.n_kv_heads)) for layer in model.layers]
    floor = min(b for b in ones if b) if drops and any(ones) else sum(ones)
    return current, floor


def check_budget(model, budget, flag: str = "budget", drops: bool = False) -> int:
    """The budget's limit in KV bytes per token for this model (a fraction of its current bytes, or bytes), or
    ValueError naming `flag` when no plan reaches it (below one K/V head everywhere; with drops, below one K/V head
    in one layer) or it is not a budget."""
    current, floor = kv_bytes(model, drops)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"{flag}: expected a fraction of the KV cache to keep (a float in (0, 1]) or bytes per "
                        f"token (an int), got {budget!r}")
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"{flag}: expected a fraction in (0, 1] of the current {current} KV bytes per token, "
                             f"got {budget}")
        limit = int(budget * current + 1e-9)
    else:
        limit = budget
    if limit < floor:
        least = "one K/V head in one layer, every other layer's attention dropped" if drops else "every-layer MQA"
        raise ValueError(f"{flag}: {limit} KV bytes per token is below what {least} reaches ({floor} of "
                         f"{current}); expected at least {floor} bytes or {floor / current:.3f} of the cache, "
                         f"got {budget!r}")
    return limit


_budget_bytes = check_budget


def _chat_windows(model, n: int, window: int):
    """by="kl"'s default calibration: the model's own chat answers interleaved with calibration prose."""
    from headcount.surgery.healing.teacher_text import teacher_chat_windows

    try:
        return teacher_chat_windows(model, n, window=window, progress=False)
    except ValueError as e:
        raise ValueError(f"by: 'kl' measures on the model's own chat answers by default and cannot ({e}); give "
                         "calibration= or use by='loss'") from None


def _tail_hidden(model, stream) -> list:
    """The final hidden states (before the final norm) of the stream's windows, run from its current layer."""
    from headcount.surgery.merging.stream import _first

    hidden = list(stream.hidden)
    for layer in model.layers[stream.layer:]:
        hidden = [_first(layer(h, **kw)) for h, kw in zip(hidden, stream.kwargs)]
    return hidden


def _mean_kl(model, reference: list, hidden: list, chunk: int = 256) -> float:
    """Mean over tokens of KL(p_reference || p_hidden) of the next-token distributions, [chunk, vocab] at a time."""
    import torch.nn.functional as F

    total, count = 0.0, 0
    for ref, h in zip(reference, hidden):
        ref, h = model.norm(ref), model.norm(h)
        for start in range(0, h.shape[1], chunk):
            p = F.log_softmax(model.lm_head(ref[:, start:start + chunk]).float(), dim=-1)
            q = F.log_softmax(model.lm_head(h[:, start:start + chunk]).float(), dim=-1)
            total += float((p.exp() * (p - q)).sum())
            count += p.shape[0] * p.shape[1]
    return total / count


def sensitivity(model, *, calibration=None, method: str = "aware", by: str = AUTO, n_windows: int = 4,
                n_eval_windows: int = 2, window: int = 512, candidates=None, progress: bool = True,
                drops: bool = False, **merge_options) -> tuple[float, dict]:
    """(base loss, {layer: {n: cost when only this layer is merged to n KV heads}}); by="kl": the base is 0 and
    the cost the mean KL to the unedited model (see the module doc). drops=True (decoders): also {0: cost when only
    this layer's attention is dropped}, measured the same way, so a plan may drop a layer where that costs less."""
    import torch
    from tqdm.auto import tqdm

    from headcount.surgery.merging.kv_merge import merge_layer
    from headcount.surgery.merging.stream import Stream, calibration_batches, is_decoder, sentence_embeddings

    if method not in ("aware", "mean"):
        raise ValueError(f"method: expected 'aware' or 'mean', got {method!r}")
    by = resolve_by(model, by)
    kl = by == "kl" and is_decoder(model)
    if drops and not is_decoder(model):
        raise ValueError(f"drops: only a decoder's attention sublayers can be dropped; this is {type(model).__name__}")
    if kl and calibration is None:
        calibration = _chat_windows(model, n_windows + n_eval_windows, min(window, model.config.max_position))
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
    with torch.no_grad():
        unedited = _tail_hidden(model, eval_stream) if kl else None
    base = 0.0 if kl else eval_stream.tail_loss(reference)

    def cost() -> float:
        if not kl:
            return eval_stream.tail_loss(reference) - base
        with torch.no_grad():
            return _mean_kl(model, unedited, _tail_hidden(model, eval_stream))
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
                    table[i][n] = cost()
                finally:
                    layer.attn = original
            if drops and n_kv:
                from headcount.surgery.dropping.choose import without_attention

                with without_attention(layer):
                    table[i][0] = cost()
            fit_stream.advance(i)
            eval_stream.advance(i)
    finally:
        model.train(was_training)
    return base, table


def _solve(model, table: dict[int, dict[int, float]], limit: int,
           drops: bool = False) -> tuple[dict[int, int], float, int]:
    """Minimise the summed loss increase with total KV bytes <= limit (exact DP over byte totals); a layer's
    n = 0 (its attention dropped) is a choice only with drops."""
    states: dict[int, tuple[float, dict]] = {0: (0.0, {})}
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        choices = {attn.n_kv_heads: 0.0, **{n: c for n, c in table.get(i, {}).items() if n or drops}}
        new: dict[int, tuple[float, dict]] = {}
        for total, (cost, picks) in states.items():
            for n, inc in choices.items():
                key = total + _layer_bytes(attn, n)
                value = cost + max(float(inc), 0.0)
                if key not in new or value < new[key][0]:
                    new[key] = (value, {**picks, i: n})
        states = new
    # a plan keeps attention in at least one layer (drop_attention's rule)
    feasible = [(cost, total, picks) for total, (cost, picks) in states.items() if total <= limit and total]
    if not feasible:
        raise ValueError(f"budget: no plan reaches {limit} KV bytes per token with the candidate head counts")
    cost, total, picks = min(feasible, key=lambda t: (t[0], -t[1]))  # ties: keep more heads
    return {i: n for i, n in picks.items() if n != model.layers[i].attn.n_kv_heads}, cost, total


def merge_plan(model, budget, *, calibration=None, method: str = "aware", by: str = AUTO,
               sensitivity_from: "MergePlan | None" = None, n_windows: int = 4, n_eval_windows: int = 2,
               window: int = 512, candidates=None, progress: bool = True, cache=None,
               drops: bool = False) -> MergePlan:
    """The cheapest set of per-layer KV-head counts (by calibration sensitivity) within `budget`.

    budget: a float in (0, 1] = the fraction of the current KV bytes per token to keep, or an int =
        KV bytes per token (parse_budget reads the command line's forms). by: "loss" or "kl", what a layer's
        sensitivity measures (module doc), or "auto": kl for a decoder with a chat template, else loss
        (resolve_by). sensitivity_from: a previous plan of the same model whose sensitivity table is reused (a
        curve over budgets measures it once; its `by` is kept). cache: a folder
        where the table is kept by the model's weights hash, the calibration and these settings
        (sensitivity_cache.py; the commands pass $HEADCOUNT_CACHE/merge-sensitivity): a second plan of the same
        model, at any budget, reads it back. None: always measured.
    drops: a layer may also lose its whole attention (kv_heads 0: no K/V cache at all) where that costs less than
        merging its heads (decoders; dropping's cost measured as a merge's is). apply_plan applies such a plan.
    """
    limit = check_budget(model, budget, drops=drops)
    current = kv_bytes(model)[0]
    if sensitivity_from is not None:
        if not isinstance(sensitivity_from, MergePlan):
            raise TypeError(f"sensitivity_from: expected a MergePlan, got {type(sensitivity_from).__name__}")
        if sensitivity_from.kv_bytes_per_token_before != current:
            raise ValueError("sensitivity_from: that plan was measured on a model with a different KV cache "
                             f"({sensitivity_from.kv_bytes_per_token_before} bytes per token, this one {current})")
        base, table, by = sensitivity_from.base_loss, sensitivity_from.sensitivity, sensitivity_from.by
        if drops and not sensitivity_from.drops:
            raise ValueError("sensitivity_from: that table was measured without drops (merge_plan(drops=False)); "
                             "a plan with drops needs each layer's cost of dropping its attention")
    else:
        by = resolve_by(model, by)  # before the cache hashes the weights

        def measure():
            return sensitivity(model, calibration=calibration, method=method, by=by, n_windows=n_windows,
                               n_eval_windows=n_eval_windows, window=window, candidates=candidates, progress=progress,
                               drops=drops)
        if cache is None:
            base, table = measure()
        else:
            from headcount.surgery.merging.sensitivity_cache import cached_sensitivity

            params = {"method": method, "by": by, "n_windows": n_windows, "n_eval_windows": n_eval_windows,
                      "window": window, "candidates": None if candidates is None else sorted(candidates)}
            if drops:  # only then: the tables measured before drops existed keep their keys
                params["drops"] = True
            base, table, _ = cached_sensitivity(cache, model, calibration, params, measure, progress=progress)
    picks, cost, total = _solve(model, table, limit, drops)
    return MergePlan(budget, picks, current, total, cost, base, table, method, by, drops)


def apply_plan(model, plan: MergePlan, **merge_options):
    """Apply a plan in place: its drops first (drop_attention), then its merges (merge_kv(model, plan.merged,
    **merge_options)), so each merge is fit on the stream the drops below it leave. Returns (DropResult or None,
    MergeResult: a merge of no layer when the plan only drops)."""
    from headcount.surgery.dropping import drop_attention
    from headcount.surgery.merging.kv_merge import merge_kv

    if not isinstance(plan, MergePlan):
        raise TypeError(f"plan: expected a MergePlan (merge_plan's), got {type(plan).__name__}")
    dropped = drop_attention(model, layers=plan.dropped) if plan.dropped else None
    merged = merge_kv(model, plan.merged, **merge_options)
    return dropped, merged
