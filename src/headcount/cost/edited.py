"""The accounts of an EDITED model: every layer its own query and K/V head counts (a prune, a merge of some
layers), against the model it came from, and what an engine serving both should see.

ModelShape holds one head count for every layer; an edit breaks that. Here the base shape stays a ModelShape and
the edit is the list of (n_heads, n_kv_heads) per layer; each layer's account is accounts.py's own formula applied
to a one-layer view with that layer's counts (so the two can never disagree), and the rest of the model (MLPs,
norms, embeddings) is the base shape's. Pure Python, like the rest of cost/.

Serving predictions (what `headcount bench serve` sets beside each measured ratio), for B sequences at context n:
  KV bytes      sum over layers of 2 x n_kv_heads x head_dim x positions x bytes (positions: min(n, window) on a
                local layer)
  prefill       causal forward FLOPs over B x n tokens (attention + MLP), plus the logits of the last position
                of each sequence (engines compute only those): the speed-up is FLOPs(base) / FLOPs(edit)
  decode        one step reads every weight once and each sequence's KV cache: bytes(base) / bytes(edit), with
                bytes = parameters x weight bytes + B x KV bytes at n (the memory-bound regime of decoding)
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path

from headcount.cost.accounts import FLOP_CONVENTION, attention_flops, attention_params, mlp_flops, param_counts
from headcount.cost.shape import CostError, ModelShape, parse_dtype


@dataclass(frozen=True)
class EditedShape:
    """A base ModelShape and each layer's (n_heads, n_kv_heads) after an edit."""

    base: ModelShape
    heads: tuple[tuple[int, int], ...]
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if len(self.heads) != self.base.n_layers:
            raise CostError(f"heads: {len(self.heads)} layers given for a model of {self.base.n_layers}")
        for i, (nh, nkv) in enumerate(self.heads):
            if (nh, nkv) != (0, 0) and (nh < 1 or nkv < 1 or nkv > nh):  # (0, 0): attention dropped
                raise CostError(f"heads: layer {i} has {nh} query and {nkv} K/V heads")

    @classmethod
    def unedited(cls, base: ModelShape, source: str = "") -> "EditedShape":
        return cls(base, tuple((base.n_heads, base.n_kv_heads) for _ in range(base.n_layers)), source)


def _layer_view(shape: ModelShape, n_heads: int, n_kv_heads: int):
    """The fields accounts.py's attention formulas read, with this layer's counts (a ModelShape would refuse the
    uneven groups a prune leaves, e.g. 7 query heads over 3 K/V heads)."""
    return types.SimpleNamespace(**{**shape.as_dict(), "n_heads": n_heads, "n_kv_heads": n_kv_heads})


def _positions(shape: ModelShape, layer: int, seq: int) -> int:
    return min(seq, shape.sliding_window) if shape.sliding_window is not None and shape.is_local(layer) else seq


def layer_rows(edited: EditedShape, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16") -> list[dict]:
    """Per layer: heads, attention parameters, KV bytes per token, KV bytes for B x n, prefill FLOPs (causal
    attention over B x n tokens) and the attention FLOPs of one decode step at context n."""
    _, nbytes = parse_dtype(dtype)
    base, rows = edited.base, []
    for i, (nh, nkv) in enumerate(edited.heads):
        view = _layer_view(base, nh, nkv)
        local = base.sliding_window is not None and base.is_local(i)
        prefill = attention_flops(view, batch, seq, causal=True, local=local)["total"]
        step = attention_flops(view, batch, 1)
        positions = _positions(base, i, seq)
        decode = step["projections"] + step["output"] + 2 * 2 * batch * nh * base.head_dim * positions
        per_token = 2 * nkv * base.head_dim * nbytes
        rows.append({"layer": i, "n_heads": nh, "n_kv_heads": nkv, "attention_params": attention_params(view)["total"],
                     "kv_bytes_per_token": per_token, "kv_bytes": batch * positions * per_token,
                     "prefill_attention_flops": prefill, "decode_attention_flops": decode})
    return rows


def totals(edited: EditedShape, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16",
           weight_dtype: str | None = None) -> dict:
    """The whole model's accounts for serving B sequences at context n (see the module doc)."""
    base = edited.base
    rows = layer_rows(edited, batch=batch, seq=seq, dtype=dtype)
    counts = param_counts(base)
    params = counts["total"] - base.n_layers * counts["attention_per_layer"] + sum(r["attention_params"] for r in rows)
    # a dropped attention sublayer takes the norms that fed only it: half the block's (pre- or post-attention)
    params -= sum(1 for nh, _ in edited.heads if nh == 0) * (counts["norms_per_layer"] // 2)
    _, w_bytes = parse_dtype(weight_dtype or dtype)
    mlp = base.n_layers * mlp_flops(base, batch, seq)
    mlp_step = base.n_layers * mlp_flops(base, batch, 1)
    logits = 2 * batch * base.d_model * base.vocab_size if base.has_lm_head else 0
    kv = sum(r["kv_bytes"] for r in rows)
    return {
        "layers": rows, "params": params, "weight_bytes": params * w_bytes,
        "kv_bytes_per_token": sum(r["kv_bytes_per_token"] for r in rows), "kv_bytes": kv,
        "prefill_flops": sum(r["prefill_attention_flops"] for r in rows) + mlp + logits,
        "decode_flops": sum(r["decode_attention_flops"] for r in rows) + mlp_step + logits,
        "decode_bytes_read": params * w_bytes + kv,
        "batch": batch, "seq": seq, "dtype": dtype, "weight_dtype": weight_dtype or dtype,
        "convention": FLOP_CONVENTION + "; prefill: causal, logits of the last position only; decode: one step, "
                      "every weight and each sequence's KV cache read once",
    }


def predict(base: EditedShape, edit: EditedShape, *, batch: int, seq: int, kv_dtype: str,
            weight_dtype: str) -> dict:
    """The ratios the accounts predict for serving `edit` instead of `base` (edit / base for KV bytes,
    base / edit for speed)."""
    a = totals(base, batch=batch, seq=seq, dtype=kv_dtype, weight_dtype=weight_dtype)
    b = totals(edit, batch=batch, seq=seq, dtype=kv_dtype, weight_dtype=weight_dtype)
    return {"kv_ratio": b["kv_bytes"] / a["kv_bytes"],
            "prefill_speedup": a["prefill_flops"] / b["prefill_flops"],
            "decode_speedup": a["decode_bytes_read"] / b["decode_bytes_read"],
            "decode_flops_speedup": a["decode_flops"] / b["decode_flops"]}


def saving(edited: EditedShape, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16") -> dict:
    """An edited model's accounts beside the model it came from: per-layer rows, totals, and the saving."""
    mine = totals(edited, batch=batch, seq=seq, dtype=dtype)
    orig = totals(EditedShape.unedited(edited.base), batch=batch, seq=seq, dtype=dtype)

    def change(key: str) -> float:
        return mine[key] / orig[key] - 1.0 if orig[key] else 0.0

    return {"source": edited.source, "notes": list(edited.notes), "batch": batch, "seq": seq, "dtype": dtype,
            "edited": mine, "original": {k: v for k, v in orig.items() if k != "layers"},
            "change": {k: change(k) for k in ("params", "kv_bytes_per_token", "kv_bytes", "prefill_flops",
                                              "decode_flops", "decode_bytes_read")}}


def edited_fit(edited: EditedShape, budget_bytes: int, *, seq: int, dtype: str, kv_only: bool = False) -> dict:
    """A memory budget for weights + KV cache, or (kv_only) for the KV cache alone (the budget vLLM gives its
    cache: VLLM_CPU_KVCACHE_SPACE, or what gpu_memory_utilization leaves): the tokens it holds, the longest context
    of one sequence, the requests of `seq` tokens at once."""
    one = totals(edited, batch=1, seq=1, dtype=dtype)
    per_token = one["kv_bytes_per_token"]
    weights = 0 if kv_only else one["weight_bytes"]
    left = max(budget_bytes - weights, 0)
    tokens = left // per_token
    out = {"budget_bytes": budget_bytes, "weights_bytes": weights, "kv_budget_bytes": left,
           "kv_bytes_per_token": per_token, "kv_tokens": tokens, "max_context": tokens, "seq": seq,
           "max_batch": tokens // seq, "max_concurrency": tokens / seq, "kv_only": kv_only,
           "counts": ("the KV cache alone (the budget an engine gives its cache; weights and activations apart)"
                      if kv_only else "weights + KV cache only (no activations, no score matrices)")}
    if edited.base.sliding_window is not None:
        out["note"] = "sliding-window layers counted at every position (their cache stops at the window)"
    return out


# --------------------------------------------------------------------------------- reading a directory
def is_edited_dir(path: Path) -> bool:
    """A headcount save (headcount.json) or a Nemotron-NAS export (per-layer K/V heads in config.json)."""
    if (path / "headcount.json").is_file():
        return True
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "nemotron-nas"
    except (OSError, ValueError, AttributeError):
        return False


def read_edited(path: Path) -> EditedShape:
    """The EditedShape of a headcount save or a Nemotron-NAS export, from its JSON alone (no weights read)."""
    from headcount.cost.shape import shape_from_config_dict

    saved = path / "headcount.json"
    if saved.is_file():
        try:
            meta = json.loads(saved.read_text())
            cfg, layers = meta["config"], meta["layers"]
            heads = tuple((0, 0) if l.get("dropped") is True else (int(l["n_heads"]), int(l["n_kv_heads"]))
                          for l in layers)  # a dropped attention sublayer: no heads, no K/V cache
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CostError(f"{saved}: not a readable headcount save ({type(e).__name__}: {e})") from None
        if meta.get("kind") != "decoder":
            raise CostError(f"{saved}: a {meta.get('kind')} save; the serving accounts are for decoders")
        base = decoder_config_shape(cfg, name=str(meta.get("name") or path))
        notes = ("the original shape is the config headcount.json keeps (the model the edit came from)",)
        return EditedShape(base, heads, str(path), notes)
    cfg_path = path / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
        nh = int(cfg["num_attention_heads"])
        groups = [0 if b["attention"].get("no_op") else int(b["attention"]["n_heads_in_group"])
                  for b in cfg["block_configs"]]  # 0: an attention-free block
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CostError(f"{cfg_path}: not a readable Nemotron-NAS config ({type(e).__name__}: {e})") from None
    plain = {k: v for k, v in cfg.items() if k != "block_configs"}
    original = cfg.get("headcount_n_kv_heads")  # written by `headcount export --to vllm`
    plain.update(model_type=cfg.get("headcount_family", "llama"), num_key_value_heads=original or nh)
    base = shape_from_config_dict(plain, where=str(cfg_path))
    notes = () if original else ("a Nemotron-NAS export without headcount_n_kv_heads: the saving is against every "
                                 f"layer at {nh} K/V heads (MHA)",)
    return EditedShape(base, tuple((nh, nh // g) if g else (0, 0) for g in groups), str(path), notes)


def decoder_config_shape(cfg: dict, *, name: str = "model") -> ModelShape:
    """ModelShape of a headcount DecoderConfig's fields (a dict: DecoderConfig.to_dict(), or a save's "config")."""
    moe = cfg.get("moe")
    extra = {} if not moe else {
        "n_experts": moe["n_experts"], "experts_per_token": moe["top_k"], "d_expert": moe["d_expert"],
        "expert_bias": moe.get("expert_bias", False), "router_bias": moe.get("router_bias", False),
        "moe_layers": cfg["n_layers"] - len(moe.get("dense_layers", ()))}
    window = cfg.get("sliding_window")
    types_ = cfg.get("layer_types")
    causal = cfg.get("causal", True)
    return ModelShape(
        d_model=cfg["d_model"], n_heads=cfg["n_heads"], n_kv_heads=cfg.get("n_kv_heads"), head_dim=cfg.get("head_dim"),
        n_layers=cfg["n_layers"], d_ff=cfg["d_ff"], mlp="gated" if str(cfg.get("mlp", "")).startswith("gated") else "gelu",
        vocab_size=cfg["vocab_size"], tied_embeddings=bool(cfg.get("tie_embeddings", True)),
        position="learned" if cfg.get("position") == "learned" else "rotary", max_positions=cfg.get("max_position") or 0,
        attn_bias=bool(cfg.get("qkv_bias")), o_bias=bool(cfg.get("o_bias")), mlp_bias=bool(cfg.get("mlp_bias")),
        norm="rmsnorm" if str(cfg.get("norm", "rms")).startswith("rms") else "layernorm", final_norm=True,
        qk_norm=bool(cfg.get("qk_norm")), post_norms=bool(cfg.get("post_norms")),
        sliding_window=window if causal else None,
        layer_types=(tuple(types_) if types_ is not None else None) if causal and window is not None else None,
        arch="decoder" if causal else "encoder", name=name, attn_sinks=bool(cfg.get("attn_sinks")),
        qk_norm_full=bool(cfg.get("qk_norm_full")), **extra)
