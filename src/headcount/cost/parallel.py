"""Per-rank accounts under tensor parallelism by heads (`headcount cost --tp N`). Pure Python: no torch.

The split is head_split.py's (pure arithmetic; headcount.parallel shards with it too, so the accounts and the shards can
never disagree): rank r holds a contiguous run of query heads (as even as possible: 9 over 2 = 5 + 4),
the KV heads those heads read, o_proj's matching columns, a contiguous block of the MLP's hidden units
(d_ff split the same way) and the matching columns of its down projection. Everything else is
replicated: embeddings, position tables, norms, the LM head, the pooler. o_proj's and down's biases
are added once, by rank 0.

A KV head read by query heads on two ranks is held, and cached, on both ("replicated"): with
n_kv_heads < N, or N not dividing it along group boundaries, the ranks together store more KV heads
(and more KV cache) than one process does. The accounts count every replica.

All-reduce: two per block in the forward pass (after W_O, after the MLP's down projection), each of
d_model values per token: 2 x d_model x bytes per token per layer (none with one rank). That is the
payload each rank contributes; a ring all-reduce sends 2 (N - 1) / N of it from every rank.
"""

from __future__ import annotations

from headcount.arguments import positive_int
from headcount.cost.accounts import _norm_params, norms_per_block, param_counts
from headcount.cost.shape import CostError, ModelShape, parse_dtype
from headcount.cost.head_split import head_plan, split_even, stored_kv_heads

REPLICATED = ("embeddings", "positions", "token_types", "embedding_norm", "final_norm", "lm_head", "pooler")
ALLREDUCES_PER_BLOCK = 2  # after W_O and after the MLP's down projection (a cross-attention adds a third)


def _check_tp(tp, shape: ModelShape) -> int:
    positive_int("--tp", tp, expected="a positive number of ranks", error=CostError)
    if tp > shape.n_heads:
        raise CostError(f"--tp: {tp} ranks is more than the {shape.n_heads} query heads; every rank needs at least "
                        f"one (use at most {shape.n_heads})")
    if tp > shape.d_ff:
        raise CostError(f"--tp: {tp} ranks is more than d_ff={shape.d_ff} MLP units")
    return tp


def _attention(shape: ModelShape, nq: int, nkv: int, rank: int) -> int:
    d, hd = shape.d_model, shape.head_dim
    weights = d * nq * hd + 2 * d * nkv * hd + nq * hd * d + (2 * hd if shape.qk_norm else 0)  # q/k norm: every rank
    bias = ((nq + 2 * nkv) * hd if shape.attn_bias else 0) + (d if shape.o_bias and rank == 0 else 0)
    return weights + bias


def _mlp(shape: ModelShape, f: int, rank: int) -> int:
    d = shape.d_model
    down_bias = d if shape.mlp_bias and rank == 0 else 0
    if shape.mlp == "gated":
        return 3 * d * f + ((2 * f + down_bias) if shape.mlp_bias else 0)
    return 2 * d * f + ((f + down_bias) if shape.mlp_bias else 0)


def per_rank(shape: ModelShape, tp: int, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16") -> dict:
    """{"world_size", "per_rank": [...], "summary": {...}}: one account per rank (JSON-ready)."""
    tp = _check_tp(tp, shape)
    _, nbytes = parse_dtype(dtype)
    plan = head_plan(shape.n_heads, tp, n_kv_heads=shape.n_kv_heads)
    units = split_even(shape.d_ff, tp, what="d_ff")
    full = param_counts(shape)
    replicated = sum(full[k] for k in REPLICATED)
    norm = _norm_params(shape)
    d, hd = shape.d_model, shape.head_dim
    allreduce = ALLREDUCES_PER_BLOCK * d * nbytes if tp > 1 else 0
    window = shape.sliding_window  # local layers cache min(seq, window) positions, on every rank alike
    layer_positions = shape.global_layers * seq + shape.local_layers * (seq if window is None else min(seq, window))
    ranks = []
    for p, f in zip(plan, units):
        nq, nkv = len(p.query_heads), len(p.kv_heads)
        attn = _attention(shape, nq, nkv, p.rank)
        mlp = _mlp(shape, len(f), p.rank)
        layer = attn + mlp + norms_per_block(shape) * norm
        layers = shape.n_layers * layer
        if shape.arch == "encoder-decoder":
            layers += shape.n_layers * (2 * attn + mlp + norms_per_block(shape, cross=True) * norm)
        total = layers + replicated
        kv_token = 2 * shape.n_layers * nkv * hd * nbytes
        kv_context = 2 * nkv * hd * nbytes * batch * layer_positions
        ranks.append({
            "rank": p.rank,
            "query_heads": list(p.query_heads),
            "kv_heads": list(p.kv_heads),
            "replicated_kv_heads": list(p.replicated_kv_heads),
            "mlp_units": [f.start, f.stop],
            "params": {"attention_per_layer": attn, "mlp_per_layer": mlp, "per_layer": layer,
                       "replicated": replicated, "total": total},
            "weights_bytes": total * nbytes,
            "kv_cache": {"bytes_per_token": kv_token, "bytes_for_context": kv_context}
            | ({"bytes_for_context_without_window": kv_token * seq * batch} if window is not None else {}),
            "score_memory_bytes": {"eager_per_layer": batch * nq * seq * seq * nbytes, "fused_per_layer": 0}
            | ({"banded_per_local_layer": batch * nq * seq * min(seq, window) * nbytes} if window is not None else {}),
            "allreduce_bytes_per_token_per_layer": allreduce,
        })
    stored = stored_kv_heads(plan)
    kv_sum = sum(r["kv_cache"]["bytes_per_token"] for r in ranks)
    single_kv = 2 * shape.n_layers * shape.n_kv_heads * hd * nbytes
    summary = {
        "world_size": tp,
        "kv_heads_stored": stored,
        "kv_heads_model": shape.n_kv_heads,
        "kv_cache_bytes_per_token_all_ranks": kv_sum,
        "kv_cache_bytes_per_token_one_process": single_kv,
        "kv_cache_replication": stored / shape.n_kv_heads,
        "kv_cache_bytes_for_context_all_ranks": sum(r["kv_cache"]["bytes_for_context"] for r in ranks),
        "kv_cache_bytes_for_context_one_process": single_kv // shape.n_layers * batch * layer_positions,
        "params_all_ranks": sum(r["params"]["total"] for r in ranks),
        "params_one_process": full["total"],
        "replicated_params_per_rank": replicated,
        "allreduces_per_layer": ALLREDUCES_PER_BLOCK if tp > 1 else 0,
        "allreduce_bytes_per_token": allreduce * shape.n_blocks,
        "ring_bytes_sent_per_rank_per_token": (2 * (tp - 1) * allreduce * shape.n_blocks) // tp,
        "conventions": {
            "split": "contiguous query heads, as even as possible, first ranks one more; the KV heads they read; "
                     "d_ff split the same way; embeddings, norms, LM head replicated; o_proj / down bias on rank 0",
            "kv_cache": "2 (K and V) x n_layers x the rank's KV heads x head_dim x bytes per token; a KV head read "
                        "from two ranks is cached on both; a local (sliding-window) layer holds min(seq, window) "
                        "positions; q/k norm weights, if any, are held by every rank",
            "allreduce": "2 per layer (after W_O and after the MLP) of d_model values per token; a ring all-reduce "
                         "sends 2 (N-1)/N of that payload from every rank",
        },
    }
    if shape.arch == "encoder-decoder":
        summary["note"] = "a decoder block of an encoder-decoder has a third all-reduce (its cross-attention)"
    return {"world_size": tp, "per_rank": ranks, "summary": summary}
