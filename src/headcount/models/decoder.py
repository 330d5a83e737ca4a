"""The decoder family: Llama / Qwen2 / SmolLM2 (RMSNorm, rotary, gated SiLU MLP, GQA) and GPT-2
(LayerNorm, learned positions, GELU MLP) on one class, built from headcount.MultiHeadAttention.

    input_ids -> embed (+ learned positions) -> n_layers x [ x + attn(norm(x)) ; x + mlp(norm(x)) ]
              -> norm -> lm_head (tied to embed or its own)

Rotary position embedding enters each attention module through its `qk_transform` hook (one hook per
forward call, shared by all layers): the attention module is used as is, never copied.

Public hooks for head analysis: `model.layers[i].attn` is layer i's MultiHeadAttention;
`forward(head_gates=...)` takes one gate tensor per layer ([n_layers, n_heads], or a list with None
for ungated layers); `forward(need_weights=True)` returns every layer's weights [B, n_heads, T, S].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from headcount.attention import MultiHeadAttention
from headcount.cache import KVCache
from headcount.models.rotary import RotaryEmbedding

Tensor = torch.Tensor

NORMS = ("rms", "layer")
MLPS = ("gated_silu", "gelu_tanh", "gelu")
POSITIONS = ("rotary", "learned")


@dataclass
class DecoderConfig:
    """Everything the decoder's shape depends on. `family` is informational ("llama", "qwen2", "gpt2")."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None  # None = n_heads (MHA)
    head_dim: int | None = None  # None = d_model // n_heads
    max_position: int = 2048
    norm: str = "rms"  # "rms" (Llama) | "layer" (GPT-2)
    norm_eps: float = 1e-5
    mlp: str = "gated_silu"  # "gated_silu" (Llama) | "gelu_tanh" (GPT-2's gelu_new) | "gelu"
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

    def to_dict(self) -> dict:
        return asdict(self)


class DecoderOutput(NamedTuple):
    logits: Tensor | None  # [B, T, vocab] (or [B, 1, vocab] with last_only); None with compute_logits=False
    hidden_states: Tensor  # [B, T, d_model] after the final norm
    weights: tuple[Tensor, ...] | None  # per layer [B, n_heads, T, S] when need_weights


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 (as Llama does)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        y = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up fused in one Linear, rows [gate | up]."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.d_ff = d_ff
        self.gate_up_proj = nn.Linear(d_model, 2 * d_ff, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).split(self.d_ff, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


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


def _norm(cfg: DecoderConfig, factory: dict) -> nn.Module:
    if cfg.norm == "rms":
        return RMSNorm(cfg.d_model, cfg.norm_eps, **factory)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **factory)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x))."""

    def __init__(self, cfg: DecoderConfig, *, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.attn_norm = _norm(cfg, factory)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                                       bias=cfg.qkv_bias, o_bias=cfg.o_bias, **factory)
        self.mlp_norm = _norm(cfg, factory)
        if cfg.mlp == "gated_silu":
            self.mlp = GatedMLP(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias, **factory)
        else:
            self.mlp = GeluMLP(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias,
                               approximate="tanh" if cfg.mlp == "gelu_tanh" else "none", **factory)

    def forward(self, x: Tensor, *, cache: KVCache | None, key_padding_mask: Tensor | None,
                qk_transform, head_gates: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        out, weights = self.attn(self.attn_norm(x), cache=cache, is_causal=True,
                                 key_padding_mask=key_padding_mask, qk_transform=qk_transform,
                                 head_gates=head_gates, need_weights=need_weights)
        x = x + out
        x = x + self.mlp(self.mlp_norm(x))
        return x, weights


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


class Decoder(nn.Module):
    """A decoder-only language model (Llama / Qwen2 / SmolLM2 / GPT-2 families).

    `layers[i].attn` is a headcount.MultiHeadAttention. `tokenizer` is set by the loaders.
    """

    def __init__(self, config: DecoderConfig, *, device=None, dtype=None):
        super().__init__()
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(config.vocab_size, config.d_model, **factory)
        self.pos_embed = (nn.Embedding(config.max_position, config.d_model, **factory)
                          if config.position == "learned" else None)
        self.rotary = (RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta, device=device)
                       if config.position == "rotary" else None)
        self.layers = nn.ModuleList(DecoderLayer(config, **factory) for _ in range(config.n_layers))
        self.norm = _norm(config, factory)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, **factory)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.tokenizer = None  # a headcount.models.tokenizer.Tokenizer, set by the loaders
        self.name = None  # the zoo name or checkpoint path it was loaded from

    # ---------------------------------------------------------------------------------- info
    @property
    def attentions(self) -> list[MultiHeadAttention]:
        """Each layer's attention module, in order (the same objects as layers[i].attn)."""
        return [layer.attn for layer in self.layers]

    @property
    def max_position(self) -> int:
        return self.config.max_position

    # ---------------------------------------------------------------------------------- cache
    def new_cache(self, batch_size: int = 1, max_len: int | None = None, dtype=None) -> list[KVCache]:
        """One KVCache per layer, each [batch_size, n_kv_heads, max_len, head_dim]."""
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
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected shape [B, T], got {list(input_ids.shape)}")
        batch, length = input_ids.shape
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache: expected {len(self.layers)} KVCaches (one per layer), got {len(cache)}")
        start = cache[0].length if cache is not None else 0
        if start + length > self.config.max_position:
            raise ValueError(f"sequence of {start + length} tokens is past the model's context of "
                             f"{self.config.max_position} tokens")
        gates = layer_gates(head_gates, len(self.layers))
        key_padding_mask = None
        if attention_mask is not None:
            key_padding_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.bool()

        x = self.embed(input_ids)  # (B, T, d)
        qk_transform = None
        if self.rotary is not None:
            qk_transform = self.rotary.hook(start, length, position_ids=position_ids, dtype=x.dtype)
        else:
            if position_ids is None:
                pos = torch.arange(start, start + length, device=input_ids.device)
            else:
                pos = position_ids
            x = x + self.pos_embed(pos)
        weights = [] if need_weights else None
        for layer, cache_i, gate in zip(self.layers, cache if cache is not None else [None] * len(self.layers),
                                        gates):
            x, w = layer(x, cache=cache_i, key_padding_mask=key_padding_mask,
                         qk_transform=qk_transform, head_gates=gate, need_weights=need_weights)
            if need_weights:
                weights.append(w)
        x = self.norm(x)
        logits = None
        if compute_logits:
            logits = self.lm_head(x[:, -1:] if last_only else x)
        return DecoderOutput(logits, x, tuple(weights) if need_weights else None)
