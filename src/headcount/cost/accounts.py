"""The three accounts (chapter 2.3.3) and the KV cache (2.3.7), exact, in integers.

Conventions (stated in every output):
- FLOPs: a multiply-add is 2 FLOPs; only matrix multiplications are counted (projections, Q K^T,
  A V, MLP, logits). Softmax, norms, activations, bias adds and the embedding lookup are not: they
  are O(n d) or O(n^2 h) additions next to O(n d^2) and O(n^2 d) products, and FlopCounterMode does
  not count them either, which is what lets tests compare the two exactly.
- Forward pass over B sequences of n tokens, every position attended and projected (training / prefill).
- Causal attention: Q K^T and A V halved (only the lower triangle is needed); projections unchanged.
- Score memory: the eager path materialises the scores [B, n_heads, n, n] and the softmax output of the
  same size; a fused kernel (FlashAttention, SDPA) never holds an n x n tensor.
- Sliding windows (local layers, ModelShape.sliding_window = w): query i sees keys j with i - w < j <= i,
  at most w of them. A local layer's KV cache holds min(n, w) positions. Its causal score and read
  FLOPs count the band in the causal account's own convention (the diagonal counted half, so that the
  causal triangle is n^2 / 2): n w - w^2 / 2 query-key pairs per head when w < n, n^2 / 2 otherwise;
  window_pairs() gives the exact pair count (diagonal whole). A kernel that computes only the band holds
  B x n_heads x n x min(n, w) scores; a masked eager path (transformers', headcount's) still holds n x n.
"""

from __future__ import annotations

from headcount.arguments import positive_int
from headcount.cost.shape import CostError, ModelShape, describe, parse_dtype

FLOP_CONVENTION = ("a multiply-add is 2 FLOPs; matrix multiplications only (softmax, norms, activations, "
                   "bias adds not counted); forward pass over every position")


def _norm_params(shape: ModelShape) -> int:
    return 2 * shape.d_model if shape.norm == "layernorm" else shape.d_model


def norms_per_block(shape: ModelShape, *, cross: bool = False) -> int:
    """Norms in one block: one per sub-layer (attention, MLP, and a cross-attention), two with post_norms."""
    return (3 if cross else 2) * (2 if shape.post_norms else 1)


# ----------------------------------------------------------------------------------------- params
def attention_params(shape: ModelShape) -> dict[str, int]:
    """W_Q, W_K, W_V, W_O of one attention module, with the shape's biases, and with none / all of them."""
    d, hd = shape.d_model, shape.head_dim
    q = d * shape.n_heads * hd
    k = v = d * shape.n_kv_heads * hd
    o = shape.n_heads * hd * d
    qkv_bias = (shape.n_heads + 2 * shape.n_kv_heads) * hd
    qk_norm = 2 * hd if shape.qk_norm else 0  # one head_dim weight vector for Q and one for K, shared by heads
    if shape.qk_norm and shape.qk_norm_full:  # over the whole projections: one weight per Q / K row
        qk_norm = (shape.n_heads + shape.n_kv_heads) * hd
    sinks = shape.n_heads if shape.attn_sinks else 0  # one learned sink logit per query head
    weights = q + k + v + o + qk_norm + sinks
    bias = (qkv_bias if shape.attn_bias else 0) + (d if shape.o_bias else 0)
    return {"q": q, "k": k, "v": v, "o": o, "qk_norm": qk_norm, "sinks": sinks, "bias": bias, "total": weights + bias,
            "total_without_bias": weights, "total_with_bias": weights + qkv_bias + d}


def mlp_params(shape: ModelShape) -> int:
    d, f = shape.d_model, shape.d_ff
    if shape.mlp == "gated":  # gate, up: d -> f; down: f -> d
        return 3 * d * f + ((2 * f + d) if shape.mlp_bias else 0)
    return 2 * d * f + ((f + d) if shape.mlp_bias else 0)


def expert_params(shape: ModelShape) -> dict[str, int]:
    """One MoE layer: each expert (gate, up: d -> d_expert; down: d_expert -> d; with expert biases), the
    router (d -> n_experts, its bias), all of it, and what one token reads (experts_per_token experts + router)."""
    d, f, e = shape.d_model, shape.d_expert, shape.n_experts
    expert = 3 * d * f + ((2 * f + d) if shape.expert_bias else 0)
    router = d * e + (e if shape.router_bias else 0)
    return {"expert": expert, "router": router, "total": e * expert + router,
            "active": shape.experts_per_token * expert + router}


def param_counts(shape: ModelShape) -> dict:
    """Every parameter of the model, by part, and the total. A mixture of experts adds "experts" (one MoE
    layer's account) and "active_per_token": the parameters one token's forward reads (experts_per_token of
    n_experts experts in each MoE layer); dense models read every one (active_per_token = total)."""
    attn = attention_params(shape)
    mlp = mlp_params(shape)
    norm = _norm_params(shape)
    d = shape.d_model
    norms = norms_per_block(shape) * norm  # pre-attention and pre-MLP norms (or post-, same count); 4 with post_norms
    moe = expert_params(shape) if shape.n_experts else None
    if moe is not None and shape.moe_layers == shape.n_layers:
        mlp = moe["total"]  # every layer's feed-forward is the experts
    layer = attn["total"] + mlp + norms
    counts = {
        "attention_per_layer": attn["total"],
        "attention_per_layer_detail": attn,
        "mlp_per_layer": mlp,
        "norms_per_layer": norms,
        "per_layer": layer,
        "layers": shape.n_layers * layer,
    }
    if moe is not None:  # MoE layers hold the experts, the others (Qwen3-MoE's mlp_only_layers) the dense MLP
        dense = mlp_params(shape)
        counts["experts"] = moe
        counts["layers"] = shape.n_layers * (attn["total"] + norms) + shape.moe_layers * moe["total"] + (
            shape.n_layers - shape.moe_layers) * dense
    if shape.arch == "encoder-decoder":
        decoder_layer = 2 * attn["total"] + mlp + norms_per_block(shape, cross=True) * norm  # self-, cross-attn, MLP
        counts["decoder_per_layer"] = decoder_layer
        counts["layers"] = shape.n_layers * (layer + decoder_layer)
    counts["attention_all_layers"] = shape.n_attention_modules * attn["total"]
    counts["embeddings"] = shape.vocab_size * d
    counts["positions"] = shape.max_positions * d if shape.position == "learned" else 0
    counts["token_types"] = shape.type_vocab_size * d
    counts["embedding_norm"] = norm if shape.embedding_norm else 0
    counts["final_norm"] = norm if shape.final_norm else 0
    counts["lm_head"] = shape.vocab_size * d if shape.has_lm_head and not shape.tied_embeddings else 0
    counts["pooler"] = d * d + d if shape.pooler else 0
    counts["total"] = sum(counts[k] for k in ("layers", "embeddings", "positions", "token_types", "embedding_norm",
                                              "final_norm", "lm_head", "pooler"))
    counts["active_per_token"] = counts["total"] - (
        shape.moe_layers * (moe["total"] - moe["active"]) if moe is not None else 0)
    return counts


# ------------------------------------------------------------------------------------------ FLOPs
def window_pairs(seq: int, window: int | None = None) -> int:
    """Exact (query, key) pairs of causal attention over n tokens, each query seeing at most `window` keys
    (itself included; None = no window): sum over i of min(i + 1, w) = n (n + 1) / 2 when w >= n, else
    w (w + 1) / 2 + (n - w) w."""
    n, w = seq, seq if window is None else min(window, seq)
    return w * (w + 1) // 2 + (n - w) * w


def _band_half_diagonal(seq: int, window: int) -> int:
    """2 x the band's pairs with the diagonal counted half (the causal account's convention): 2 n w - w^2
    for w < n, n^2 for w >= n (= the causal triangle). An integer, so the FLOPs stay exact."""
    w = min(window, seq)
    return 2 * window_pairs(seq, w) - w


def attention_flops(shape: ModelShape, batch: int, seq: int, *, causal: bool = False,
                    local: bool = False) -> dict[str, int]:
    """One attention module over B sequences of n tokens (self-attention, or cross-attention over n keys).

    projections: X W_Q, X W_K, X W_V  2 B n d (n_heads + 2 n_kv_heads) head_dim
    scores:      Q K^T               2 B n_heads n^2 head_dim  (every query head, GQA or not)
    read:        A V                 2 B n_heads n^2 head_dim
    output:      concat(heads) W_O   2 B n n_heads head_dim d
    causal halves scores and read. local (with causal; a layer limited to shape.sliding_window = w):
    scores and read over the band, B n_heads head_dim (2 n w - w^2) each when w < n (the causal count
    when w >= n).
    """
    b, n, d, h, hd = batch, seq, shape.d_model, shape.n_heads, shape.head_dim
    if local and (not causal or shape.sliding_window is None):
        raise CostError("local: a sliding-window layer's account is causal and needs shape.sliding_window")
    proj = 2 * b * n * d * (h + 2 * shape.n_kv_heads) * hd
    scores = 2 * b * h * n * n * hd
    read = 2 * b * h * n * n * hd
    if causal:
        scores, read = scores // 2, read // 2
    if local:
        scores = read = b * h * hd * _band_half_diagonal(n, shape.sliding_window)
    out = 2 * b * n * h * hd * d
    return {"projections": proj, "scores": scores, "read": read, "output": out,
            "total": proj + scores + read + out}


def mlp_flops(shape: ModelShape, batch: int, seq: int) -> int:
    """One dense MLP layer; a MoE layer's FLOPs are those of its active parameters (moe_flops)."""
    return 2 * batch * seq * (3 if shape.mlp == "gated" else 2) * shape.d_model * shape.d_ff


def moe_flops(shape: ModelShape, batch: int, seq: int) -> int:
    """One MoE layer: each token through experts_per_token experts (gate, up, down) and the router,
    2 B n (experts_per_token x 3 d d_expert + d n_experts): not the dense-equivalent n_experts x that."""
    d = shape.d_model
    return 2 * batch * seq * (shape.experts_per_token * 3 * d * shape.d_expert + d * shape.n_experts)


def flop_counts(shape: ModelShape, batch: int, seq: int) -> dict:
    full = attention_flops(shape, batch, seq)
    causal = attention_flops(shape, batch, seq, causal=True)
    mlp = mlp_flops(shape, batch, seq)
    logits = 2 * batch * seq * shape.d_model * shape.vocab_size if shape.has_lm_head else 0
    n_attn, n_mlp = shape.n_attention_modules, shape.n_blocks
    mlp_total = n_mlp * mlp
    if shape.n_experts:  # the MoE layers' active FLOPs (per MoE layer in mlp_per_layer), the dense layers' own
        mlp = moe_flops(shape, batch, seq)
        mlp_total = shape.moe_layers * mlp + (shape.n_layers - shape.moe_layers) * mlp_flops(shape, batch, seq)
    attention_total = n_attn * full["total"]
    attention_total_causal = n_attn * causal["total"]
    out = {
        "attention_per_layer": full,
        "attention_per_layer_causal": causal,
        "attention_modules": n_attn,
        "attention_total": attention_total,
        "attention_total_causal": attention_total_causal,
        "scores_and_read_total": n_attn * (full["scores"] + full["read"]),
        "mlp_per_layer": mlp,
        "mlp_total": mlp_total,
        "logits": logits,
        "total": attention_total + mlp_total + logits,
        "total_causal": attention_total_causal + mlp_total + logits,
        "convention": FLOP_CONVENTION,
    }
    if shape.sliding_window is not None:  # a decoder: local layers bounded by the window
        local = attention_flops(shape, batch, seq, causal=True, local=True)
        windowed = shape.global_layers * causal["total"] + shape.local_layers * local["total"]
        out.update({
            "attention_per_local_layer_causal": local,
            "global_layers": shape.global_layers,
            "local_layers": shape.local_layers,
            "window": shape.sliding_window,
            "attention_total_causal": windowed,
            "attention_total_causal_without_window": attention_total_causal,
            "total_causal": windowed + mlp_total + logits,
            "total_causal_without_window": attention_total_causal + mlp_total + logits,
            "pairs_per_head_exact": {"global_layer": window_pairs(seq), "local_layer": window_pairs(seq, shape.sliding_window)},
        })
    return out


# ---------------------------------------------------------------------------------- score memory
def score_memory(shape: ModelShape, batch: int, seq: int, dtype_bytes: int) -> dict:
    """Bytes of the n x n tensors one attention layer holds (self-attention over n tokens)."""
    scores = batch * shape.n_heads * seq * seq * dtype_bytes
    out = {
        "eager_per_layer": scores,  # Q K^T: B x n_heads x n x n numbers (the chapter's number)
        "eager_softmax_per_layer": scores,  # the softmax output, same size, also held by the eager path
        "eager_peak_per_layer": 2 * scores,  # both alive while the softmax is written
        "eager_training_all_layers": shape.n_attention_modules * scores,  # softmax outputs saved for backward
        "fused_per_layer": 0,  # FlashAttention / SDPA: never an n x n tensor
        "elements_per_layer": batch * shape.n_heads * seq * seq,
    }
    if shape.sliding_window is not None:
        band = batch * shape.n_heads * seq * min(seq, shape.sliding_window) * dtype_bytes
        out.update({
            # a kernel that computes only the band: each query's at most w keys (n x min(n, w) per head)
            "banded_per_local_layer": band,
            "banded_peak_per_local_layer": 2 * band,
            # a masked eager path still materialises n x n on local layers too
            "eager_masked_per_local_layer": scores,
            "banded_training_all_layers": shape.global_layers * scores + shape.local_layers * band,
        })
    return out


# -------------------------------------------------------------------------------------- KV cache
def kv_cache(shape: ModelShape, batch: int, seq: int, dtype_bytes: int) -> dict:
    """bytes per token = 2 (K and V) x n_layers x n_kv_heads x head_dim x bytes."""
    layers = shape.n_layers  # decoder blocks (for an encoder-decoder, the decoder stack)
    per_layer = 2 * shape.n_kv_heads * shape.head_dim * dtype_bytes
    per_token = layers * per_layer
    w = shape.sliding_window
    local_positions = seq if w is None else min(seq, w)
    with_window = batch * per_layer * (shape.global_layers * seq + shape.local_layers * local_positions)
    result = {
        "bytes_per_token": per_token,
        "bytes_per_token_per_layer": per_layer,
        "layers": layers,
        "context": seq,
        "batch": batch,
        "bytes_for_context": with_window,
        "mha_bytes_per_token": 2 * layers * shape.n_heads * shape.head_dim * dtype_bytes,
        "global_layers": shape.global_layers,
        "local_layers": shape.local_layers,
        "window": w,
        "bytes_for_context_without_window": per_token * seq * batch,
    }
    if w is not None:
        result.update({
            "positions_per_global_layer": seq,
            "positions_per_local_layer": local_positions,
            # what one more token adds once the context is past the window (only global layers grow)
            "bytes_per_token_past_window": shape.global_layers * per_layer,
            "mha_bytes_for_context": batch * 2 * shape.n_heads * shape.head_dim * dtype_bytes * (
                shape.global_layers * seq + shape.local_layers * local_positions),
        })
    if shape.arch == "encoder":
        result["note"] = "an encoder keeps no KV cache; these are the bytes one would hold"
    elif shape.arch == "encoder-decoder":
        result["note"] = ("decoder self-attention only; the cross-attention K/V of the source add the same "
                          "bytes per source token")
    return result


# ---------------------------------------------------------------------------------------- report
def _check_run(batch: int, seq: int) -> None:
    for name, value in (("batch", batch), ("seq", seq)):
        positive_int(name, value, expected="a positive whole number", error=CostError)


def report(shape: ModelShape, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16") -> dict:
    """Everything, as one JSON-ready dict: params, flops, score_memory_bytes, kv_cache, weights_bytes."""
    _check_run(batch, seq)
    dtype_name, nbytes = parse_dtype(dtype)
    params = param_counts(shape)
    return {
        "model": shape.name,
        "shape": shape.as_dict() | {"attention_kind": shape.attention_kind, "describe": describe(shape)},
        "batch": batch,
        "seq": seq,
        "dtype": dtype_name,
        "bytes_per_element": nbytes,
        "conventions": {
            "flops": FLOP_CONVENTION,
            "causal": "scores (Q K^T) and read (A V) halved; projections and MLP unchanged",
            "score_memory": "eager path holds the scores and the softmax output, B x n_heads x n x n each; "
                            "a fused kernel holds neither; an eager path that computes the softmax in fp32 "
                            "for fp16/bf16 (headcount's, transformers') holds 4-byte scores",
            "kv_cache": "2 (K and V) x n_layers x n_kv_heads x head_dim x bytes per token",
            **({"sliding_window": f"local layers ({shape.local_layers} of {shape.n_layers}) see the last "
                                  f"{shape.sliding_window} keys: their KV cache holds min(n, {shape.sliding_window}) "
                                  "positions; causal scores and read count the band (n w - w^2/2 pairs per head, "
                                  "the diagonal counted half as in the causal triangle n^2/2); a banded kernel holds "
                                  "n x min(n, w) scores per head, a masked eager path n x n"}
               if shape.sliding_window is not None else {}),
        },
        "params": params,
        "weights_bytes": params["total"] * nbytes,
        "flops": flop_counts(shape, batch, seq),
        "score_memory_bytes": score_memory(shape, batch, seq, nbytes),
        "kv_cache": kv_cache(shape, batch, seq, nbytes),
    }
