"""The mixture-of-experts feed-forward: a router picks top_k of n_experts gated MLPs per token, and each
expert runs only on the tokens routed to it (index_select in, an indexed accumulate out; never all
experts on all tokens). One module with the few switches the four families need (transformers 5.24's code):

    Mixtral     softmax over all experts (float32), top-k, renormalised to sum 1      router "softmax_topk"
    Qwen3-MoE   the same; renormalised only with norm_topk_prob                      normalize=
    OLMoE       the same; norm_topk_prob false by default (not renormalised)         normalize=
    GPT-OSS     top-k of the router's logits (router bias), softmax over those k     router "topk_softmax"
                experts with biases and the clamped SwiGLU:                           act "swiglu_clamped"
                (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=l)

Weights (headcount's layout, whatever the checkpoint's): gate_up_proj [n_experts, 2 d_expert, d_model]
with rows [gate | up] per expert (as decoder.GatedMLP's), down_proj [n_experts, d_model, d_expert];
gate_up_bias [n_experts, 2 d_expert] and down_bias [n_experts, d_model] with expert biases; router a
Linear(d_model, n_experts). formats/hf.py splits transformers' fused (and GPT-OSS's interleaved,
transposed) tensors into this layout and writes them back.

Cost: a token's feed-forward reads top_k experts, so active parameters per token are
top_k x (3 d_model d_expert) + the router, not n_experts x that (cost/accounts.py counts both).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from headcount.arguments import one_of, positive_int

Tensor = torch.Tensor

ROUTERS = ("softmax_topk", "topk_softmax")
ACTS = ("silu", "swiglu_clamped")


@dataclass
class MoEConfig:
    """What the MoE feed-forward's shape and arithmetic depend on (DecoderConfig.moe)."""

    n_experts: int
    top_k: int
    d_expert: int  # each expert's hidden width (transformers' moe_intermediate_size / intermediate_size)
    router: str = "softmax_topk"  # "softmax_topk" (Mixtral, Qwen3-MoE, OLMoE) | "topk_softmax" (GPT-OSS)
    normalize: bool = True  # softmax_topk: renormalise the k probabilities to sum 1
    act: str = "silu"  # "silu" (SwiGLU) | "swiglu_clamped" (GPT-OSS)
    expert_bias: bool = False
    router_bias: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP of d_ff instead (Qwen3-MoE's mlp_only_layers)

    def __post_init__(self):
        for name in ("n_experts", "top_k", "d_expert"):
            positive_int(f"moe.{name}", getattr(self, name))
        if self.top_k > self.n_experts:
            raise ValueError(f"moe.top_k: expected at most n_experts={self.n_experts}, got {self.top_k}")
        one_of("moe.router", self.router, ROUTERS, expected=f"one of {ROUTERS}")
        one_of("moe.act", self.act, ACTS, expected=f"one of {ACTS}")
        self.dense_layers = tuple(int(i) for i in self.dense_layers)

    @classmethod
    def from_value(cls, value) -> "MoEConfig | None":
        """None, a MoEConfig, or its dict (what headcount.json holds) -> MoEConfig | None."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"moe: expected a dict of MoEConfig fields or None, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        extra = sorted(set(value) - known)
        if extra:
            raise ValueError(f"moe: unknown field(s) {', '.join(extra)}")
        return cls(**value)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dense_layers"] = list(d["dense_layers"])
        return d


class MoEFeedForward(nn.Module):
    """x [B, T, d_model] -> the routed experts' weighted sum [B, T, d_model] (see the module doc)."""

    def __init__(self, d_model: int, cfg: MoEConfig, *, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.n_experts, self.top_k, self.d_expert = cfg.n_experts, cfg.top_k, cfg.d_expert
        self.router = nn.Linear(d_model, cfg.n_experts, bias=cfg.router_bias, **factory)
        e, f = cfg.n_experts, cfg.d_expert
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, d_model, **factory))  # rows [gate | up]
        self.down_proj = nn.Parameter(torch.empty(e, d_model, f, **factory))
        self.gate_up_bias = nn.Parameter(torch.zeros(e, 2 * f, **factory)) if cfg.expert_bias else None
        self.down_bias = nn.Parameter(torch.zeros(e, d_model, **factory)) if cfg.expert_bias else None
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, d_expert={self.d_expert}, "
                f"router={self.cfg.router}{'' if self.cfg.normalize else ' (not renormalised)'}, act={self.cfg.act}")

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [N, d_model] -> (router logits [N, n_experts], weights [N, top_k], expert indices [N, top_k])."""
        logits = self.router(x)
        if self.cfg.router == "topk_softmax":
            top, index = torch.topk(logits, self.top_k, dim=-1)
            return logits, torch.softmax(top, dim=-1), index
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        if self.cfg.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top.to(logits.dtype), index

    def _expert(self, e: int, h: Tensor) -> Tensor:
        """Expert e on its tokens h [n, d_model] -> [n, d_model]."""
        gate_up = F.linear(h, self.gate_up_proj[e], None if self.gate_up_bias is None else self.gate_up_bias[e])
        gate, up = gate_up.split(self.d_expert, dim=-1)
        if self.cfg.act == "silu":
            hidden = F.silu(gate) * up
        else:
            limit = self.cfg.swiglu_limit
            gate = gate.clamp(max=limit)
            hidden = (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * self.cfg.swiglu_alpha))
        return F.linear(hidden, self.down_proj[e], None if self.down_bias is None else self.down_bias[e])

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, d)
        _, weights, index = self.route(flat)
        out = torch.zeros_like(flat)
        slots = index.reshape(-1)  # (N * top_k,): token n's j-th choice at n * top_k + j
        order = torch.argsort(slots, stable=True)  # slots grouped by expert, tokens in order within one
        counts = torch.bincount(slots, minlength=self.n_experts).tolist()
        flat_weights = weights.reshape(-1)
        start = 0
        for e, count in enumerate(counts):  # experts in index order: the sum's order is transformers'
            if not count:
                continue
            picked = order[start:start + count]
            start += count
            tokens = picked // self.top_k
            y = self._expert(e, flat.index_select(0, tokens)) * flat_weights[picked].unsqueeze(-1)
            # out[tokens] += y (each token once per expert). index_put_(accumulate=True), not index_add_: the
            # same sums, and on CPU (torch 2.13) index_add_ costs ~50 ms per call even for one row
            out.index_put_((tokens,), y.to(out.dtype), accumulate=True)
        return out.view(shape)
