"""qwen2 and gemma3 models written as llama.cpp GGUF files of their OWN architecture (`qwen2`, `gemma3`), and
what decides whether they can be: the inverse of formats/gguf.py's reading of those architectures.

What llama.cpp's graphs hold (node-llama-cpp 3.21.1's llama.cpp, src/models/qwen2.cpp and gemma3.cpp; each
claim below was also run: docs/models.md, "Checking against llama.cpp"):
  - both read `attention.head_count` / `head_count_kv` through get_key_or_arr, so the file may hold arrays,
    but both build every layer's tensors with layer 0's counts (hparams.n_head(), n_embd_k_gqa()), so a file
    with per-layer counts does not load (tensor shape mismatch). One count for every layer, then.
  - qwen2 builds attn_q and attn_output as embedding_length x embedding_length: the query heads must fill
    d_model (n_heads x head_dim == d_model), i.e. no query head pruned; K/V may be merged (one count for all
    layers). Biases on q/k/v are optional, attn_output has none. Anything else goes to `deci` (gguf_deci.py:
    the Llama graph with per-layer counts and q/k/v biases, which is Qwen2's math).
  - gemma3 builds attn_q as key_length x head_count (any uniform count of query heads), has no attention
    bias on the output (the post-attention norm follows it: an o_proj bias cannot be folded away), fixes the
    attention scale at key_length^-0.5 (d_model / head_count^-0.5 for the 62-layer 27B), and reads the
    local / global layers as a period P (`attention.sliding_window_pattern`: layer i is local when
    i % P < P - 1; 0 = all local). There is no other llama.cpp architecture with Gemma 3's graph, so a
    Gemma 3 pruned unevenly is written PADDED (gemma3_layout): every layer gets the largest layer's groups
    (KV heads) x the largest group's query heads, the missing ones written as exact zero heads (zero Q rows and
    zero o_proj columns; a zero KV head has zero K / V rows). A zero query head's q_norm(0) = 0, so its scores
    are 0, its softmax uniform, and its context (a mean of V) meets zero o_proj columns: it adds exactly 0.
    The logits are the pruned model's; llama.cpp computes the zero heads all the same, so it saves no
    compute or KV cache for them (export says so; `--uniform` pruning needs no padding).

The file (no permutation of q/k rows: llama.cpp runs NEOX rotary on these, headcount's own layout):
  qwen2: block_count, context_length, embedding_length, feed_forward_length, attention.head_count and
    head_count_kv (one number each), rope.freq_base, attention.layer_norm_rms_epsilon; tensors token_embd,
    output_norm, output (untied), blk.N.attn_norm / attn_q / attn_k / attn_v (+ .bias) / attn_output /
    ffn_norm / ffn_gate / ffn_up / ffn_down.
  gemma3: the same keys plus attention.key_length / value_length (head_dim is decoupled from d_model),
    rope.freq_base (global layers) and rope.freq_base_swa (local), attention.sliding_window and
    sliding_window_pattern (the period), rope.scaling.type / factor (linear, global layers) when set;
    tensors add blk.N.attn_q_norm / attn_k_norm / post_attention_norm / post_ffw_norm. Every RMSNorm weight
    is written as headcount holds it, which is llama.cpp's 1 + w (formats/gguf.py's reader adds the 1).
"""

from __future__ import annotations

import math

import numpy as np

from headcount.models.formats.gguf_write import finish, group_layout, mlp_tensors, numpy32, output_tensors, rows

ARCHITECTURES = ("qwen2", "gemma3")
_ALTERNATIVES = ("prune with the same number of query heads in every layer (`headcount prune --uniform`, or "
                 "prune_to(..., uniform=True)), or keep it in headcount's own format (`headcount.surgery.save`); "
                 "a transformers export cannot carry per-layer head counts either")


def _layers(model) -> list[tuple[int, int]]:
    """(query heads, KV heads as written) per layer."""
    return [(layer.attn.n_heads, len(group_layout(layer.attn.kv_head_of)[1])) for layer in model.layers]


def gemma3_layout(model) -> list[list[tuple[int | None, list[int | None]]]]:
    """Per layer, the written KV slots in order: (current KV head, or None for a zero KV head; its query heads
    in order, current indices, None for a zero query head). Every layer gets the same number of slots (the
    most KV heads any layer's queries read) and every slot the same number of queries (the largest group),
    so llama.cpp's one head_count / head_count_kv holds every layer. A uniform model is written unpadded."""
    readers = []
    for layer in model.layers:
        r: dict[int, list[int]] = {}
        for i, k in enumerate(layer.attn.kv_head_of):
            r.setdefault(int(k), []).append(i)
        readers.append(r)
    n_slots = max(len(r) for r in readers)
    size = max(len(q) for r in readers for q in r.values())
    out = []
    for r in readers:
        slots = [(k, r[k] + [None] * (size - len(r[k]))) for k in sorted(r)]
        out.append(slots + [(None, [None] * size)] * (n_slots - len(slots)))
    return out


def gemma3_zero_heads(model) -> tuple[int, int]:
    """(zero query heads, zero KV heads) the gemma3 file pads with (gemma3_layout)."""
    lay = gemma3_layout(model)
    zq = sum(q is None for slots in lay for _, qs in slots for q in qs)
    zkv = sum(k is None for slots in lay for k, _ in slots)
    return zq, zkv


def _has(t) -> bool:
    return t is not None and bool(t.detach().abs().max() > 0)


def qwen2_misfit(model) -> str | None:
    """None when llama.cpp's qwen2 graph holds this qwen2 model as it is; else why not (then it is `deci`)."""
    cfg = model.config
    d, hd = cfg.d_model, cfg.head_dim
    layers = _layers(model)
    for i, (nh, _) in enumerate(layers):
        if nh * hd != d:
            return (f"layer {i} keeps {nh} query heads x {hd} = {nh * hd} != d_model {d}, and llama.cpp's qwen2 "
                    "builds attn_q / attn_output as d_model x d_model")
    kv = [k for _, k in layers]
    if len(set(kv)) > 1:
        return (f"KV heads differ per layer ({kv}), and llama.cpp's qwen2 builds every layer with layer 0's "
                "head_count_kv")
    bias = next((i for i, layer in enumerate(model.layers) if _has(layer.attn.o_proj.bias)), None)
    if bias is not None:
        return f"layer {bias}'s o_proj has a bias (compensation), and llama.cpp's qwen2 has no attn_output.bias"
    return None


def gemma3_scale(cfg, n_heads: int) -> float:
    """The attention scale llama.cpp's gemma3 uses (it reads no key for it)."""
    return 1.0 / math.sqrt(cfg.d_model / n_heads if cfg.n_layers == 62 else cfg.head_dim)


def swa_period(local: list[bool]) -> int | None:
    """llama.cpp's sliding_window_pattern for these local (True) / global layers: P with layer i local iff
    i % P < P - 1 (0: every layer local); None when no period gives this pattern."""
    n = len(local)
    if all(local):
        return 0
    for p in range(1, n + 1):
        if all(local[i] == (i % p < p - 1) for i in range(n)):
            return p
    return None


def check_gemma3(model) -> None:
    """Refuse (one line) a gemma3 model llama.cpp's gemma3 graph cannot run exactly."""
    from headcount.models.decoder import SLIDING

    cfg = model.config
    lay = gemma3_layout(model)  # uneven layers are padded with zero heads to one count
    if not cfg.causal:
        raise ValueError("model: a bidirectional Gemma 3 (embedding model) is not llama.cpp's causal gemma3")
    want = dict(norm="rms_float", mlp="gated_gelu_tanh", position="rotary", qk_norm=True, post_norms=True,
                mlp_bias=False)
    for key, value in want.items():
        if getattr(cfg, key) != value:
            raise ValueError(f"model: gemma3 with {key}={getattr(cfg, key)!r}; llama.cpp's gemma3 has {value!r}")
    if cfg.embed_scale is None or not math.isclose(cfg.embed_scale, math.sqrt(cfg.d_model), rel_tol=1e-6):
        raise ValueError(f"model: embed_scale {cfg.embed_scale}; llama.cpp's gemma3 scales embeddings by "
                         f"sqrt(d_model) = {math.sqrt(cfg.d_model):.6g}")
    scale = gemma3_scale(cfg, sum(len(qs) for _, qs in lay[0]))
    local = [cfg.layer_type(i) == SLIDING for i in range(cfg.n_layers)]
    if any(local) and swa_period(local) is None:
        raise ValueError(f"model: sliding-window layers {[i for i, x in enumerate(local) if x]} are not periodic; "
                         "llama.cpp's gemma3 reads one period P (layer i local when i % P < P - 1)")
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if not math.isclose(attn.softmax_scale, scale, rel_tol=1e-6):
            raise ValueError(f"model: layer {i} has softmax_scale {attn.softmax_scale:.6g}; llama.cpp's gemma3 uses "
                             f"{scale:.6g} (key_length^-0.5) whatever query_pre_attn_scalar says")
        if attn.head_dim != cfg.head_dim:
            raise ValueError(f"model: layer {i} has head_dim {attn.head_dim}, the config {cfg.head_dim}")
        for name, norm in (("q_norm", attn.q_norm), ("k_norm", attn.k_norm)):
            if norm is None or not math.isclose(norm.eps, cfg.norm_eps, rel_tol=1e-6):
                raise ValueError(f"model: layer {i}'s {name} eps {getattr(norm, 'eps', None)} != norm_eps "
                                 f"{cfg.norm_eps}; llama.cpp's gemma3 uses one RMS epsilon")
        if attn.sliding_window != (cfg.sliding_window if local[i] else None):
            raise ValueError(f"model: layer {i} has sliding_window {attn.sliding_window}, its config type says "
                             f"{cfg.sliding_window if local[i] else None}")
        if _has(attn.o_proj.bias):
            raise ValueError(f"model: layer {i}'s o_proj has a bias (what mean compensation, or lstsq with "
                             "bias=True, adds); llama.cpp's gemma3 has no attn_output.bias and the post-attention "
                             "norm follows it, so it cannot be folded away: prune with the default lstsq refit "
                             "(no bias on Gemma 3) or compensate='none' to export a Gemma 3")
        if _has(attn.qkv_proj.bias):
            raise ValueError(f"model: layer {i} has q/k/v biases; headcount writes gemma3 without them")


# ------------------------------------------------------------------------------------------ write
def _attention(out: dict, b: str, attn, dh: int) -> tuple[int, int]:
    """attn_q / attn_k / attn_v (+ biases) / attn_output of one layer, queries in llama.cpp's group order."""
    nh, nkv = attn.n_heads, attn.n_kv_heads
    order, slots = group_layout(attn.kv_head_of)
    q_rows = rows(order, dh)
    k_rows, v_rows = rows(slots, dh, nh * dh), rows(slots, dh, (nh + nkv) * dh)
    w = attn.qkv_proj.weight
    out[b + "attn_q.weight"] = numpy32(w[q_rows])
    out[b + "attn_k.weight"] = numpy32(w[k_rows])
    out[b + "attn_v.weight"] = numpy32(w[v_rows])
    out[b + "attn_output.weight"] = numpy32(attn.o_proj.weight[:, q_rows])
    return nh, len(slots)


def _attention_padded(out: dict, b: str, attn, dh: int, slots) -> tuple[int, int]:
    """gemma3: attn_q / attn_k / attn_v / attn_output of one layer in gemma3_layout's slots, zero heads as
    zero rows (Q, K, V) and zero columns (o_proj)."""
    nh, nkv = attn.n_heads, attn.n_kv_heads
    w = numpy32(attn.qkv_proj.weight)
    o = numpy32(attn.o_proj.weight)
    d = w.shape[1]
    zeros_in, zeros_out = np.zeros((dh, d), np.float32), np.zeros((o.shape[0], dh), np.float32)
    q, k, v, out_cols = [], [], [], []
    for kv, queries in slots:
        k.append(w[nh * dh + kv * dh:nh * dh + (kv + 1) * dh] if kv is not None else zeros_in)
        v.append(w[(nh + nkv) * dh + kv * dh:(nh + nkv) * dh + (kv + 1) * dh] if kv is not None else zeros_in)
        for h in queries:
            q.append(w[h * dh:(h + 1) * dh] if h is not None else zeros_in)
            out_cols.append(o[:, h * dh:(h + 1) * dh] if h is not None else zeros_out)
    out[b + "attn_q.weight"] = np.concatenate(q)
    out[b + "attn_k.weight"] = np.concatenate(k)
    out[b + "attn_v.weight"] = np.concatenate(v)
    out[b + "attn_output.weight"] = np.concatenate(out_cols, axis=1)
    return len(q), len(slots)


def own_file(model, arch: str, dtype: str, pad: bool = True) -> tuple[list[tuple], dict[str, np.ndarray]]:
    """(metadata, tensors) of `model` as llama.cpp's `arch` (qwen2 | gemma3); the model already checked.
    pad=False: gemma3 without the zero heads (tools/llamacpp_archs.py's probe of per-layer arrays)."""
    from headcount.models.decoder import SLIDING

    cfg = model.config
    d, dh, ff = cfg.d_model, cfg.head_dim, cfg.d_ff
    out: dict[str, np.ndarray] = {"token_embd.weight": numpy32(model.embed.weight)}
    counts = []
    padded = gemma3_layout(model) if arch == "gemma3" and pad else None
    for i, layer in enumerate(model.layers):
        attn, b = layer.attn, f"blk.{i}."
        out[b + "attn_norm.weight"] = numpy32(layer.attn_norm.weight)
        counts.append(_attention_padded(out, b, attn, dh, padded[i]) if padded else _attention(out, b, attn, dh))
        if arch == "qwen2":  # headcount's qwen2 reader (and transformers) expect the three biases
            order, slots = group_layout(attn.kv_head_of)
            nh, nkv = attn.n_heads, attn.n_kv_heads
            bias = attn.qkv_proj.bias
            for name, sel in (("q", rows(order, dh)), ("k", rows(slots, dh, nh * dh)),
                              ("v", rows(slots, dh, (nh + nkv) * dh))):
                out[b + f"attn_{name}.bias"] = (numpy32(bias[sel]) if bias is not None
                                                else np.zeros(len(sel), np.float32))
        else:
            out[b + "attn_q_norm.weight"] = numpy32(attn.q_norm.weight)
            out[b + "attn_k_norm.weight"] = numpy32(attn.k_norm.weight)
            out[b + "post_attention_norm.weight"] = numpy32(layer.post_attn_norm.weight)
            out[b + "post_ffw_norm.weight"] = numpy32(layer.post_mlp_norm.weight)
        mlp_tensors(out, b, layer, ff)
    output_tensors(out, model)

    p = f"{arch}."
    nh, nkv = counts[0]
    meta: list[tuple] = [
        (p + "vocab_size", cfg.vocab_size), (p + "context_length", cfg.max_position),
        (p + "embedding_length", d), (p + "block_count", cfg.n_layers), (p + "feed_forward_length", ff),
        (p + "attention.head_count", nh), (p + "attention.head_count_kv", nkv),
        (p + "rope.freq_base", float(cfg.rope_theta)),
        (p + "attention.layer_norm_rms_epsilon", float(cfg.norm_eps)),
    ]
    if arch == "gemma3":
        meta += [(p + "attention.key_length", dh), (p + "attention.value_length", dh)]
        local = [cfg.layer_type(i) == SLIDING for i in range(cfg.n_layers)]
        if any(local):
            meta += [(p + "attention.sliding_window", int(cfg.sliding_window)),
                     (p + "attention.sliding_window_pattern", swa_period(local)),
                     (p + "rope.freq_base_swa", float(cfg.rope_local_theta or cfg.rope_theta))]
        if cfg.rope_scaling != 1.0:
            meta += [(p + "rope.scaling.type", "linear"), (p + "rope.scaling.factor", float(cfg.rope_scaling))]
    elif cfg.rope_scaling != 1.0:
        raise ValueError(f"model: rope_scaling {cfg.rope_scaling}; headcount reads qwen2 GGUFs without rotary scaling")
    return meta, finish(out, dtype)


def window_layers(model) -> list[bool]:
    """Per layer: does its KV cache stop at a sliding window (in headcount and in llama.cpp's gemma3)?"""
    from headcount.models.decoder import SLIDING

    cfg = model.config
    return [cfg.family == "gemma3" and cfg.layer_type(i) == SLIDING for i in range(cfg.n_layers)]
