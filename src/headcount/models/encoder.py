"""The BERT-family encoder (MiniLM, BERT): post-norm blocks on headcount.MultiHeadAttention; and
BidirectionalEncoder, a decoder's stack without the causal mask (Gemma 3's use_bidirectional_attention:
EmbeddingGemma), with the same output contract (`model(ids, mask).last_hidden_state`).

    input_ids, token_type_ids -> word + position + token-type embeddings -> LayerNorm
      -> n_layers x [ x = norm(x + attn(x)) ; x = norm(x + mlp(x)) ]      (post-norm, GELU MLP)
      -> last_hidden_state (and pooler: tanh(dense(h[:, 0])) when the checkpoint has one)

Padding: attention_mask [B, T] (1/True = a real token) masks padded keys in every layer; padded
query positions are still computed (as in transformers) and are meaningless.

Public hooks for head analysis: `model.layers[i].attn`; `forward(head_gates=...)`;
`forward(need_weights=True)` returns every layer's weights [B, n_heads, T, T].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from headcount.arguments import one_of
from headcount.attention import MultiHeadAttention
from headcount.models.decoder import DecoderConfig, DecoderStack, layer_gates

Tensor = torch.Tensor


@dataclass
class EncoderConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_position: int = 512
    type_vocab_size: int = 2
    norm_eps: float = 1e-12
    act: str = "gelu"  # "gelu" (erf) | "gelu_tanh"
    pooler: bool = True
    pad_token_id: int = 0
    family: str = "bert"

    def __post_init__(self):
        one_of("act", self.act, ("gelu", "gelu_tanh"), expected="'gelu' or 'gelu_tanh'")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class EncoderOutput(NamedTuple):
    last_hidden_state: Tensor  # [B, T, d_model]
    pooler_output: Tensor | None  # [B, d_model] when the model has a pooler
    weights: tuple[Tensor, ...] | None  # per layer [B, n_heads, T, T] when need_weights


class EncoderMLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, approximate: str, *, device=None, dtype=None):
        super().__init__()
        self.approximate = approximate
        self.up_proj = nn.Linear(d_model, d_ff, device=device, dtype=dtype)
        self.down_proj = nn.Linear(d_ff, d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.up_proj(x), approximate=self.approximate))


class EncoderLayer(nn.Module):
    """Post-norm block: x = attn_norm(x + attn(x)); x = mlp_norm(x + mlp(x))."""

    def __init__(self, cfg: EncoderConfig, *, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=True, **factory)
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **factory)
        self.mlp = EncoderMLP(cfg.d_model, cfg.d_ff, "tanh" if cfg.act == "gelu_tanh" else "none", **factory)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **factory)

    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None, head_gates: Tensor | None,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        out, weights = self.attn(x, key_padding_mask=key_padding_mask, head_gates=head_gates,
                                 need_weights=need_weights)
        x = self.attn_norm(x + out)
        x = self.mlp_norm(x + self.mlp(x))
        return x, weights


class Encoder(nn.Module):
    """A BERT-family encoder; `layers[i].attn` is a headcount.MultiHeadAttention."""

    def __init__(self, config: EncoderConfig, *, device=None, dtype=None):
        super().__init__()
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(config.vocab_size, config.d_model, **factory)
        self.pos_embed = nn.Embedding(config.max_position, config.d_model, **factory)
        self.type_embed = nn.Embedding(config.type_vocab_size, config.d_model, **factory)
        self.embed_norm = nn.LayerNorm(config.d_model, eps=config.norm_eps, **factory)
        self.layers = nn.ModuleList(EncoderLayer(config, **factory) for _ in range(config.n_layers))
        self.pooler = nn.Linear(config.d_model, config.d_model, **factory) if config.pooler else None
        self.tokenizer = None  # set by the loaders
        self.name = None

    @property
    def attentions(self) -> list[MultiHeadAttention]:
        return [layer.attn for layer in self.layers]

    @property
    def max_position(self) -> int:
        return self.config.max_position

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, head_gates=None, need_weights: bool = False) -> EncoderOutput:
        """input_ids [B, T] -> EncoderOutput(last_hidden_state [B, T, d], pooler_output, weights)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected shape [B, T], got {list(input_ids.shape)}")
        batch, length = input_ids.shape
        if length > self.config.max_position:
            raise ValueError(f"sequence of {length} tokens is past the model's context of "
                             f"{self.config.max_position} tokens")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(length, device=input_ids.device)
        x = self.embed(input_ids) + self.type_embed(token_type_ids) + self.pos_embed(positions)
        x = self.embed_norm(x)
        key_padding_mask = None
        if attention_mask is not None:
            key_padding_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.bool()
        gates = layer_gates(head_gates, len(self.layers))
        weights = [] if need_weights else None
        for layer, gate in zip(self.layers, gates):
            x, w = layer(x, key_padding_mask=key_padding_mask, head_gates=gate, need_weights=need_weights)
            if need_weights:
                weights.append(w)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None
        return EncoderOutput(x, pooled, tuple(weights) if need_weights else None)

    def embed_sentences(self, texts, *, normalize: bool = True) -> Tensor:
        """Sentence embeddings [N, d] by mean pooling over real tokens (sentence-transformers' recipe
        for all-MiniLM-L6-v2), L2-normalised by default. Needs a tokenizer."""
        return mean_pool_sentences(self, texts, normalize=normalize)


def mean_pool_sentences(model, texts, *, normalize: bool = True) -> Tensor:
    """Mean of `model(ids, mask).last_hidden_state` over each text's real tokens [N, d] (L2-normalised
    by default): Encoder.embed_sentences and BidirectionalEncoder.embed_sentences. Needs a tokenizer."""
    if model.tokenizer is None:
        raise ValueError("embed_sentences: this model has no tokenizer")
    ids, mask = model.tokenizer.batch(list(texts))
    ids, mask = ids.to(model.embed.weight.device), mask.to(model.embed.weight.device)
    with torch.no_grad():
        hidden = model(ids, mask).last_hidden_state
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, dim=-1) if normalize else pooled


class BidirectionalEncoder(DecoderStack):
    """A decoder's stack run without the causal mask, as an encoder (transformers' Gemma 3 with
    `use_bidirectional_attention`: EmbeddingGemma). No lm_head and no cache; its output is the last
    hidden states, with the Encoder's contract: `model(input_ids, attention_mask).last_hidden_state`.

    Sliding-window layers attend keys with |p - j| < config.sliding_window (both sides).
    """

    def __init__(self, config: DecoderConfig, *, device=None, dtype=None):
        if config.causal:
            raise ValueError("config.causal is True: a causal model is a Decoder")
        super().__init__(config, device=device, dtype=dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, head_gates=None, need_weights: bool = False) -> EncoderOutput:
        """input_ids [B, T] -> EncoderOutput(last_hidden_state [B, T, d], None, weights).
        token_type_ids is accepted for the Encoder's signature and must be None or all zeros."""
        if token_type_ids is not None and bool(token_type_ids.ne(0).any()):
            raise ValueError("token_type_ids: this model has no token types (pass None)")
        x, weights = self._hidden(input_ids, cache=None, attention_mask=attention_mask, position_ids=None,
                                  head_gates=head_gates, need_weights=need_weights)
        return EncoderOutput(x, None, tuple(weights) if need_weights else None)

    def embed_sentences(self, texts, *, normalize: bool = True) -> Tensor:
        """Sentence embeddings [N, d] by mean pooling the last hidden states over real tokens,
        L2-normalised by default (sentence-transformers' projection layers, if any, are not applied)."""
        return mean_pool_sentences(self, texts, normalize=normalize)
