"""The model's shape and its three accounts as MHA, as its GQA and as MQA (chapter 2.3.3, 2.3.7).

Everything comes from headcount.cost (pure arithmetic); only n_kv_heads changes between the rows.
"""

from __future__ import annotations

SEQ = 2048  # the context the accounts are stated at
DTYPE = "bf16"


def shape_of(model):
    """headcount.cost.ModelShape of a loaded headcount model (from its config, exact)."""
    from headcount.cost import ModelShape

    cfg = model.config
    name = str(getattr(model, "name", None) or "model")
    if hasattr(model, "lm_head"):  # Decoder
        return ModelShape(
            d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
            n_layers=cfg.n_layers, d_ff=cfg.d_ff, mlp="gated" if cfg.mlp == "gated_silu" else "gelu",
            vocab_size=cfg.vocab_size, tied_embeddings=cfg.tie_embeddings,
            position="learned" if cfg.position == "learned" else "rotary", max_positions=cfg.max_position,
            attn_bias=cfg.qkv_bias, o_bias=cfg.o_bias, mlp_bias=cfg.mlp_bias,
            norm="rmsnorm" if cfg.norm == "rms" else "layernorm", final_norm=True, arch="decoder", name=name)
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
    kv_bytes_context, flops_causal, score_bytes_per_layer, is_model}]}"""
    from headcount.cost import report

    rows = []
    for label, n_kv in _variants(shape.n_heads, shape.n_kv_heads):
        r = report(shape.replace(n_kv_heads=n_kv), batch=1, seq=seq, dtype=dtype)
        rows.append({
            "label": label,
            "n_kv_heads": n_kv,
            "params": r["params"]["total"],
            "attention_params": r["params"]["attention_all_layers"],
            "kv_bytes_per_token": r["kv_cache"]["bytes_per_token"],
            "kv_bytes_context": r["kv_cache"]["bytes_for_context"],
            "flops": r["flops"]["total_causal" if shape.arch == "decoder" else "total"],
            "score_bytes_per_layer": r["score_memory_bytes"]["eager_per_layer"],
            "is_model": n_kv == shape.n_kv_heads,
        })
    return {"seq": seq, "dtype": dtype, "model_kind": shape.attention_kind, "rows": rows}


def shape_json(shape) -> dict:
    from headcount.cost import describe

    d = shape.as_dict()
    d["attention_kind"] = shape.attention_kind
    d["describe"] = describe(shape)
    return d
