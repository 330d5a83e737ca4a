"""The decoder family on one class, built from headcount.MultiHeadAttention: Llama / Qwen2 / Qwen3 /
Mistral / SmolLM2 (RMSNorm, rotary, gated SiLU MLP, GQA), Gemma 3 (q/k norms, sliding-window layers,
norms around attention and MLP, gated tanh-GELU) and GPT-2 (LayerNorm, learned positions, GELU MLP).

    input_ids -> embed (x embed_scale) (+ learned positions)
              -> n_layers x [ x + post_attn_norm(attn(attn_norm(x))) ; x + post_mlp_norm(mlp(mlp_norm(x))) ]
              -> norm -> lm_head (tied to embed or its own)

(post_attn_norm / post_mlp_norm only with `post_norms`, Gemma's "sandwich" norms.)

The switches for Gemma 2, GPT-NeoX / Pythia and OLMo 2 (the defaults change nothing):
- `pre_norms=False` (OLMo 2): no attn_norm / mlp_norm, only the norms after each sub-layer:
  x + post_attn_norm(attn(x)) ; x + post_mlp_norm(mlp(x)).
- `parallel_residual` (GPT-NeoX / Pythia): x + attn(attn_norm(x)) + mlp(mlp_norm(x)), both from the same x.
- `attn_softcap` (Gemma 2): attention scores capped, softcap * tanh(scores / softcap), before the mask. SDPA's
  fused kernel cannot do it, so these layers run the eager formula in query chunks (kernels.attend): the
  scores of one chunk of queries at a time, never [T, S], and with a cache only the new queries.
- `final_softcap` (Gemma 2): logits -> final_softcap * tanh(logits / final_softcap), inside lm_head
  (`SoftcapLinear`), so forward, generate, chunked_nll and every caller of model.lm_head get it.
- `qk_norm_full` (OLMo 2): q_norm / k_norm over the whole projection (norms.FullRMSNorm), not per head.
- `rotary_dim` (GPT-NeoX): partial rotary, only the first rotary_dim dims of each head rotate.

Rotary position embedding enters each attention module through its `qk_transform` hook (one hook per
forward call, shared by all layers): the attention module is used as is, never copied. A model whose
sliding-window layers use their own rotary base (Gemma 3: 10k local, 1e6 global) hands every layer
both hooks (`qk_transform`, `qk_transform_local`) and each layer picks by its type, so the keyword
arguments a layer receives are the same for every layer (surgery calls each layer with the ones it
captured on layer 0).

Public hooks for head analysis: `model.layers[i].attn` is layer i's MultiHeadAttention;
`forward(head_gates=...)` takes one gate tensor per layer ([n_layers, n_heads], or a list with None
for ungated layers); `forward(need_weights=True)` returns every layer's weights [B, n_heads, T, S].

Loss without logits: `chunked_nll(hidden, targets, lm_head)` (and `Decoder.token_nll` / `Decoder.loss`)
runs lm_head over at most `chunk` positions at a time, so a 262,144-token vocabulary never costs a
[T, vocab] tensor (with gradients, each chunk's logits are recomputed in backward).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from headcount.arguments import positive_float, positive_int
from headcount.attention import MultiHeadAttention
from headcount.cache import KVCache
from headcount.models.dropped import NoAttention, is_dropped
from headcount.models.moe import MoEConfig, MoEFeedForward
from headcount.models.rotary import RotaryEmbedding

Tensor = torch.Tensor

NORMS = ("rms", "rms_float", "layer")
MLPS = ("gated_silu", "gated_gelu_tanh", "gelu_tanh", "gelu")
POSITIONS = ("rotary", "learned")
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' spelling of config.layer_types
LAYER_TYPES = (FULL, SLIDING)
LOGIT_ELEMENTS = 1 << 25  # chunked_nll's default budget: chunk = LOGIT_ELEMENTS // vocab positions (128 MiB fp32)
# ... and with gradients, where a chunk's backward holds about four [chunk, vocab] fp32 tensors at once (the
# recomputed logits, their log-softmax, and the two gradients): 32 MiB each
LOGIT_ELEMENTS_GRAD = 1 << 23


@dataclass
class DecoderConfig:
    """Everything the decoder's shape depends on. `family` is informational ("llama", "qwen2", "qwen3",
    "mistral", "gemma3", "gpt2")."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None  # None = n_heads (MHA)
    head_dim: int | None = None  # None = d_model // n_heads
    max_position: int = 2048
    norm: str = "rms"  # "rms" (Llama) | "rms_float" (Gemma: weight applied in float32) | "layer" (GPT-2)
    norm_eps: float = 1e-5
    mlp: str = "gated_silu"  # "gated_silu" (Llama) | "gated_gelu_tanh" (Gemma) | "gelu_tanh" (GPT-2) | "gelu"
    position: str = "rotary"  # "rotary" | "learned"
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    family: str = "llama"
    # --- what Gemma 3 / Qwen3 / Mistral add (the defaults change nothing) ---
    rope_scaling: float = 1.0  # linear rotary scaling (angles / factor) on full-attention layers
    rope_local_theta: float | None = None  # rotary base of sliding-window layers; None = rope_theta
    qk_norm: bool = False  # RMSNorm of each head's q and k over head_dim (eps = norm_eps), before rotary
    softmax_scale: float | None = None  # multiplies Q K^T; None = head_dim ** -0.5
    sliding_window: int | None = None  # what MultiHeadAttention(sliding_window=) gets on sliding layers
    layer_types: tuple[str, ...] | None = None  # per layer FULL | SLIDING; None with a window = all sliding
    embed_scale: float | None = None  # embeddings x this, rounded to the weight dtype (Gemma: sqrt(d_model))
    post_norms: bool = False  # norms after the attention and the MLP as well (Gemma)
    causal: bool = True  # False: bidirectional attention (embedding models: encoder.BidirectionalEncoder)
    # --- what Gemma 2 / GPT-NeoX (Pythia) / OLMo 2 add (the defaults change nothing) ---
    rotary_dim: int | None = None  # partial rotary: only the first rotary_dim dims of each head rotate
    # --- mixture-of-experts feed-forward and per-head sink logits (GPT-OSS) ---
    moe: MoEConfig | None = None  # routed experts instead of the dense MLP (moe.py); a dict is converted
    attn_sinks: bool = False  # a learned sink logit per head in every row's softmax (MultiHeadAttention.sinks)
    # --- rope types, NoPE layers, Granite's multipliers (the defaults change nothing) ---
    rope_type: str = "default"  # transformers' rope type (rotary.ROPE_TYPES); "linear" stays rope_scaling
    rope_parameters: dict | None = None  # that type's fields (factor, original_max_position_embeddings, ...)
    nope_layers: tuple[int, ...] = ()  # layers that leave rotary out (SmolLM3's no_rope_layers zeros)
    embedding_multiplier: float = 1.0  # Granite: embeddings x this (a Python float, as transformers)
    residual_multiplier: float = 1.0  # Granite: each sub-layer's output x this before the residual add
    logits_scaling: float = 1.0  # Granite: logits / this
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the mask (Gemma 2)
    final_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2)
    parallel_residual: bool = False  # x + attn(attn_norm(x)) + mlp(mlp_norm(x)) (GPT-NeoX)
    pre_norms: bool = True  # False: no norm before attention / MLP, only post_norms (OLMo 2)
    qk_norm_full: bool = False  # q/k norms over the whole projection, before the head split (OLMo 2)

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}; give head_dim")
            self.head_dim = self.d_model // self.n_heads
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        w = positive_int("sliding_window", self.sliding_window, none=True)
        if self.layer_types is not None:
            types = tuple(self.layer_types)
            if len(types) != self.n_layers or any(t not in LAYER_TYPES for t in types):
                raise ValueError(f"layer_types: expected {self.n_layers} entries, each one of {LAYER_TYPES}; "
                                 f"got {list(types)}")
            if SLIDING in types and w is None:
                raise ValueError("layer_types: sliding_attention layers need a sliding_window")
            self.layer_types = types
        positive_float("rope_scaling", self.rope_scaling, expected="a positive factor")
        self.moe = MoEConfig.from_value(self.moe)
        self.nope_layers = tuple(int(i) for i in self.nope_layers)
        if any(not 0 <= i < self.n_layers for i in self.nope_layers):
            raise ValueError(f"nope_layers: expected layer indices below n_layers={self.n_layers}, "
                             f"got {list(self.nope_layers)}")
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
            positive_float(name, getattr(self, name), expected="a positive number")
        for name in ("attn_softcap", "final_softcap"):
            positive_float(name, getattr(self, name), none=True)
        if not self.pre_norms and not self.post_norms:
            raise ValueError("pre_norms: False needs post_norms (a block with no norm at all is not a family)")
        if self.qk_norm_full and not self.qk_norm:
            raise ValueError("qk_norm_full: True needs qk_norm")

    def layer_type(self, i: int) -> str:
        """FULL or SLIDING for layer i."""
        if self.sliding_window is None:
            return FULL
        return SLIDING if self.layer_types is None else self.layer_types[i]

    def attention_kwargs(self, i: int) -> dict:
        """What layer i's MultiHeadAttention gets beyond its head layout: softmax_scale, qk_norm_eps and
        sliding_window (for code that rebuilds a layer's attention, e.g. from a saved per-layer layout)."""
        kwargs = {"softmax_scale": self.softmax_scale, "qk_norm_eps": self.norm_eps if self.qk_norm else None,
                  "sliding_window": self.sliding_window if self.layer_type(i) == SLIDING else None}
        if self.attn_sinks:
            kwargs["sinks"] = True
        if self.qk_norm_full:
            kwargs["qk_norm_full"] = True
        if self.attn_softcap is not None:
            kwargs["logit_softcap"] = self.attn_softcap
        return kwargs

    def is_moe_layer(self, i: int) -> bool:
        """True when layer i's feed-forward is the routed experts (moe set, i not in moe.dense_layers)."""
        return self.moe is not None and i not in self.moe.dense_layers

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["layer_types"] is not None:
            d["layer_types"] = list(d["layer_types"])
        if self.moe is not None:
            d["moe"] = self.moe.to_dict()
        d["nope_layers"] = list(d["nope_layers"])
        return d


class DecoderOutput(NamedTuple):
    logits: Tensor | None  # [B, T, vocab] (or [B, 1, vocab] with last_only); None with compute_logits=False
    hidden_states: Tensor  # [B, T, d_model] after the final norm
    weights: tuple[Tensor, ...] | None  # per layer [B, n_heads, T, S] when need_weights


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the statistics in float32 (as Llama does).

    weight_in_float32: in half precision, multiply by the weight in float32 and cast the product
    (Gemma's order) instead of casting the normalised x first (Llama's). Identical in float32.
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, weight_in_float32: bool = False, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight_in_float32 = weight_in_float32
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        y = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        if self.weight_in_float32:
            return (y * self.weight.float()).to(x.dtype)
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (", weight_in_float32" if self.weight_in_float32 else "")


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate and up fused in one Linear, rows [gate | up].
    act: "silu" (Llama's SwiGLU) or "gelu_tanh" (Gemma's GeGLU, gelu_pytorch_tanh)."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, act: str = "silu", device=None, dtype=None):
        super().__init__()
        if act not in ("silu", "gelu_tanh"):
            raise ValueError(f"act: expected 'silu' or 'gelu_tanh', got {act!r}")
        self.d_ff, self.act = d_ff, act
        self.gate_up_proj = nn.Linear(d_model, 2 * d_ff, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).split(self.d_ff, dim=-1)
        gate = F.silu(gate) if self.act == "silu" else F.gelu(gate, approximate="tanh")
        return self.down_proj(gate.mul_(up))


class GeluMLP(nn.Module):
    """down(gelu(up(x))); GPT-2 uses the tanh approximation ("gelu_new")."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = True, approximate: str = "none", device=None,
                 dtype=None):
        super().__init__()
        self.approximate = approximate
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.up_proj(x), approximate=self.approximate))


class SoftcapLinear(nn.Linear):
    """lm_head with Gemma 2's final soft-capping: softcap * tanh(linear(x) / softcap). A subclass, so the
    weight (tied or not) and the state-dict key stay lm_head.weight; packing.py leaves it unpacked."""

    def __init__(self, in_features: int, out_features: int, *, softcap: float, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.softcap = float(softcap)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(super().forward(x) / self.softcap) * self.softcap

    def extra_repr(self) -> str:
        return super().extra_repr() + f", softcap={self.softcap:g}"


def _norm(cfg: DecoderConfig, factory: dict) -> nn.Module:
    if cfg.norm == "layer":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **factory)
    return RMSNorm(cfg.d_model, cfg.norm_eps, weight_in_float32=cfg.norm == "rms_float", **factory)


class ScaledLMHead(nn.Module):
    """lm_head with Granite's logits_scaling: F.linear(x, weight) / scaling. Not an nn.Linear on purpose: the
    packed path (packing.py) replaces Linear forwards and would drop the division."""

    def __init__(self, d_model: int, vocab_size: int, scaling: float, *, device=None, dtype=None):
        super().__init__()
        self.scaling = scaling
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight) / self.scaling

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[0]}, logits / {self.scaling:g}"


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)); with post_norms the attention
    and MLP outputs are normed again before the residual add (post_attn_norm, post_mlp_norm); without
    pre_norms attn_norm / mlp_norm are None (OLMo 2); with parallel_residual x + attn(..) + mlp(mlp_norm(x)).
    drop_attention() removes the attention sublayer (models/dropped.py): then x -> x + mlp(mlp_norm(x))."""

    def __init__(self, cfg: DecoderConfig, index: int = 0, *, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.index = index
        self.layer_type = cfg.layer_type(index)
        self.causal = cfg.causal
        self.use_rope = index not in cfg.nope_layers  # SmolLM3's NoPE layers: no rotary at all
        self.residual_multiplier = cfg.residual_multiplier
        self.parallel_residual = cfg.parallel_residual
        self.attn_norm = _norm(cfg, factory) if cfg.pre_norms else None
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                                       bias=cfg.qkv_bias, o_bias=cfg.o_bias, **cfg.attention_kwargs(index), **factory)
        if cfg.qk_norm and cfg.norm == "rms":  # Qwen3's q/k norms cast before the weight, like its other norms
            self.attn.q_norm.cast_before_weight = self.attn.k_norm.cast_before_weight = True
        self.post_attn_norm = _norm(cfg, factory) if cfg.post_norms else None
        self.mlp_norm = _norm(cfg, factory) if cfg.pre_norms else None
        if cfg.is_moe_layer(index):
            self.mlp = MoEFeedForward(cfg.d_model, cfg.moe, **factory)
        elif cfg.mlp.startswith("gated_"):
            self.mlp = GatedMLP(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias, act=cfg.mlp[len("gated_"):], **factory)
        else:
            self.mlp = GeluMLP(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias,
                               approximate="tanh" if cfg.mlp == "gelu_tanh" else "none", **factory)
        self.post_mlp_norm = _norm(cfg, factory) if cfg.post_norms else None

    # training: recompute this layer's activations in backward (headcount.training.layer_checkpointing sets it)
    gradient_checkpointing = False

    @property
    def attn_dropped(self) -> bool:
        """True once drop_attention() removed this layer's attention sublayer."""
        return is_dropped(self.attn)

    def drop_attention(self) -> None:
        """Remove the attention sublayer: every head, its K/V cache and the norms that fed only it (attn_norm,
        post_attn_norm); the MLP stays and the residual passes through (models/dropped.py)."""
        if self.attn_dropped:
            return
        anchor = next(self.mlp.parameters())  # the layer's dtype and device, for the empty caches it makes
        self.attn = NoAttention(self.index, self.attn.head_dim, d_model=self.attn.d_model, dtype=anchor.dtype,
                                device=anchor.device)
        self.attn_norm = self.post_attn_norm = None

    def forward(self, x: Tensor, **kwargs) -> tuple[Tensor, Tensor | None]:
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(self.block, x, use_reentrant=False, **kwargs)
        return self.block(x, **kwargs)

    def block(self, x: Tensor, *, cache: KVCache | None, key_padding_mask: Tensor | None,
              qk_transform, head_gates: Tensor | None, need_weights: bool,
              qk_transform_local=None) -> tuple[Tensor, Tensor | None]:
        if self.attn_dropped:  # the attention's output is nothing: only the token count advances in its cache
            if cache is not None:
                cache.skip(x.shape[1])
            return self._mlp_residual(x), None
        rope = qk_transform_local if self.layer_type == SLIDING and qk_transform_local is not None else qk_transform
        if not self.use_rope:
            rope = None
        out, weights = self.attn(self.attn_norm(x) if self.attn_norm is not None else x, cache=cache,
                                 is_causal=self.causal, key_padding_mask=key_padding_mask, qk_transform=rope,
                                 head_gates=head_gates, need_weights=need_weights)
        if self.parallel_residual:  # GPT-NeoX: both from the same x, summed as transformers sums them
            return self.mlp(self.mlp_norm(x)) + self.attention_update(out) + x, weights
        return self._mlp_residual(x + self.attention_update(out)), weights

    def attention_update(self, out: Tensor) -> Tensor:
        """What the attention's output `out` [B, T, d_model] adds to the residual stream: after the
        post-attention norm (Gemma, OLMo 2) and Granite's multiplier."""
        if self.post_attn_norm is not None:
            out = self.post_attn_norm(out)
        if self.residual_multiplier != 1.0:  # Granite
            out = out * self.residual_multiplier
        return out

    def _mlp_residual(self, x: Tensor) -> Tensor:
        """x + the MLP sub-layer's output (x is the residual after attention; for GPT-NeoX's parallel residual,
        only reached without attention, the MLP reads the same x)."""
        out = self.mlp(self.mlp_norm(x) if self.mlp_norm is not None else x)
        if self.post_mlp_norm is not None:
            out = self.post_mlp_norm(out)
        if self.residual_multiplier != 1.0:
            out = out * self.residual_multiplier
        return x + out


def layer_gates(head_gates, n_layers: int) -> list:
    """Per-layer gates from a [n_layers, n_heads] / [n_layers, B, n_heads] tensor or a length-n_layers list."""
    if head_gates is None:
        return [None] * n_layers
    if isinstance(head_gates, torch.Tensor):
        if head_gates.dim() not in (2, 3) or head_gates.shape[0] != n_layers:
            raise ValueError(f"head_gates: expected a tensor [n_layers={n_layers}, n_heads] or "
                             f"[n_layers={n_layers}, B, n_heads], or a list of {n_layers} tensors/None; "
                             f"got shape {list(head_gates.shape)}")
        return list(head_gates.unbind(0))
    gates = list(head_gates)
    if len(gates) != n_layers:
        raise ValueError(f"head_gates: expected {n_layers} entries (one per layer), got {len(gates)}")
    return gates


def chunked_nll(hidden: Tensor, targets: Tensor, lm_head: nn.Module, *, chunk: int | None = None,
                ignore_index: int = -100) -> Tensor:
    """Per-position negative log-likelihood [..., T] (float32; 0 where targets == ignore_index) of
    `targets` [..., T] under softmax(lm_head(hidden [..., T, d])), at most `chunk` positions at a time.

    No [T, vocab] tensor is ever built: each chunk of logits is consumed by cross_entropy and freed.
    With gradients, each chunk is checkpointed (its logits recomputed in backward), so training through
    it holds one chunk of logits too. chunk None = LOGIT_ELEMENTS // vocab positions (128 MiB of fp32), a
    quarter of that with gradients (LOGIT_ELEMENTS_GRAD: the backward of a chunk holds about four such tensors).
    Positions are independent, so the values do not depend on `chunk` (up to the matmul's blocking).
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets: expected shape {list(hidden.shape[:-1])} (hidden's without d_model), "
                         f"got {list(targets.shape)}")
    vocab = lm_head.weight.shape[0]
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    if positive_int("chunk", chunk, none=True) is None:
        chunk = max(1, (LOGIT_ELEMENTS_GRAD if grad else LOGIT_ELEMENTS) // vocab)
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1)

    def piece(h: Tensor, t: Tensor) -> Tensor:
        # [N, vocab] rows: log-softmax over the last dim (a non-last dim is less accurate in torch)
        return F.cross_entropy(lm_head(h).float(), t, reduction="none", ignore_index=ignore_index)

    parts = []
    for start in range(0, flat_t.shape[0], chunk):
        h, t = flat_h[start:start + chunk], flat_t[start:start + chunk]
        parts.append(checkpoint(piece, h, t, use_reentrant=False) if grad else piece(h, t))
    if not parts:
        return hidden.new_zeros(targets.shape, dtype=torch.float32)
    return torch.cat(parts).view(targets.shape)


class DecoderStack(nn.Module):
    """embed (x embed_scale) -> positions -> layers -> norm: what Decoder and encoder.BidirectionalEncoder share."""

    def __init__(self, config: DecoderConfig, *, device=None, dtype=None):
        super().__init__()
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(config.vocab_size, config.d_model, **factory)
        self.pos_embed = (nn.Embedding(config.max_position, config.d_model, **factory)
                          if config.position == "learned" else None)
        self.rotary = self.rotary_local = None
        if config.position == "rotary":
            self.rotary = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta,
                                          linear_factor=config.rope_scaling, rope_type=config.rope_type,
                                          rope_parameters=config.rope_parameters, rotary_dim=config.rotary_dim,
                                          device=device)
            local = config.rope_local_theta
            if local is not None and SLIDING in {config.layer_type(i) for i in range(config.n_layers)}:
                self.rotary_local = RotaryEmbedding(config.head_dim, config.max_position, local,
                                                    rotary_dim=config.rotary_dim, device=device)
        self.layers = nn.ModuleList(DecoderLayer(config, i, **factory) for i in range(config.n_layers))
        self.norm = _norm(config, factory)
        self.tokenizer = None  # a headcount.models.tokenizer.Tokenizer, set by the loaders
        self.name = None  # the zoo name or checkpoint path it was loaded from

    @property
    def attentions(self) -> list[MultiHeadAttention]:
        """Each layer's attention module, in order (the same objects as layers[i].attn); a dropped layer's is a
        NoAttention (no heads, a cache of no bytes)."""
        return [layer.attn for layer in self.layers]

    @property
    def dropped_layers(self) -> tuple[int, ...]:
        """Indices of the layers whose attention sublayer was dropped (drop-attention)."""
        return tuple(i for i, layer in enumerate(self.layers) if layer.attn_dropped)

    @property
    def max_position(self) -> int:
        return self.config.max_position

    def _hidden(self, input_ids: Tensor, *, cache, attention_mask, position_ids, head_gates,
                need_weights: bool) -> tuple[Tensor, list | None]:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected shape [B, T], got {list(input_ids.shape)}")
        batch, length = input_ids.shape
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache: expected {len(self.layers)} KVCaches (one per layer), got {len(cache)}")
        start = cache[0].length if cache is not None else 0  # a SlidingKVCache's length counts every token too
        if start + length > self.config.max_position:
            raise ValueError(f"sequence of {start + length} tokens is past the model's context of "
                             f"{self.config.max_position} tokens")
        gates = layer_gates(head_gates, len(self.layers))
        key_padding_mask = None
        if attention_mask is not None:
            key_padding_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.bool()

        x = self.embed(input_ids)  # (B, T, d)
        if self.config.embed_scale is not None:  # as transformers: a float32 scalar cast to the weight dtype
            x = x * torch.tensor(self.config.embed_scale, dtype=torch.float32).to(x.dtype)
        if self.config.embedding_multiplier != 1.0:  # Granite: a Python float, as transformers multiplies
            x = x * self.config.embedding_multiplier
        hooks = {"qk_transform": None}
        if self.rotary is not None:
            hooks["qk_transform"] = self.rotary.hook(start, length, position_ids=position_ids, dtype=x.dtype)
            if self.rotary_local is not None:
                hooks["qk_transform_local"] = self.rotary_local.hook(start, length, position_ids=position_ids,
                                                                     dtype=x.dtype)
        else:
            pos = torch.arange(start, start + length, device=input_ids.device) if position_ids is None else position_ids
            x = x + self.pos_embed(pos)
        weights = [] if need_weights else None
        for layer, cache_i, gate in zip(self.layers, cache if cache is not None else [None] * len(self.layers),
                                        gates):
            x, w = layer(x, cache=cache_i, key_padding_mask=key_padding_mask, head_gates=gate,
                         need_weights=need_weights, **hooks)
            if need_weights:
                weights.append(w)
        return self.norm(x), weights


class Decoder(DecoderStack):
    """A decoder-only language model (Llama / Qwen2 / Qwen3 / Mistral / Gemma 3 / SmolLM2 / GPT-2 families).

    `layers[i].attn` is a headcount.MultiHeadAttention. `tokenizer` is set by the loaders.
    """

    def __init__(self, config: DecoderConfig, *, device=None, dtype=None):
        if not config.causal:
            raise ValueError("config.causal is False: a bidirectional model is an encoder.BidirectionalEncoder, "
                             "not a Decoder")
        super().__init__(config, device=device, dtype=dtype)
        if config.final_softcap is not None:
            self.lm_head = SoftcapLinear(config.d_model, config.vocab_size, softcap=config.final_softcap,
                                         device=device, dtype=dtype)
        elif config.logits_scaling != 1.0:  # Granite: every caller of lm_head (losses too) gets logits / scaling
            self.lm_head = ScaledLMHead(config.d_model, config.vocab_size, config.logits_scaling, device=device,
                                        dtype=dtype)
        else:
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, device=device, dtype=dtype)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    # ---------------------------------------------------------------------------------- cache
    def new_cache(self, batch_size: int = 1, max_len: int | None = None, dtype=None) -> list[KVCache]:
        """One KVCache per layer, each [batch_size, n_kv_heads, max_len, head_dim] (a sliding-window
        layer's cache holds only its window)."""
        max_len = self.config.max_position if max_len is None else max_len
        if max_len > self.config.max_position:
            raise ValueError(f"max_len={max_len} is past the model's context of {self.config.max_position} tokens")
        return [layer.attn.new_cache(batch_size, max_len, dtype) for layer in self.layers]

    # -------------------------------------------------------------------------------- forward
    def forward(self, input_ids: Tensor, *, cache: Sequence[KVCache] | None = None,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None, head_gates=None,
                need_weights: bool = False, last_only: bool = False, compute_logits: bool = True) -> DecoderOutput:
        """input_ids [B, T] -> DecoderOutput(logits [B, T, vocab], hidden_states, weights).

        cache: from new_cache(); the tokens are appended after cache[0].length tokens (prefill, then
            one token at a time to decode). Positions continue from there.
        attention_mask: [B, S] (S = cached + new tokens), 1/True = a real token (padding is masked
            out as keys). Positions are 0..T-1 regardless, as in transformers; pass position_ids
            [B, T] for left-padded batches.
        head_gates: [n_layers, n_heads], [n_layers, B, n_heads] or a list of per-layer tensors / None.
        need_weights: return every layer's attention weights (the eager path; slower).
        last_only: logits for the last position only ([B, 1, vocab]): what prefill needs.
        compute_logits: False skips lm_head (use token_nll / loss on hidden_states for a loss).
        """
        x, weights = self._hidden(input_ids, cache=cache, attention_mask=attention_mask, position_ids=position_ids,
                                  head_gates=head_gates, need_weights=need_weights)
        logits = None
        if compute_logits:
            logits = self.lm_head(x[:, -1:] if last_only else x)
        return DecoderOutput(logits, x, tuple(weights) if need_weights else None)

    # ---------------------------------------------------------------------------------- loss
    def token_nll(self, hidden: Tensor, targets: Tensor, *, chunk: int | None = None,
                  ignore_index: int = -100) -> Tensor:
        """Per-position NLL [B, T] (float32) of targets [B, T] given hidden_states [B, T, d]: see chunked_nll.
        For next-token prediction pass hidden[:, :-1] and input_ids[:, 1:]."""
        return chunked_nll(hidden, targets, self.lm_head, chunk=chunk, ignore_index=ignore_index)

    def loss(self, hidden: Tensor, targets: Tensor, *, chunk: int | None = None, ignore_index: int = -100) -> Tensor:
        """Mean NLL over the positions whose target is not ignore_index (transformers' causal-LM loss
        once the targets are shifted), without a [T, vocab] logits tensor."""
        nll = self.token_nll(hidden, targets, chunk=chunk, ignore_index=ignore_index)
        return nll.sum() / (targets != ignore_index).sum().clamp(min=1)
