"""tensor_parallel: a plan applied to an unchanged headcount model (Decoder or Encoder), in place.

    attention   by heads (shard.py): each rank's query heads, the KV heads they read, o_proj's columns;
                one all-reduce after o_proj.
    MLP         column- then row-parallel: rank r keeps a contiguous block of the hidden units (d_ff
                split as evenly as heads are): those rows of gate/up (both halves of the fused
                [gate | up]), those columns of down, down's bias on rank 0 only; one all-reduce after down.
                A mixture of experts (models/moe.py) the same way inside every expert (each expert's
                d_expert hidden units split; the router replicated, so every rank routes alike).
    replicated  embeddings, position tables, norms, lm_head (tied or not) and the pooler: every rank
                holds them whole and computes them redundantly. Not vocab-parallel: for SmolLM2 the
                embedding is 28 M of 135 M parameters, and replicated logits need no gather.

Two all-reduces of B x T x d_model per block in the forward pass; the model's own code is untouched
(layers[i].attn is the shard, a MultiHeadAttention; layers[i].mlp keeps its class, with smaller Linears).
"""

from __future__ import annotations

import torch
from torch import nn

from headcount.attention import MultiHeadAttention
from headcount import distributed as runtime
from headcount.cost.head_split import split_even
from headcount.parallel.shard import install_collectives, plan_for, shard_heads


def _take(linear: nn.Linear, rows: list[int] | None = None, cols: list[int] | None = None) -> None:
    """Keep only these output rows / input columns of a Linear, in place (new Parameters)."""
    device = linear.weight.device
    with torch.no_grad():
        weight = linear.weight
        if rows is not None:
            index = torch.tensor(rows, device=device)
            weight = weight.index_select(0, index)
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias.index_select(0, index).clone(),
                                           requires_grad=linear.bias.requires_grad)
        if cols is not None:
            weight = weight.index_select(1, torch.tensor(cols, device=device))
        linear.weight = nn.Parameter(weight.clone(), requires_grad=linear.weight.requires_grad)
    linear.out_features, linear.in_features = linear.weight.shape


def _mlp_width(mlp: nn.Module) -> int:
    if hasattr(mlp, "d_expert"):  # MoEFeedForward: each expert's hidden width
        return mlp.d_expert
    if hasattr(mlp, "gate_up_proj"):
        return mlp.gate_up_proj.out_features // 2
    if hasattr(mlp, "up_proj") and hasattr(mlp, "down_proj"):
        return mlp.up_proj.out_features
    raise TypeError(f"mlp: expected a headcount MLP (gate_up_proj + down_proj, or up_proj + down_proj), "
                    f"got {type(mlp).__name__}")


def shard_mlp(mlp: nn.Module, group=None) -> nn.Module:
    """This rank's column block of an MLP, in place (returns it): column-parallel up, row-parallel down."""
    group, rank, world = runtime.resolve(group)
    d_ff = _mlp_width(mlp)
    cols = list(split_even(d_ff, world, what="d_ff")[rank])
    if world == 1:
        return mlp
    if hasattr(mlp, "d_expert"):  # experts [E, 2 f, d] / [E, d, f]: the same hidden units of every expert
        rows = torch.tensor(cols + [d_ff + c for c in cols], device=mlp.gate_up_proj.device)
        index = torch.tensor(cols, device=mlp.gate_up_proj.device)
        with torch.no_grad():
            mlp.gate_up_proj = nn.Parameter(mlp.gate_up_proj.index_select(1, rows).clone(),
                                            requires_grad=mlp.gate_up_proj.requires_grad)
            mlp.down_proj = nn.Parameter(mlp.down_proj.index_select(2, index).clone(),
                                         requires_grad=mlp.down_proj.requires_grad)
            if mlp.gate_up_bias is not None:
                mlp.gate_up_bias = nn.Parameter(mlp.gate_up_bias.index_select(1, rows).clone(),
                                                requires_grad=mlp.gate_up_bias.requires_grad)
        mlp.d_expert = len(cols)
        if rank != 0 and mlp.down_bias is not None:
            mlp.down_bias = None  # added once, by rank 0 (scaled by each token's routing weight there)
        install_collectives(mlp, group)
        return mlp
    if hasattr(mlp, "gate_up_proj"):
        _take(mlp.gate_up_proj, rows=cols + [d_ff + c for c in cols])  # rows [gate | up]: the same units of both
        mlp.d_ff = len(cols)
    else:
        _take(mlp.up_proj, rows=cols)
    _take(mlp.down_proj, cols=cols)
    if rank != 0 and mlp.down_proj.bias is not None:
        mlp.down_proj.register_parameter("bias", None)
    install_collectives(mlp, group)
    return mlp


def _layers(model: nn.Module):
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(
            isinstance(getattr(layer, "attn", None), MultiHeadAttention) and hasattr(layer, "mlp")
            for layer in layers):
        raise TypeError(f"model: expected a headcount model (layers[i].attn a MultiHeadAttention, layers[i].mlp), "
                        f"got {type(model).__name__}")
    return layers


def tensor_parallel(model: nn.Module, group=None, *, check_weights: bool = True) -> nn.Module:
    """Shard a headcount model over the ranks of `group` (default: the world), in place; returns it.

    Every rank must call it with the same model. check_weights (default) all-gathers a sha256 of the
    weights first and raises WeightMismatchError on every rank when they differ. Shapes that do not
    fit (more ranks than a layer has query heads, or than d_ff) raise ValueError on every rank before
    anything is changed or communicated. A world of one rank leaves the model as it is.
    """
    layers = _layers(model)
    if any(getattr(layer.attn, "shard_plan", None) is not None for layer in layers):
        raise ValueError("model: already sharded (its attention modules are shards)")
    group, rank, world = runtime.resolve(group)
    for i, layer in enumerate(layers):  # every rank reaches the same verdict, with no communication
        try:
            plan_for(layer.attn, world)
            split_even(_mlp_width(layer.mlp), world, what="d_ff")
        except ValueError as err:
            raise ValueError(f"layer {i}: {err}") from None
    if check_weights:
        runtime.check_same_weights(model, group)
    for layer in layers:
        layer.attn = shard_heads(layer.attn, group)
        shard_mlp(layer.mlp, group)
    return model


def tensor_parallel_from_env(model: nn.Module, *, log=None, timeout_s: float = runtime.DEFAULT_TIMEOUT_S) -> bool:
    """What `headcount generate --tp` does: join torchrun's group (or a world of one, said through `log`),
    shard the model in place, and return True on the rank that prints (rank 0)."""
    group = runtime.init_or_single(timeout_s=timeout_s, log=log)
    tensor_parallel(model, group)
    return runtime.is_main(group)


def shared_seed(seed: int | None, group=None) -> int:
    """One sampling seed for every rank (rank 0's), so sampled tokens, and the number of steps, agree."""
    import torch.distributed as dist

    group, rank, world = runtime.resolve(group)
    value = torch.tensor([seed if seed is not None else int(torch.seed() % (2**62))], dtype=torch.long)
    if world > 1:
        if dist.get_backend(group) == "nccl":
            value = value.cuda()
        dist.broadcast(value, src=dist.get_global_rank(group, 0), group=group)
    return int(value.item())
