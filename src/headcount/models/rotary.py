"""Rotary position embedding (RoPE), applied to q and k through MultiHeadAttention's `qk_transform` hook.

Convention: the "rotate half" layout of transformers' Llama / Qwen2 / GPT-NeoX (not the interleaved
pairs of the original paper, nor llama.cpp's GGUF layout, which the GGUF loader undoes). For head
dimension d and position p, pair (i, i + d/2) is rotated by the angle p * theta^(-2i/d):

    x' = x * cos + rotate_half(x) * sin,    rotate_half([x1, x2]) = [-x2, x1]

The cos / sin tables are computed once, for every position up to `max_position`, in float32 exactly
as transformers computes them (so the two agree bit for bit). They stay float32 when the model moves
to another dtype; a forward call in bf16/fp16 casts the rows it uses, as transformers does.
`rotate_half(x) * sin` is computed as `roll(x, d/2) * sin_signed` with the sign folded into the table
(sin_signed = [-sin, sin]): one op fewer per tensor, the same bits ((-a) * b == -(a * b) in IEEE).

Partial rotary (`rotary_dim` < head_dim; GPT-NeoX / Pythia's rotary_pct, Phi's partial_rotary_factor):
only the first rotary_dim dims of each head rotate, with frequencies theta^(-2i/rotary_dim) (transformers
builds inv_freq over dim = int(head_dim * factor)); the other head_dim - rotary_dim dims pass through.
"""

from __future__ import annotations

import torch
from torch import nn

Tensor = torch.Tensor


def inverse_frequencies(head_dim: int, theta: float) -> Tensor:
    """theta^(-2i/d) for i < d/2, float32, computed the way transformers computes it."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def rotary_tables(head_dim: int, n_positions: int, theta: float, device=None, *,
                  linear_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """(cos, sin_signed), each [n_positions, head_dim] float32; sin_signed = [-sin | sin] by halves.
    linear_factor: transformers' "linear" rope scaling (inv_freq / factor, i.e. positions / factor)."""
    inv_freq = inverse_frequencies(head_dim, theta)
    if linear_factor != 1.0:
        inv_freq /= linear_factor
    positions = torch.arange(n_positions, dtype=torch.int64).to(torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # (P, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, d)
    half = head_dim // 2
    sin = emb.sin()
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return emb.cos().to(device), sin_signed.to(device)


class RotaryEmbedding(nn.Module):
    """Precomputed cos / sin tables [P, head_dim] and the hook that applies them.

    `hook(start, length)` returns a `qk_transform` for tokens at positions start .. start+length-1
    (with a KV cache, start = cache.length); `hook(position_ids=...)` takes explicit positions [B, T]
    (left-padded batches). One hook serves every layer of one forward call.

    The tables cover min(max_position, 4096) positions at first and grow (doubling) on demand, up to
    max_position: a 128k-context model does not pay 128 MB of tables it never uses.
    """

    INITIAL_POSITIONS = 4096

    def __init__(self, head_dim: int, max_position: int, theta: float = 10000.0, *, linear_factor: float = 1.0,
                 rotary_dim: int | None = None, device=None):
        super().__init__()
        full = rotary_dim is None or rotary_dim == head_dim
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or not 0 < rotary_dim <= head_dim \
                or rotary_dim % 2:
            raise ValueError(f"rotary_dim: expected an even int in (0, head_dim={head_dim}], got {rotary_dim!r}")
        if full and head_dim % 2:
            raise ValueError(f"head_dim: rotary embedding needs an even head_dim, got {head_dim}")
        if not linear_factor > 0:
            raise ValueError(f"linear_factor: expected a positive float, got {linear_factor!r}")
        self.head_dim, self.max_position, self.theta = head_dim, max_position, float(theta)
        self.linear_factor = float(linear_factor)
        self.rotary_dim = rotary_dim  # the first rotary_dim dims of each head rotate; the rest pass through
        cos, sin_signed = rotary_tables(rotary_dim, min(max_position, self.INITIAL_POSITIONS), theta, device,
                                        linear_factor=self.linear_factor)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin_signed", sin_signed, persistent=False)

    def _rebuild(self, n_positions: int) -> None:
        self.cos, self.sin_signed = rotary_tables(self.rotary_dim, n_positions, self.theta, self.cos.device,
                                                  linear_factor=self.linear_factor)

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) must not round the tables: keep them float32, follow the device.
        out = super()._apply(fn, recurse)
        if self.cos.dtype != torch.float32:
            self._rebuild(self.cos.shape[0])
        return out

    def extra_repr(self) -> str:
        scaled = f", linear_factor={self.linear_factor:g}" if self.linear_factor != 1.0 else ""
        if self.rotary_dim != self.head_dim:
            scaled += f", rotary_dim={self.rotary_dim}"
        return f"head_dim={self.head_dim}, max_position={self.max_position}, theta={self.theta:g}{scaled}"

    def _apply_rotary(self, cos: Tensor, sin: Tensor, x: Tensor) -> Tensor:
        rd = self.rotary_dim
        if rd != self.head_dim:  # partial: rotate x[..., :rd], pass x[..., rd:] through
            return torch.cat((self._rotate(cos, sin, x[..., :rd]), x[..., rd:]), dim=-1)
        return self._rotate(cos, sin, x)

    def _rotate(self, cos: Tensor, sin: Tensor, x: Tensor) -> Tensor:
        rolled = torch.roll(x, shifts=x.shape[-1] // 2, dims=-1)  # [x2, x1]
        return torch.addcmul(x * cos, rolled, sin)

    def hook(self, start: int = 0, length: int | None = None, *, position_ids: Tensor | None = None,
             dtype: torch.dtype = torch.float32):
        """A qk_transform for MultiHeadAttention: (q [B, nh, T, d], k [B, nkv, T, d]) -> rotated (q, k)."""
        if position_ids is not None:
            if position_ids.dim() != 2:
                raise ValueError(f"position_ids: expected shape [B, T], got {list(position_ids.shape)}")
            end = int(position_ids.max()) + 1 if position_ids.numel() else 0
        else:
            if length is None:
                raise ValueError("hook: give length (with start) or position_ids")
            end = start + length
        if end > self.max_position:
            raise ValueError(f"position {end - 1} is past the model's context of {self.max_position} tokens")
        if end > self.cos.shape[0]:
            self._rebuild(min(self.max_position, max(end, 2 * self.cos.shape[0])))
        if position_ids is not None:
            cos = self.cos[position_ids].unsqueeze(1)  # (B, 1, T, d)
            sin = self.sin_signed[position_ids].unsqueeze(1)
        else:
            cos = self.cos[start:end]  # (T, d), broadcasts over (B, heads)
            sin = self.sin_signed[start:end]
        if dtype != cos.dtype:
            cos, sin = cos.to(dtype), sin.to(dtype)

        def qk_transform(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            return self._apply_rotary(cos, sin, q), self._apply_rotary(cos, sin, k)

        return qk_transform


def apply_rotary_reference(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """The textbook formula, for tests: x [..., T, d] rotated at `positions` [T] with rotate_half."""
    d = x.shape[-1]
    inv_freq = inverse_frequencies(d, theta).to(torch.float64)
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.double() * emb.cos() + rotated.double() * emb.sin()).to(x.dtype)
