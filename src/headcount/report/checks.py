"""The chapter's arithmetic and formula claims, measured on the report's model in the report's run.

    chapter_checks(model, sentence) -> {"c2", "c3_geometry", "c4", "c5", "c6", "c10", "c14"}   (JSON-ready)

Each part holds the measured number next to the formula's, so claims.py can decide without a model:
  c2   the fused path (one qkv projection, view, transpose, reshape, o_proj) of this model's FIRST layer
       against headcount.reference's per-head formula (n_heads separate matrices and an explicit Concat),
       in float64 on the layer's real input for `sentence` (rotary is a hook the chapter's formula does not
       have, so both run without it; the layer's q/k norms, per head or over the whole projection, its
       sliding window, its logit soft-cap and its per-head sink logits are read from the attention module
       and written out in the reference); plus whether `view` moved data and whether the transposed Q is a view
  c3_geometry  where this model's heads write in the residual stream (experiments.write_address.layer_geometry
       on a few layers spread over the depth)
  c4   attention parameters: sum(numel) of this model's layer 0 vs the formula, and MHA at d_model fixed for
       several head counts (built and counted) vs 4 d^2
  c5   Q K^T + A V FLOPs counted by FlopCounterMode on the eager path vs 4 n^2 d, at several head counts
  c6   score memory: the chapter's 0.25 / 1 / 4 GiB (formula), and the eager path's measured peak at two
       head counts in their own processes (headcount.cost.measure.peak_memory)
  c10  the presets' head counts (GPT-3 Small, GPT-3 175B, Llama 3 8B) and a decoupled head_dim
  c14  KV cache bytes per token: KVCache.nbytes of this model's layers vs 2 x n_kv x head_dim x layers x bytes
"""

from __future__ import annotations

import copy

C4_HEADS = (1, 2, 4, 8, 16, 32, 64)  # MHA head counts tried at the model's d_model (those that divide it)
C5_VARIANTS = 3  # of those, how many FlopCounterMode counts (plus the model's own shape)
GEOMETRY_LAYERS = 4  # layers (spread over the depth) whose write geometry C3 averages
FLOP_SEQ = 64  # n for the FLOP count (the count is exact at any n; small keeps it instant)
# chapter 2.3.3's example: d = 4096, n = 4096, fp16, batch 1: 0.25 / 1 / 4 GiB of scores per layer
CHAPTER_D, CHAPTER_N, CHAPTER_HEADS, CHAPTER_GIB = 4096, 4096, (8, 32, 128), (0.25, 1.0, 4.0)
MEMORY_HEADS, MEMORY_SEQ, MEMORY_HEAD_DIM = (2, 8), 1024, 8  # the measured eager peaks (own processes)
# chapter 2.3.5: GPT-3 Small 768/64 = 12 heads, GPT-3 175B 12288/128 = 96, Llama 3 8B 4096/128 = 32
CHAPTER_PRESETS = (("gpt3-small", 12), ("gpt3-175b", 96), ("llama-3-8b", 32))
DECOUPLED_PRESET = "gemma-3-270m"


def _divisor_heads(d_model: int, own: int) -> list[int]:
    return sorted({h for h in (*C4_HEADS, own) if d_model % h == 0 and d_model // h >= 1})[:6]


def first_layer_input(model, sentence: str):
    """Layer 0's attention input for `sentence` ([1, T, d_model]), read with a forward pre-hook on the public
    model.layers[0].attn, and whether that layer attends causally."""
    import torch

    from headcount.analysis.batches import is_decoder

    ids = model.tokenizer.encode(sentence)
    ids = ids[: min(len(ids), 64)]
    seen = {}

    def grab(module, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["x"]).detach().clone()
        seen["causal"] = bool(kwargs.get("is_causal", False))
        raise _Stop

    handle = model.layers[0].attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device))
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen["x"], seen.get("causal", is_decoder(model))


class _Stop(Exception):
    """Ends the forward once layer 0's input is read."""


def c2_reference(model, sentence: str) -> dict:
    import torch

    from headcount.reference import multi_head, per_head

    x, causal = first_layer_input(model, sentence)
    attn = copy.deepcopy(model.layers[0].attn).double().eval()
    x = x.double()
    with torch.no_grad():
        fused = attn(x, is_causal=causal).output
        ref, _ = multi_head(x, per_head(attn), is_causal=causal, scale=getattr(attn, "softmax_scale", None),
                            sliding_window=getattr(attn, "sliding_window", None),
                            softcap=getattr(attn, "logit_softcap", None))
        # the fused path's reshapes, on the same input: view moves no data, the transposed Q is not contiguous
        nh, nkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
        proj = attn.qkv_proj(x)
        split = proj.view(x.shape[0], x.shape[1], nh + 2 * nkv, dh)
        q = split[:, :, :nh].transpose(1, 2)
    diff = float((fused - ref).abs().max())
    scale = float(ref.abs().max())
    return {"layer": 0, "tokens": int(x.shape[1]), "causal": causal, "dtype": "float64",
            "n_heads": nh, "n_kv_heads": nkv, "head_dim": dh, "max_abs_diff": diff, "max_abs_output": scale,
            "relative_diff": diff / scale if scale else diff,
            "view_moves_no_data": split.data_ptr() == proj.data_ptr(), "transposed_q_contiguous": q.is_contiguous(),
            "rotary": "left out, a hook the chapter's formula does not have"}


def c4_params(model, shape) -> dict:
    from headcount import MultiHeadAttention
    from headcount.cost import ModelShape, attention_params

    attn = model.layers[0].attn
    measured = sum(p.numel() for p in attn.parameters())
    formula = attention_params(shape.replace(n_layers=1))["total"]
    d = shape.d_model
    mha = []
    for h in _divisor_heads(d, shape.n_heads):
        built = MultiHeadAttention(d, h, bias=False)
        mha.append({"n_heads": h, "head_dim": d // h, "measured": sum(p.numel() for p in built.parameters()),
                    "formula": attention_params(ModelShape(d_model=d, n_heads=h))["total"]})
        del built
    return {"d_model": d, "four_d2": 4 * d * d, "model": {"measured": measured, "formula": formula,
                                                         "n_heads": attn.n_heads, "n_kv_heads": attn.n_kv_heads,
                                                         "head_dim": attn.head_dim},
            "mha": mha}


def c5_flops(shape, seq: int = FLOP_SEQ) -> dict:
    from headcount.cost import ModelShape, attention_flops
    from headcount.cost.measure import count_flops

    d = shape.d_model
    rows = []
    heads = _divisor_heads(d, shape.n_heads)
    heads = sorted({heads[0], shape.n_heads if shape.n_heads in heads else heads[-1], heads[-1]})[:C5_VARIANTS]
    variants = [(f"MHA, {h} heads", ModelShape(d_model=d, n_heads=h)) for h in heads]
    variants.append(("this model", shape.replace(n_layers=1)))
    for label, s in variants:
        measured = count_flops(s, 1, seq)["scores_and_read"]
        f = attention_flops(s, 1, seq)
        fc = attention_flops(s, 1, seq, causal=True)
        rows.append({"label": label, "n_heads": s.n_heads, "head_dim": s.head_dim, "measured": measured,
                     "formula": f["scores"] + f["read"], "formula_causal": fc["scores"] + fc["read"]})
    return {"seq": seq, "d_model": d, "four_n2_d": 4 * seq * seq * d, "two_n2_d": 2 * seq * seq * d, "rows": rows,
            "counter": "torch.utils.flop_counter.FlopCounterMode, eager path (need_weights=True); it never halves "
                       "a causal run, so the causal figure is the formula's"}


def c6_memory(measure: bool = True) -> dict:
    from headcount.cost import ModelShape, score_memory
    from headcount.cost.measure import MEMORY_TOLERANCE, peak_memory

    chapter = []
    for h, gib in zip(CHAPTER_HEADS, CHAPTER_GIB):
        b = score_memory(ModelShape(d_model=CHAPTER_D, n_heads=h), 1, CHAPTER_N, 2)["eager_per_layer"]
        chapter.append({"n_heads": h, "bytes": b, "gib": b / 1024**3, "chapter_gib": gib})
    measured = []
    if measure:
        for h in MEMORY_HEADS:
            s = ModelShape(d_model=MEMORY_HEAD_DIM * h, n_heads=h, head_dim=MEMORY_HEAD_DIM)
            formula = score_memory(s, 1, MEMORY_SEQ, 4)["eager_peak_per_layer"]
            got = peak_memory(h, MEMORY_SEQ, head_dim=MEMORY_HEAD_DIM, eager=True)
            measured.append({"n_heads": h, "seq": MEMORY_SEQ, "head_dim": MEMORY_HEAD_DIM,
                             "peak_bytes": got["peak_bytes"], "formula": formula, "method": got["method"]})
    return {"d_model": CHAPTER_D, "seq": CHAPTER_N, "dtype": "fp16", "chapter": chapter, "measured": measured,
            "tolerance": MEMORY_TOLERANCE}


def c10_shapes(shape) -> dict:
    from headcount.cost import get_preset

    presets = []
    for key, chapter in CHAPTER_PRESETS:
        s = get_preset(key).shape
        presets.append({"preset": key, "d_model": s.d_model, "n_heads": s.n_heads, "head_dim": s.head_dim,
                        "n_kv_heads": s.n_kv_heads, "chapter_n_heads": chapter})
    s = get_preset(DECOUPLED_PRESET).shape
    return {"presets": presets,
            "decoupled": {"preset": DECOUPLED_PRESET, "d_model": s.d_model, "n_heads": s.n_heads,
                          "head_dim": s.head_dim},
            "model": {"d_model": shape.d_model, "n_heads": shape.n_heads, "n_kv_heads": shape.n_kv_heads,
                      "head_dim": shape.head_dim}}


def c14_kv(model, shape) -> dict:
    import torch

    from headcount.cost import kv_cache

    measured = sum(layer.attn.new_cache(1, 1, torch.bfloat16).nbytes for layer in model.layers)
    formula = kv_cache(shape, 1, 1, 2)["bytes_per_token"]
    n_layers = len(model.layers)
    attn = model.layers[0].attn
    return {"dtype": "bf16", "bytes": 2, "measured": int(measured), "formula": int(formula), "n_layers": n_layers,
            "n_kv_heads": attn.n_kv_heads, "head_dim": attn.head_dim,
            "by_hand": 2 * attn.n_kv_heads * attn.head_dim * n_layers * 2,
            "uniform": all(layer.attn.n_kv_heads == attn.n_kv_heads and layer.attn.head_dim == attn.head_dim
                           for layer in model.layers)}


def write_geometry(model, n_layers: int = GEOMETRY_LAYERS) -> dict | None:
    """Where this model's heads write (C3): experiments.write_address.layer_geometry on `n_layers` layers spread
    over the depth (first and last included), averaged; None when o_proj is not square in heads
    (n_heads x head_dim != d_model)."""
    attn = model.layers[0].attn
    if attn.n_heads * attn.head_dim != attn.d_model:
        return None
    from headcount.experiments.write_address import layer_geometry, random_overlap

    total = len(model.layers)
    chosen = sorted({round(i * (total - 1) / max(1, n_layers - 1)) for i in range(min(n_layers, total))})
    per = [layer_geometry(model.layers[i].attn.o_proj.weight, model.layers[i].attn.n_heads) for i in chosen]
    keys = ("mean_pairwise_angle_deg", "min_pairwise_angle_deg", "mean_overlap", "own_slice_energy", "reach")
    out = {k: sum(g[k] for g in per) / len(per) for k in keys}
    return {**out, "layers": chosen, "n_layers": total, "d_model": attn.d_model, "n_heads": attn.n_heads,
            "head_dim": attn.head_dim, "slice_share": attn.head_dim / attn.d_model,
            "random_overlap": random_overlap(attn.d_model, attn.head_dim)}


def chapter_checks(model, sentence: str, *, measure_memory: bool = True) -> dict:
    """Every part of the module docstring, for `model`."""
    from headcount.report.accounts import shape_of

    shape = shape_of(model)
    return {"c2": c2_reference(model, sentence), "c3_geometry": write_geometry(model), "c4": c4_params(model, shape),
            "c5": c5_flops(shape), "c6": c6_memory(measure_memory), "c10": c10_shapes(shape),
            "c14": c14_kv(model, shape)}
