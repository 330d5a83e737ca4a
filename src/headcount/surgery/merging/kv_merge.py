"""K/V-head merging on a whole model: MHA -> GQA -> MQA, in place.

    merge_kv(model, n_kv_heads, *, layers=None, method="aware", calibration=None, ...) -> MergeResult
    merge_plan(model, budget, *, calibration=None, ...) -> MergePlan      (merge_planner.py)

method="mean": the GQA paper's conversion (Ainslie et al. 2023): each run of consecutive K/V heads
    mean-pooled into one (headcount.head_surgery.merge_kv_heads); needs a divisor of the current count.
method="aware": activation-aware and rotary-respecting, computed from calibration activations
    (merge_fit.py has the math). Layer by layer, bottom up, each layer seeing the already-merged
    layers below it:
      1. keys: per frequency pair, a complex rank-1 (per new head) reduction of the group's keys,
         weighted by the energy of the queries that read each old head; its inverse (a 2x2
         rotation-scaling per pair) folded into each query head's W_Q rows, which commutes with rotary;
      2. values: a reduction of the group's attention-averaged values in the metric of o_proj (how much
         each value direction moves the layer output), the back-map folded into o_proj's columns;
      3. o_proj refit by ridge least squares on the merged layer's contexts to reproduce the layer's
         output on calibration tokens (`target`: "local" = the original layer on the merged model's
         input; "stream" = the original model's layer output; "residual" = that plus the drift of
         the residual stream, so the refit also corrects what the layers below changed).
    Any target count from 1 to the current count works, divisors or not: uneven groups get an
    explicit query -> KV head map (grouping="auto" picks which old heads share a new one from
    calibration; "contiguous" keeps runs of consecutive heads).

Partial rotary (Phi-4-mini, GPT-NeoX / Pythia) and layers without rotary (SmolLM3's NoPE layers): the
statistics read each layer's own rotary hook (stats.rotary_dim_of): the turning dims are fitted per frequency
pair, the unturned ones and NoPE layers without constraint (merge_fit's module docstring).

Key norms (Gemma 3, Qwen3: RMSNorm per head on K before rotary): the key statistics are taken on the
projected keys before the norm, and the merged key head is a combination of the old heads' projection rows
that the layer's k_norm then normalises again; exact when the merged heads' keys are equal, otherwise one
more approximation, which the o_proj refit and the local reconstruction (local_steps) absorb in part.

Calibration: None = the defaults `headcount merge-kv` uses (decoders: "mixed", `n_windows` windows of `window`
tokens, half prose, half code-like text; encoders: the default corpus's calibration sentences); nothing here
reads held-out text. The defaults are the command's: merge_kv(model, 1) is `headcount merge-kv --kv-heads 1`
(the local reconstruction and the short uptrain included; see merge_kv).

Data parallelism (group=): the calibration batches are split over the ranks, batches r::world
(with fewer batches than ranks, the rows: global window / sentence w on rank w % world;
merging.stream.shard_batches); every statistic a solve reads (the key and
value moments, the o_proj Gram matrices, the errors) is summed over the ranks in float64 first, and the
gradient steps (local_steps, refine_steps) all-reduce their gradients per global batch, so every rank
computes the same merged weights, the single process's to summation order. Under torchrun:
`torchrun --nproc-per-node N -m headcount merge-kv ...` (rank 0 prints and writes).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


from headcount.surgery.merging import defaults as _defaults
from headcount.surgery.merging import fit as merge_fit
from headcount.surgery.merging.defaults import (CALIBRATION_WINDOWS, LOCAL_STEPS, UPTRAIN_LR,  # noqa: F401
                                                UPTRAIN_STEPS, UPTRAIN_WINDOW, uptrain_windows)
from headcount.surgery.merging.refine import refine_layer
from headcount.surgery.merging.stats import layer_stats
from headcount.surgery.merging.stream import Stream, calibration_batches, shard_batches

METHODS = ("aware", "mean")
TARGETS = ("local", "stream", "residual")
GROUPINGS = ("auto", "contiguous")


@dataclass
class LayerMerge:
    """What merging did to one layer."""

    layer: int
    n_kv_before: int
    n_kv_after: int
    groups: list[list[int]]  # old KV heads merged into each new KV head
    kv_head_of: list[int]  # query head -> new KV head
    k_kept: float | None = None  # fraction of the query-weighted key energy kept (aware)
    v_kept: float | None = None  # fraction of the output-weighted context energy kept (aware)
    error_before_refit: float | None = None  # relative layer-output error on calibration tokens
    error_after_refit: float | None = None
    error_after_local: float | None = None  # after refine_layer and the o_proj refit that follows it (all windows)


@dataclass
class MergeResult:
    method: str
    kv_heads_before: list[int]  # per layer
    kv_heads_after: list[int]
    kv_bytes_per_token_before: int
    kv_bytes_per_token_after: int
    layers: list[LayerMerge] = field(default_factory=list)
    calibration_tokens: int = 0
    seconds: float = 0.0
    options: dict = field(default_factory=dict)
    # cost in forward passes over the calibration tokens, by construction (see _forward_equivalents)
    forward_equivalents: float = 0.0
    uptrain: dict | None = None  # the distillation after the merge (UptrainResult.to_json), None when none ran

    @property
    def merged_layers(self) -> list[int]:
        return [m.layer for m in self.layers]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "MergeResult":
        data = dict(data)
        data["layers"] = [LayerMerge(**m) for m in data.get("layers", [])]
        return cls(**data)


def kv_bytes_per_token(model) -> int:
    """KV-cache bytes one token costs across all layers (KVCache.nbytes of a one-token cache)."""
    return sum(attn.new_cache(1, 1).nbytes for attn in (layer.attn for layer in model.layers))


def _targets(model, n_kv_heads, layers, method: str) -> dict[int, int]:
    """Validate everything before any weight changes: {layer: new n_kv_heads}."""
    n_layers = len(model.layers)
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    plan = getattr(n_kv_heads, "kv_heads", None)
    if plan is not None:  # a MergePlan
        dropped = sorted(int(k) for k, v in plan.items() if v == 0)
        if dropped:
            raise ValueError(f"n_kv_heads: this plan drops the attention of layers {dropped} (merge_plan(drops=True)); "
                             "apply it with surgery.merging.planner.apply_plan, which drops, then merges")
        n_kv_heads = {int(k): v for k, v in plan.items()}
    if isinstance(n_kv_heads, dict):
        if layers is not None:
            raise ValueError("layers: give either layers= or a per-layer mapping / plan, not both")
        wanted = dict(n_kv_heads)
    else:
        if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int):
            raise TypeError(f"n_kv_heads: expected a positive int, a {{layer: n}} mapping or a MergePlan, "
                            f"got {n_kv_heads!r}")
        if layers is None:  # every layer that still has attention (drop-attention leaves some without)
            layer_list = [i for i in range(n_layers) if model.layers[i].attn.n_kv_heads]
        else:
            if isinstance(layers, int) and not isinstance(layers, bool):
                layers = [layers]
            try:
                layer_list = [int(i) for i in layers]
            except (TypeError, ValueError):
                raise TypeError(f"layers: expected a list of layer indices, got {layers!r}") from None
            if not layer_list:
                raise ValueError("layers: expected at least one layer index, got none")
            if len(set(layer_list)) != len(layer_list):
                raise ValueError(f"layers: duplicate layer indices in {layer_list}")
        wanted = {i: n_kv_heads for i in layer_list}
    bad = [i for i in wanted if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"layers: expected indices in [0, {n_layers}) ({n_layers} layers), got {sorted(bad)}")
    if plan is None and not isinstance(n_kv_heads, dict) and all(model.layers[i].attn.n_kv_heads == 1
                                                                   for i in wanted):
        raise ValueError("n_kv_heads: every layer asked for already has ONE KV head (multi-query attention, as "
                         "Gemma 3 ships); there is nothing to merge")
    for i, n in sorted(wanted.items()):
        attn = model.layers[i].attn
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n_kv_heads: expected a positive int for layer {i}, got {n!r}")
        if n < 1:
            raise ValueError(f"n_kv_heads: expected at least 1, got {n}")
        if not attn.n_kv_heads:
            raise ValueError(f"layers: layer {i}'s attention was dropped (drop-attention); it has no K/V heads to merge")
        if n > attn.n_kv_heads:
            raise ValueError(f"n_kv_heads: layer {i} has {attn.n_kv_heads} KV heads; merging cannot raise it "
                             f"to {n} (expected 1 .. {attn.n_kv_heads})")
        if method == "mean" and n != attn.n_kv_heads:
            if attn.n_kv_heads % n:
                divisors = [d for d in range(1, attn.n_kv_heads + 1) if attn.n_kv_heads % d == 0]
                raise ValueError(f"n_kv_heads: method='mean' needs a divisor of layer {i}'s "
                                 f"{attn.n_kv_heads} KV heads ({divisors}), got {n}; method='aware' "
                                 "takes any count")
            if not attn.is_uniform:
                raise ValueError(f"n_kv_heads: method='mean' needs uniform groups; layer {i} has "
                                 f"kv_head_of={attn.kv_head_of} (use method='aware')")
    return {i: n for i, n in sorted(wanted.items()) if n != model.layers[i].attn.n_kv_heads}


def _contiguous(n_old: int, n_new: int) -> list[list[int]]:
    """n_old heads in n_new runs of consecutive heads, sizes as even as possible."""
    bounds = [round(j * n_old / n_new) for j in range(n_new + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(n_new)]


def merge_layer(attn, captures: list[dict], targets: list, n_new: int, *, grouping="auto",
                refit: bool = True, ridge: float = 0.3, refine_steps: int = 0, local_steps: int = 0,
                local_lr: float = 2e-3, local_tokens: int | None = None, dp=None,
                n_batches: int | None = None) -> LayerMerge:
    """The aware merge of one attention module, from captured inputs and target outputs (in place).

    dp / n_batches: data parallelism (this rank's captures; the number of global calibration batches)."""
    n_old, d = attn.n_kv_heads, attn.head_dim
    stats = layer_stats(attn, captures, dp=dp)
    if isinstance(grouping, (list, tuple)):
        groups = [sorted(int(g) for g in grp) for grp in grouping]
        flat = sorted(g for grp in groups for g in grp)
        if flat != list(range(n_old)) or len(groups) != n_new or any(not grp for grp in groups):
            raise ValueError(f"grouping: expected {n_new} non-empty groups covering KV heads 0..{n_old - 1} "
                             f"once each, got {grouping!r}")
    elif grouping == "contiguous" or n_new == 1:
        groups = _contiguous(n_old, n_new)
    elif grouping == "auto":
        groups = merge_fit.choose_groups(stats, attn.o_proj.weight.detach(), attn.kv_head_of, n_old, n_new, d)
    else:
        raise ValueError(f"grouping: expected 'auto', 'contiguous' or a list of groups, got {grouping!r}")
    mw = merge_fit.merged_weights(attn, stats, groups, captures=captures, refine_steps=refine_steps, dp=dp)
    merge_fit.install(attn, mw)
    if refit:  # the error before the refit comes from the refit's own pass (its Gram statistics)
        before, after = merge_fit.refit_o_proj_errors(attn, captures, targets, ridge=ridge, dp=dp)
    else:
        before = after = merge_fit.output_error(attn, captures, targets, dp=dp)
    local = (refine_layer(attn, captures, targets, steps=local_steps, lr=local_lr, dp=dp, n_batches=n_batches,
                          step_tokens=local_tokens) if local_steps else {})
    if local and refit:  # the closed-form o_proj once more, on every calibration window, for the refined keys
        local["validation"] = merge_fit.refit_o_proj(attn, captures, targets, ridge=ridge, dp=dp)
    return LayerMerge(-1, n_old, n_new, groups, list(attn.kv_head_of), mw.k_kept, mw.v_kept, before, after,
                      local.get("validation"))


def merge_kv(model, n_kv_heads, *, layers=None, method: str = "aware", calibration=None,
             n_windows: int = CALIBRATION_WINDOWS, window: int = 512, grouping="auto", target: str = "local",
             refit: bool = True, ridge: float = 0.3, refine_steps: int = 0, local_steps: int = LOCAL_STEPS,
             local_lr: float = 2e-3, local_tokens: int | None = None, batch_size: int = 1,
             uptrain_steps: int | None = None, uptrain_lr: float | None = None, progress: bool = True,
             group=None) -> MergeResult:
    """Merge K/V heads of `model` in place down to `n_kv_heads` (an int for every layer in `layers`, a
    {layer: n} mapping, or a MergePlan from merge_plan). See the module docstring for the methods.

    The defaults are `headcount merge-kv`'s (the command calls this function with its flags and nothing else):
    calibration None = for a decoder "mixed" (the default corpus's prose and code-like calibration text, half
    each), n_windows CALIBRATION_WINDOWS windows of `window` tokens; for an encoder the default corpus's
    calibration sentences. local_steps LOCAL_STEPS (aware only). uptrain_steps None = UPTRAIN_STEPS for an aware
    merge of a decoder, 0 otherwise: after the merge, that many steps of distillation from the unmerged model
    (surgery.merging.uptrain, attention weights only, peak lr uptrain_lr; None = UPTRAIN_LR scaled down for a
    model with small attention weights, healing.loop.relative_lr) on the merge's own calibration windows
    cut into UPTRAIN_WINDOW-token pieces; MergeResult.uptrain holds its summary, and `seconds` /
    `forward_equivalents` count the merge and the uptrain. local_steps=0, uptrain_steps=0: the closed form alone.
    Under `group=` the uptrain is not split: every rank runs the same steps on the same windows.

    group: None (one process), "auto" (torch.distributed's default group when initialised) or a process
    group: the calibration batches (or rows) split over its ranks, the sums all-reduced (module docstring);
    every rank ends with the same merged model. More ranks than calibration rows: ValueError before any
    change.

    batch_size: calibration windows per batch (decoders). Each local-reconstruction step takes one batch, so
    one window per batch makes a step a quarter of the cost it had with four, for the same number of steps
    (what `headcount merge-kv`'s defaults rely on; docs/scale.md has the measurements).

    local_tokens: each local step fits the first local_tokens tokens of its window (decoders; None = the whole
    window): the output at a position reads only the positions before it, so a prefix is an exact smaller
    problem, and a step on 256 of 512 tokens costs less than half (refine.causal_prefix)."""
    from headcount.distributed import DataParallel

    dp = DataParallel(group)
    wanted = _targets(model, n_kv_heads, layers, method)
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    if not isinstance(grouping, (list, tuple)) and grouping not in GROUPINGS:
        raise ValueError(f"grouping: expected one of {GROUPINGS} or a list of groups, got {grouping!r}")
    if local_tokens is not None and (isinstance(local_tokens, bool) or not isinstance(local_tokens, int)
                                     or local_tokens < 1):
        raise ValueError(f"local_tokens: expected None or a positive number of tokens, got {local_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive number of windows per batch, got {batch_size!r}")
    if uptrain_steps is not None and (isinstance(uptrain_steps, bool) or not isinstance(uptrain_steps, int)
                                      or uptrain_steps < 0):
        raise ValueError(f"uptrain_steps: expected None or a number of steps >= 0, got {uptrain_steps!r}")
    if isinstance(grouping, (list, tuple)) and len(wanted) > 1:
        raise ValueError("grouping: an explicit list of groups applies to one layer at a time")
    rotary = getattr(model, "rotary", None)
    if method == "aware" and wanted and refine_steps and rotary is not None and rotary.rotary_dim != rotary.head_dim:
        # the closed-form fit handles partial rotary (merge_fit: turning pairs + plain unturned dims);
        # refine_rotary_keys' complex scales cover a whole rotary head only
        raise ValueError(f"refine_steps: the rotary key refinement needs rotary over the whole head; this model "
                         f"turns only the first rotary_dim={rotary.rotary_dim} of head_dim={rotary.head_dim} dims "
                         f"(partial rotary: Phi-4-mini, GPT-NeoX): use refine_steps=0 (local_steps refines any layer)")
    start = time.perf_counter()
    decoder = hasattr(model, "lm_head")
    if uptrain_steps is None:
        uptrain_steps = _defaults.UPTRAIN_STEPS if decoder and method == "aware" else 0
    if uptrain_lr is None:  # the unmerged model's attention weights set the relative step (heal's default_lr)
        from headcount.surgery.healing.loop import relative_lr
        uptrain_lr = relative_lr(UPTRAIN_LR, model) if wanted and uptrain_steps else UPTRAIN_LR
    elif isinstance(uptrain_lr, bool) or not isinstance(uptrain_lr, (int, float)) or not uptrain_lr > 0:
        raise ValueError(f"uptrain_lr: expected None or a positive learning rate, got {uptrain_lr!r}")
    if wanted and (method == "aware" or uptrain_steps):
        calibration = _calibration_windows(model, calibration, n_windows, window)
    teacher = None
    if wanted and uptrain_steps:  # the uptrain trains attention only: the teacher shares every other tensor
        from headcount.models.copying import attention_copy
        teacher = attention_copy(model)
    before_heads = [layer.attn.n_kv_heads for layer in model.layers]
    bytes_before = kv_bytes_per_token(model)
    result = MergeResult(method, before_heads, list(before_heads), bytes_before, bytes_before,
                         options={"grouping": grouping if isinstance(grouping, str) else "explicit",
                                  "target": target, "refit": refit, "ridge": ridge, "n_windows": n_windows,
                                  "refine_steps": refine_steps, "local_steps": local_steps,
                                  "local_lr": local_lr, "local_tokens": local_tokens, "batch_size": batch_size,
                                  "window": window, "uptrain_steps": uptrain_steps, "uptrain_lr": uptrain_lr})
    if not wanted:
        return result
    if method == "mean":
        for i, n in wanted.items():
            attn = model.layers[i].attn
            old = attn.n_kv_heads
            attn.merge_kv_heads(n)
            result.layers.append(LayerMerge(i, old, n, _contiguous(old, n), list(attn.kv_head_of)))
    else:
        _merge_aware(model, wanted, result, calibration=calibration, n_windows=n_windows, window=window,
                     grouping=grouping, target=target, refit=refit, ridge=ridge, refine_steps=refine_steps,
                     local_steps=local_steps, local_lr=local_lr, local_tokens=local_tokens, batch_size=batch_size,
                     progress=progress, dp=dp)
    result.kv_heads_after = [layer.attn.n_kv_heads for layer in model.layers]
    result.kv_bytes_per_token_after = kv_bytes_per_token(model)
    result.forward_equivalents = _forward_equivalents(model, result) if method == "aware" else 0.0
    if teacher is not None:  # the uptrain, on the merge's own calibration windows
        import torch

        from headcount.surgery.merging.defaults import UptrainConfig
        from headcount.surgery.merging.uptraining import uptrain

        pieces = uptrain_windows(calibration) if isinstance(calibration, torch.Tensor) else calibration
        trained = uptrain(model, UptrainConfig(steps=uptrain_steps, lr=uptrain_lr), teacher=teacher,
                          progress=progress, calibration=pieces)
        result.uptrain = trained.to_json()
        tokens = calibration.numel() if isinstance(calibration, torch.Tensor) else result.calibration_tokens
        result.forward_equivalents += trained.token_forwards / tokens if tokens else 0.0
    result.seconds = time.perf_counter() - start
    return result


def _calibration_windows(model, calibration, n_windows: int, window: int):
    """A decoder's calibration as the token windows [N, window] the merge and the uptrain both read (what
    calibration_batches makes of it: n_windows windows; "mixed" when None); unchanged for an encoder or a list
    of ready batches."""
    import torch

    if not hasattr(model, "lm_head") or (isinstance(calibration, list) and calibration
                                          and all(isinstance(b, tuple) for b in calibration)):
        return calibration
    if calibration is None:
        calibration = "mixed"
    if isinstance(calibration, torch.Tensor):
        return calibration
    return torch.cat([b.ids for b in calibration_batches(model, calibration, n_windows=n_windows, window=window,
                                                         batch_size=n_windows)])


def _forward_equivalents(model, result: MergeResult) -> float:
    """Forward passes over the calibration tokens, counting a backward as two forwards, by construction. Per
    merged layer, in passes of that layer over every calibration token (attention's share of a layer taken
    by parameters): the capture runs its attention only (the MLP after it is skipped), the statistics and
    the o_proj refit one attention pass each, the advance the whole layer; targets "stream" / "residual"
    run the original layer once more on the original stream. Each local-reconstruction step is a forward
    and a backward of the attention on one batch (on its first local_tokens tokens), plus ten validation
    checks on one batch and, after the steps, one more refit pass over every batch."""
    n_layers = len(model.layers)
    opts = result.options
    steps = int(opts.get("local_steps") or 0)
    per_batch = int(opts.get("batch_size") or 4)
    n_batches = max(1, -(-int(opts.get("n_windows") or 1) // per_batch))
    window = int(opts.get("window") or 512)
    step_share = min(1.0, (opts.get("local_tokens") or window) / window)
    total = 0.0
    for info in result.layers:
        layer = model.layers[info.layer]
        attn = sum(p.numel() for p in layer.attn.parameters())
        share = attn / max(1, sum(p.numel() for p in layer.parameters()))
        passes = 1.0 + (0.0 if opts.get("target") == "local" else 1.0)
        passes += share * (2.0 + (1.0 if opts.get("refit") else 0.0))
        if steps:
            passes += ((3.0 * steps * step_share + 10.0) / n_batches + (1.0 if opts.get("refit") else 0.0)) * share
        total += passes
    return total / n_layers


def _merge_aware(model, wanted: dict[int, int], result: MergeResult, *, calibration, n_windows, window,
                 grouping, target, refit, ridge, refine_steps, local_steps, local_lr, local_tokens, batch_size,
                 progress, dp) -> None:
    from tqdm.auto import tqdm

    was_training = model.training
    batches = calibration_batches(model, calibration, n_windows=n_windows, window=window, batch_size=batch_size)
    result.calibration_tokens = sum(b.n_tokens for b in batches)
    mine, index = shard_batches(batches, dp)  # every rank's share (all of them in one process)
    if dp.world > 1:
        result.options["ranks"] = dp.world
    model.eval()
    current = Stream(model, mine, index)
    original = current.copy() if target != "local" else None
    last = max(wanted)
    try:
        for i in tqdm(range(last + 1), desc="merging K/V heads", disable=None if progress else True,
                      leave=False):
            if i not in wanted:
                current.advance(i)
                if original is not None:
                    original.advance(i)
                continue
            if original is not None:  # the original layer on the original stream
                reference = original.layer_io(i, advance=True)
            caps = current.layer_io(i)
            if target == "local":
                targets = [c["y"] for c in caps]
            elif target == "stream":
                targets = [r["y"] for r in reference]
            else:  # residual: also undo the drift of the stream entering this layer
                targets = [r["y"] + (r["h"] - c["h"]) for r, c in zip(reference, caps)]
            info = merge_layer(model.layers[i].attn, caps, targets, wanted[i], grouping=grouping, refit=refit,
                               ridge=ridge, refine_steps=refine_steps, local_steps=local_steps,
                               local_lr=local_lr, local_tokens=local_tokens, dp=dp, n_batches=len(batches))
            info.layer = i
            result.layers.append(info)
            if i != last:
                current.advance(i)
    finally:
        model.train(was_training)
