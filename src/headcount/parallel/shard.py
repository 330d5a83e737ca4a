"""shard_heads: one rank's share of one MultiHeadAttention, joined to the others by one all-reduce.

Megatron-LM's attention split, by whole heads:

    x (replicated) -> [this rank's Q heads | the K, V heads they read]   rows of qkv_proj, head by head
                   -> attention over its own heads                        (nothing crosses ranks)
                   -> o_proj's matching input columns (+ o_proj's bias on rank 0 only)
                   -> all-reduce (sum) over the ranks                      = the full module's output

Selecting this rank's heads is exactly pruning every other rank's heads, so the shard is a deepcopy
pruned with `headcount.head_surgery.prune_heads`: rows are taken head by head from the fused
[all Q | all K | all V] layout (never a contiguous block of rows), and an uneven query -> KV map
(5 query heads reading KV heads 0, 0, 0, 1, 1) is kept through `kv_head_of` / `kv_index`. The shard is
a plain MultiHeadAttention with a forward hook that all-reduces its output, so `new_cache` gives a
KVCache of this rank's KV heads only and the model's code runs unchanged.

Autograd: the collectives are torch.distributed's functional ones
(`torch.distributed._functional_collectives.all_reduce`), wrapped in Megatron's pair of operators:
`g` after o_proj (forward: all-reduce; backward: identity) and `f` before qkv_proj (forward: identity;
backward: all-reduce of the input gradient). The bare collective's own autograd (backward = all-reduce)
differentiates the SUM of every rank's loss, world_size x the gradient of the one loss all ranks
compute; with f and g each rank gets exactly the single-process gradient of its parameters (and of
its heads' gates), and identical, exact gradients for everything replicated.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed._functional_collectives as fc

from headcount.attention import AttentionOutput, MultiHeadAttention
from headcount.norms import FullRMSNorm
from headcount import distributed as runtime
from headcount.cost.head_split import RankHeads, head_plan

Tensor = torch.Tensor


# What the all-reduces of this process cost so far (benchmarks read and reset it): calls, bytes of
# payload (each call's tensor), and seconds spent waiting for them.
STATS = {"calls": 0, "bytes": 0, "seconds": 0.0}


def all_reduce_sum(x: Tensor, group) -> Tensor:
    """Sum over the group (out of place), waited for."""
    t0 = time.perf_counter()
    y = fc.all_reduce(x.contiguous(), "sum", group)
    y = y.wait() if isinstance(y, fc.AsyncCollectiveTensor) else y
    STATS["calls"] += 1
    STATS["bytes"] += x.numel() * x.element_size()
    STATS["seconds"] += time.perf_counter() - t0
    return y


class _CopyToShards(torch.autograd.Function):
    """Megatron's f: identity forward; the input gradient is summed over the ranks in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


class _ReduceFromShards(torch.autograd.Function):
    """Megatron's g: all-reduce forward; identity backward (every rank already holds dL/d output)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_shards(x: Tensor, group) -> Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return _CopyToShards.apply(x, group)
    return x


def reduce_from_shards(x: Tensor, group) -> Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return _ReduceFromShards.apply(x, group)
    return all_reduce_sum(x, group)


def install_collectives(module: torch.nn.Module, group) -> None:
    """f on the module's tensor inputs (x, context) and g on its output (a Tensor or an AttentionOutput)."""

    def pre_hook(mod, args, kwargs):
        args = tuple(copy_to_shards(a, group) if isinstance(a, Tensor) else a for a in args)
        for key in ("x", "context"):
            if isinstance(kwargs.get(key), Tensor):
                kwargs = dict(kwargs, **{key: copy_to_shards(kwargs[key], group)})
        return args, kwargs

    def post_hook(mod, args, kwargs, output):
        if isinstance(output, AttentionOutput):
            return AttentionOutput(reduce_from_shards(output.output, group), output.weights)
        return reduce_from_shards(output, group)

    module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    module.register_forward_hook(post_hook, with_kwargs=True)


class _SumOverShards(torch.autograd.Function):
    """All-reduce forward and backward: a statistic every rank reads (a full-width norm's sum of squares)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


def _share_statistics(shard: MultiHeadAttention, attn: MultiHeadAttention, plans: list[RankHeads], rank: int,
                      group) -> None:
    """Full-width q/k norms (OLMo 2): each rank's per-token sum of squares, summed over the ranks and divided
    by the unsharded width, so the shard normalises its heads exactly as the unsharded module. Query heads are
    disjoint over the ranks; a KV head held by several ranks is counted by the first of them only."""
    def reduce(x: Tensor) -> Tensor:
        return _SumOverShards.apply(x, group) if torch.is_grad_enabled() and x.requires_grad else \
            all_reduce_sum(x, group)

    first = {}
    for r, p in enumerate(plans):
        for kv in p.kv_heads:
            first.setdefault(kv, r)
    own = torch.tensor([float(first[kv] == rank) for kv in plans[rank].kv_heads])
    for norm, full, mask in ((shard.q_norm, attn.q_norm, None), (shard.k_norm, attn.k_norm, own)):
        norm.reduce, norm.total, norm.own = reduce, full.weight.numel(), mask


def plan_for(attn: MultiHeadAttention, world_size: int) -> list[RankHeads]:
    """Every rank's heads for this module (raises ValueError when world_size > attn.n_heads)."""
    return head_plan(attn.n_heads, world_size, kv_head_of=attn.kv_head_of)


def shard_heads(attn: MultiHeadAttention, group=None) -> MultiHeadAttention:
    """This rank's shard of `attn` (a new module; `attn` is left as it was).

    The shard holds this rank's contiguous run of query heads (9 over 2 ranks = 5 + 4), the KV heads they
    read (one read from two ranks is held on both), o_proj's matching columns and, on rank 0 only,
    o_proj's bias. Its output is all-reduced over `group` (default: the world), so every rank gets the
    full module's output. `shard.shard_plan` is the RankHeads (indices of `attn`'s heads);
    `shard.kept_heads` maps its heads back to the original model's. head_gates and need_weights are
    per shard: [shard.n_heads] gates, weights of this rank's heads only.

    Raises NotInitializedError without a process group (the message says how to start with torchrun),
    ValueError when the group has more ranks than attn has query heads.
    """
    if not isinstance(attn, MultiHeadAttention):
        raise TypeError(f"attn: expected a headcount.MultiHeadAttention, got {type(attn).__name__}")
    if getattr(attn, "shard_plan", None) is not None:
        raise ValueError("attn: this module is already a shard (shard_plan is set); shard the unsharded module")
    group, rank, world = runtime.resolve(group)
    plans = plan_for(attn, world)
    plan = plans[rank]
    shard = copy.deepcopy(attn)
    if world > 1:
        shard.prune_heads([h for h in range(attn.n_heads) if h not in set(plan.query_heads)])
        if rank != 0 and shard.o_proj.bias is not None:
            shard.o_proj.register_parameter("bias", None)  # added once, by rank 0
        if isinstance(shard.q_norm, FullRMSNorm):
            _share_statistics(shard, attn, plans, rank, group)
        install_collectives(shard, group)
    shard.shard_plan = plan
    return shard
