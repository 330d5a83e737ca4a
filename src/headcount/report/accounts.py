"""The model's shape and its three accounts as MHA, as its GQA and as MQA (chapter 2.3.3, 2.3.7).

Everything comes from headcount.cost (pure arithmetic); only n_kv_heads changes between the rows. The shape
is read from the loaded model's own config, every field the cost accounts count: head_dim decoupled from
d_model, the gated MLP, RMSNorm, q/k norms, the post-attention / post-MLP norms and the per-layer sliding
windows (Gemma 3), biases on Q, K, V only (Qwen2). A BidirectionalEncoder (a decoder stack without the
causal mask, EmbeddingGemma) is counted as an encoder; the cost accounts count windows for causal decoders
only, so its windowed layers are counted as global and the shape says so.
"""

from __future__ import annotations

SEQ = 2048  # the context the accounts are stated at
DTYPE = "bf16"
COUNTED_FIELDS = ("qk_norm", "post_norms", "sliding_window", "layer_types", "head_dim")  # beyond the basic shape


def _decoder_stack_shape(cfg, name: str, *, causal: bool):
    """ModelShape of a DecoderConfig: a Decoder (causal) or a BidirectionalEncoder (causal=False)."""
    from headcount.cost import ModelShape

    window, types = _windows(cfg)
    moe = getattr(cfg, "moe", None)
    extra = {} if moe is None else {  # a mixture of experts: total and active parameters (cost/accounts.py)
        "n_experts": moe.n_experts, "experts_per_token": moe.top_k, "d_expert": moe.d_expert,
        "expert_bias": moe.expert_bias, "router_bias": moe.router_bias,
        "moe_layers": cfg.n_layers - len(moe.dense_layers)}
    return ModelShape(
        d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        n_layers=cfg.n_layers, d_ff=cfg.d_ff, mlp="gated" if str(cfg.mlp).startswith("gated") else "gelu",
        vocab_size=cfg.vocab_size, tied_embeddings=cfg.tie_embeddings,
        position="learned" if cfg.position == "learned" else "rotary", max_positions=cfg.max_position,
        attn_bias=cfg.qkv_bias, o_bias=cfg.o_bias, mlp_bias=cfg.mlp_bias,
        norm="rmsnorm" if str(cfg.norm).startswith("rms") else "layernorm", final_norm=True,
        qk_norm=bool(getattr(cfg, "qk_norm", False)), post_norms=bool(getattr(cfg, "post_norms", False)),
        sliding_window=window if causal else None, layer_types=types if causal else None,
        arch="decoder" if causal else "encoder", name=name, attn_sinks=bool(getattr(cfg, "attn_sinks", False)),
        qk_norm_full=bool(getattr(cfg, "qk_norm_full", False)), **extra)


def _windows(cfg) -> tuple[int | None, tuple[str, ...] | None]:
    """(sliding_window, layer_types) in the cost accounts' spelling: None, None when no layer is windowed;
    layer_types None with a window = every layer local (what both the model and ModelShape mean by it)."""
    w = getattr(cfg, "sliding_window", None)
    if w is None:
        return None, None
    types = getattr(cfg, "layer_types", None)
    return w, (tuple(types) if types is not None else None)


def window_note(model) -> str | None:
    """Why a windowed model's accounts leave its windows out (a bidirectional encoder), or None."""
    cfg = model.config
    if getattr(cfg, "causal", True) or getattr(cfg, "sliding_window", None) is None:
        return None
    types = getattr(cfg, "layer_types", None)
    n = cfg.n_layers if types is None else sum(t == "sliding_attention" for t in types)
    return (f"bidirectional sliding window {cfg.sliding_window} (|p - j| < {cfg.sliding_window}) on {n} of "
            f"{cfg.n_layers} layers is not in these accounts: headcount.cost counts windows for causal decoders "
            "only, so every layer is counted as global here")


def shape_of(model):
    """headcount.cost.ModelShape of a loaded headcount model (from its config, exact)."""
    from headcount.cost import ModelShape

    cfg = model.config
    name = str(getattr(model, "name", None) or "model")
    if hasattr(model, "lm_head"):  # Decoder
        return _decoder_stack_shape(cfg, name, causal=True)
    if hasattr(cfg, "n_kv_heads"):  # BidirectionalEncoder: a DecoderConfig with causal=False
        return _decoder_stack_shape(cfg, name, causal=False)
    return ModelShape(
        d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers, d_ff=cfg.d_ff, mlp="gelu",
        vocab_size=cfg.vocab_size, position="learned", max_positions=cfg.max_position,
        type_vocab_size=cfg.type_vocab_size, attn_bias=True, norm="layernorm", embedding_norm=True,
        pooler=bool(cfg.pooler), arch="encoder", name=name)


def _variants(n_heads: int, n_kv_heads: int) -> list[tuple[str, int]]:
    """(label, n_kv_heads) for MHA, a GQA (the model's own, or a middle divisor) and MQA."""
    if 1 < n_kv_heads < n_heads:
        gqa = n_kv_heads
    else:
        divisors = [d for d in range(2, n_heads) if n_heads % d == 0]
        gqa = divisors[len(divisors) // 2] if divisors else None
    rows = [("MHA", n_heads)]
    if gqa is not None:
        rows.append(("GQA", gqa))
    if n_heads > 1:
        rows.append(("MQA", 1))
    return rows


def accounts(shape, *, seq: int = SEQ, dtype: str = DTYPE) -> dict:
    """{"seq", "dtype", "model_kind", "rows": [{label, n_kv_heads, params, attention_params, kv_bytes_per_token,
    kv_bytes_context, flops, score_bytes_per_layer, is_model}], and with sliding windows "window":
    {"size", "local_layers", "global_layers"} and in each row kv_bytes_context_without_window,
    kv_bytes_per_token_past_window and flops_without_window}: headcount.cost.report's numbers, as they are."""
    from headcount.cost import report

    rows = []
    for label, n_kv in _variants(shape.n_heads, shape.n_kv_heads):
        r = report(shape.replace(n_kv_heads=n_kv), batch=1, seq=seq, dtype=dtype)
        kv, flops = r["kv_cache"], r["flops"]
        row = {
            "label": label,
            "n_kv_heads": n_kv,
            "params": r["params"]["total"],
            "attention_params": r["params"]["attention_all_layers"],
            "kv_bytes_per_token": kv["bytes_per_token"],
            "kv_bytes_context": kv["bytes_for_context"],
            "flops": flops["total_causal" if shape.arch == "decoder" else "total"],
            "score_bytes_per_layer": r["score_memory_bytes"]["eager_per_layer"],
            "is_model": n_kv == shape.n_kv_heads,
        }
        if shape.sliding_window is not None:
            row |= {"kv_bytes_context_without_window": kv["bytes_for_context_without_window"],
                    "kv_bytes_per_token_past_window": kv["bytes_per_token_past_window"],
                    "flops_without_window": flops["total_causal_without_window"]}
        rows.append(row)
    out = {"seq": seq, "dtype": dtype, "model_kind": shape.attention_kind, "rows": rows}
    if shape.sliding_window is not None:
        out["window"] = {"size": shape.sliding_window, "local_layers": shape.local_layers,
                         "global_layers": shape.global_layers}
    return out


def shape_json(shape, note: str | None = None) -> dict:
    """The shape as report.json holds it: every ModelShape field, its attention kind, one line describing it
    (headcount.cost.describe) and, when the accounts leave something of the model out, a note saying what."""
    from headcount.cost import describe

    d = shape.as_dict()
    if d.get("layer_types") is not None:
        d["layer_types"] = list(d["layer_types"])
    d["attention_kind"] = shape.attention_kind
    d["describe"] = describe(shape)
    if note:
        d["note"] = note
    return d
