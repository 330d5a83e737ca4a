"""transformers' expert tensors <-> headcount's MoEFeedForward (moe.py): read, and written back.

headcount keeps gate_up_proj [E, 2 f, d] (rows [gate | up]) and down_proj [E, d, f]. transformers 5 keeps:

    mixtral, qwen3_moe, olmoe   mlp.gate.weight [E, d]; mlp.experts.gate_up_proj [E, 2 f, d] ([gate | up]);
                                mlp.experts.down_proj [E, d, f]: headcount's layout, copied
    gpt_oss                     mlp.router.weight [E, d], .bias [E]; mlp.experts.gate_up_proj [E, d, 2 f]
                                (TRANSPOSED, gate and up INTERLEAVED: columns g0 u0 g1 u1 ...), its bias
                                [E, 2 f] interleaved alike; down_proj [E, f, d] (transposed), its bias [E, d]

Checkpoints on the hub (and save_pretrained's reverse conversion) keep one tensor per expert:
mixtral block_sparse_moe.gate.weight, block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down);
qwen3_moe / olmoe mlp.experts.{e}.gate_proj / up_proj / down_proj. Both layouts are read; the fused one
is written (what transformers 5 builds, loadable with no conversion). GPT-OSS's released MXFP4 tensors
(*_blocks / *_scales) are refused by name: headcount reads float checkpoints.
"""

from __future__ import annotations

import re
from typing import Iterator

import torch

from headcount.models.formats.errors import CheckpointError

Tensor = torch.Tensor

# family -> the config field that counts the experts (what an error names)
EXPERT_FIELD = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts", "olmoe": "num_experts",
                "gpt_oss": "num_local_experts"}
# family -> (module, router, per-expert (gate, up, down) names) of the per-expert layout
_LEGACY = {"mixtral": ("block_sparse_moe", "gate", ("w1", "w3", "w2")),
           "qwen3_moe": ("mlp", "gate", ("gate_proj", "up_proj", "down_proj")),
           "olmoe": ("mlp", "gate", ("gate_proj", "up_proj", "down_proj"))}


def _experts_present(t, layer: int, module: str) -> int:
    """How many experts layer `layer` holds in the per-expert layout (the highest index + 1; 0 if none)."""
    pattern = re.compile(rf"(?:^|\.)layers\.{layer}\.{module}\.experts\.(\d+)\.")
    found = [int(m.group(1)) for name in t.tensors for m in [pattern.search(name)] if m]
    return max(found) + 1 if found else 0


def read_layer(cfg, t, i: int) -> Iterator[tuple[str, Tensor]]:
    """(headcount name, tensor) pairs of layer i's MoEFeedForward from the _Tensors `t` (formats/hf.py)."""
    moe, family, d = cfg.moe, cfg.family, cfg.d_model
    e, f = moe.n_experts, moe.d_expert
    field = EXPERT_FIELD.get(family, "num_experts")
    h, o = f"layers.{i}.", f"layers.{i}.mlp."
    count = f"{field}={e} experts, d_expert={f}, hidden_size={d}"
    if family == "gpt_oss":
        if t.has(h + "mlp.experts.gate_up_proj_blocks"):
            raise CheckpointError(f"{t.source}: tensor {h}mlp.experts.gate_up_proj_blocks: MXFP4-quantised experts "
                                  "are not supported (headcount reads float checkpoints: dequantise to bf16 first)")
        yield o + "router.weight", t.get(h + "mlp.router.weight", (e, d), f"{field}={e} x hidden_size")
        yield o + "router.bias", t.get(h + "mlp.router.bias", (e,), f"{field}={e}")
        gu = t.get(h + "mlp.experts.gate_up_proj", (e, d, 2 * f), count)
        gub = t.get(h + "mlp.experts.gate_up_proj_bias", (e, 2 * f), count)
        # columns interleaved g0 u0 g1 u1 ...: gate = ::2, up = 1::2; transposed to [E, out, in]
        yield o + "gate_up_proj", torch.cat([gu[..., ::2], gu[..., 1::2]], dim=-1).transpose(1, 2).contiguous()
        yield o + "gate_up_bias", torch.cat([gub[..., ::2], gub[..., 1::2]], dim=-1)
        yield o + "down_proj", t.get(h + "mlp.experts.down_proj", (e, f, d), count).transpose(1, 2).contiguous()
        yield o + "down_bias", t.get(h + "mlp.experts.down_proj_bias", (e, d), count)
        return
    if t.has(h + "mlp.experts.gate_up_proj"):  # transformers 5's fused layout: headcount's own
        yield o + "router.weight", t.get(h + "mlp.gate.weight", (e, d), f"{field}={e} x hidden_size")
        yield o + "gate_up_proj", t.get(h + "mlp.experts.gate_up_proj", (e, 2 * f, d), count)
        yield o + "down_proj", t.get(h + "mlp.experts.down_proj", (e, d, f), count)
        return
    module, router, (g, u, dn) = _LEGACY[family]
    present = _experts_present(t, i, module)
    if present != e:
        raise CheckpointError(f"{t.source}: layer {i} holds {present} experts ({h}{module}.experts.N.*), the config "
                              f"says {field}={e}")
    yield o + "router.weight", t.get(f"{h}{module}.{router}.weight", (e, d), f"{field}={e} x hidden_size")
    p = f"{h}{module}.experts."
    yield o + "gate_up_proj", torch.stack([torch.cat([t.get(f"{p}{j}.{g}.weight", (f, d), count),
                                                      t.get(f"{p}{j}.{u}.weight", (f, d), count)]) for j in range(e)])
    yield o + "down_proj", torch.stack([t.get(f"{p}{j}.{dn}.weight", (d, f), count) for j in range(e)])


def write_layer(mlp, family: str, prefix: str) -> dict[str, Tensor]:
    """Layer's MoEFeedForward -> transformers 5's tensors under `prefix` (e.g. "model.layers.3.")."""
    p = prefix + "mlp."
    gu, down = mlp.gate_up_proj.detach(), mlp.down_proj.detach()
    if family != "gpt_oss":
        return {p + "gate.weight": mlp.router.weight.detach(), p + "experts.gate_up_proj": gu,
                p + "experts.down_proj": down}
    f = mlp.d_expert

    def interleave(x: Tensor) -> Tensor:  # [..., 2 f] as [gate | up] -> g0 u0 g1 u1 ...
        return torch.stack([x[..., :f], x[..., f:]], dim=-1).flatten(-2)

    return {p + "router.weight": mlp.router.weight.detach(), p + "router.bias": mlp.router.bias.detach(),
            p + "experts.gate_up_proj": interleave(gu.transpose(1, 2)).contiguous(),
            p + "experts.gate_up_proj_bias": interleave(mlp.gate_up_bias.detach()),
            p + "experts.down_proj": down.transpose(1, 2).contiguous(),
            p + "experts.down_proj_bias": mlp.down_bias.detach()}


def config_fields(cfg) -> dict:
    """The MoE fields of a transformers config.json for this DecoderConfig (family mixtral / qwen3_moe /
    olmoe / gpt_oss)."""
    moe, family = cfg.moe, cfg.family
    out = {EXPERT_FIELD[family]: moe.n_experts, "num_experts_per_tok": moe.top_k}
    if family == "qwen3_moe":
        out.update(moe_intermediate_size=moe.d_expert, norm_topk_prob=moe.normalize, decoder_sparse_step=1,
                   mlp_only_layers=list(moe.dense_layers))
    elif family == "olmoe":
        out["norm_topk_prob"] = moe.normalize
    elif family == "gpt_oss":
        out.update(swiglu_alpha=moe.swiglu_alpha, swiglu_limit=moe.swiglu_limit)
    if family != "qwen3_moe" and moe.dense_layers:
        raise ValueError(f"model: dense layers {list(moe.dense_layers)} among the experts; transformers' {family} "
                         "has experts in every layer")
    if family in ("mixtral", "qwen3_moe", "olmoe"):
        out["intermediate_size"] = cfg.d_ff if family == "qwen3_moe" else moe.d_expert
    else:
        out["intermediate_size"] = moe.d_expert
    return out
