"""Rotary position embedding (RoPE), applied to q and k through MultiHeadAttention's `qk_transform` hook.

Convention: the "rotate half" layout of transformers' Llama / Qwen2 / GPT-NeoX (not the interleaved
pairs of the original paper, nor llama.cpp's GGUF layout, which the GGUF loader undoes). For rotary
dimension r (= head_dim unless partial) and position p, pair (i, i + r/2) is rotated by p * inv_freq[i]:

    x' = x * cos + rotate_half(x) * sin,    rotate_half([x1, x2]) = [-x2, x1]

Partial rotary (`rotary_dim` < head_dim; GPT-NeoX / Pythia's rotary_pct, Phi's partial_rotary_factor):
only the first rotary_dim dims of each head rotate, with frequencies theta^(-2i/rotary_dim) (transformers
builds inv_freq over dim = int(head_dim * factor)); the other head_dim - rotary_dim dims pass through.

The inverse frequencies follow transformers' modeling_rope_utils (5.x) op for op, per rope type:
  default   theta^(-2i/r)
  linear    default / factor
  llama3    per frequency by wavelength 2 pi / inv_freq vs original_max / {high,low}_freq_factor: kept,
            divided by factor, or blended in between
  yarn      a ramp between interpolation (/ factor) and extrapolation over the dims beta_fast / beta_slow
            pick; cos and sin x attention_factor (default 0.1 ln(factor) + 1, or the mscale ratio)
  dynamic   NTK: theta x ((factor x L / max_pos) - (factor - 1)) ** (r / (r - 2)) for a sequence of L >
            max_pos tokens. headcount's context is max_position_embeddings and positions past it are
            refused, so L = max_pos always and the frequencies are the default ones (transformers too,
            below max_position_embeddings)
  longrope  theta^(-2i/r) / short_factor[i] while the call's last position + 1 <= original_max, else /
            long_factor[i]; cos and sin x attention_factor (default sqrt(1 + ln(factor) / ln(original_max)))

LongRoPE and a KV cache: transformers picks the factors per forward call from max(position_ids) + 1 (the
whole prompt at prefill, the one new token while decoding); keys already cached keep the rotation they got.
`hook` does the same (it picks by the call's last position), so a forward call with a cache that crosses
original_max would mix short-factor keys with long-factor ones. transformers' Phi3 generate() avoids that
by dropping its cache at the first token past original_max and running the whole sequence again; headcount's
generate() does the same (`refills_cache`), so generation stays equal to a full forward on every token.

The cos / sin tables are computed once, for every position up to `max_position`, in float32 exactly
as transformers computes them (so the two agree bit for bit). They stay float32 when the model moves
to another dtype; a forward call in bf16/fp16 casts the rows it uses, as transformers does.
`rotate_half(x) * sin` is computed as `roll(x, r/2) * sin_signed` with the sign folded into the table
(sin_signed = [-sin, sin]): one op fewer per tensor, the same bits ((-a) * b == -(a * b) in IEEE).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from headcount.arguments import is_int, is_number, positive_float

Tensor = torch.Tensor

# rope types headcount computes (transformers' names); "linear" is DecoderConfig.rope_scaling
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# per rope type: (fields that must be given, fields that may be) in a rope_parameters block, beyond
# rope_type / type / rope_theta / partial_rotary_factor (transformers' validators' lists)
ROPE_FIELDS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
    "yarn": (("factor",), ("original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                          "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "long_factor"), ("original_max_position_embeddings", "attention_factor",
                                                   "factor")),
}


def inverse_frequencies(head_dim: int, theta: float) -> Tensor:
    """theta^(-2i/d) for i < d/2, float32, computed the way transformers computes it."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def _number(params: dict, key: str, rope_type: str, *, positive: bool = True, block: str = "rope_parameters") -> float:
    value = params.get(key)
    if not is_number(value) or (positive and not value > 0):
        raise ValueError(f"{block}.{key}: rope_type {rope_type!r} needs a {'positive ' if positive else ''}"
                         f"number, got {value!r}")
    return value


def check_rope(rope_type: str, params: dict, rotary_dim: int, *, block: str = "rope_parameters") -> None:
    """Raise ValueError naming the field when `params` (a rope_parameters block) lacks what rope_type needs,
    holds a field headcount does not read for it, or gives a factor list of the wrong length. block: the config
    key the fields are read from, as the message names it (an older config's rope_scaling)."""
    if rope_type not in ROPE_FIELDS:
        raise ValueError(f"{block}.rope_type: {rope_type!r} is not supported (headcount implements "
                         f"{', '.join(ROPE_TYPES)})")
    need, may = ROPE_FIELDS[rope_type]
    for key in need:
        if key not in params:
            raise ValueError(f"{block}.{key}: missing; rope_type {rope_type!r} needs {', '.join(need)}")
    extra = sorted(set(params) - set(need) - set(may) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    if extra:
        raise ValueError(f"{block}.{extra[0]}: not a field of rope_type {rope_type!r} (headcount reads "
                         f"{', '.join((*need, *may)) or 'only rope_theta'}) and will not ignore it")
    for key in ("short_factor", "long_factor"):
        if key in need:
            value = params[key]
            if (not isinstance(value, (list, tuple)) or len(value) != rotary_dim // 2
                    or not all(is_number(v) for v in value)):
                got = f"{len(value)} entries" if isinstance(value, (list, tuple)) else repr(value)
                raise ValueError(f"{block}.{key}: expected a list of {rotary_dim // 2} numbers (rotary_dim / 2), "
                                 f"got {got}")
    if rope_type in ("linear", "dynamic", "llama3") or (rope_type == "yarn" and params.get("factor") is not None):
        _number(params, "factor", rope_type, block=block)
    if rope_type == "llama3":
        low = _number(params, "low_freq_factor", rope_type, block=block)
        high = _number(params, "high_freq_factor", rope_type, block=block)
        if high == low:
            raise ValueError(f"{block}.high_freq_factor: equals low_freq_factor ({low}); llama3 divides by "
                             "their difference")


def rope_frequencies(rope_type: str, params: dict, rotary_dim: int, theta: float,
                     max_position: int) -> tuple[Tensor, float, Tensor | None, int | None]:
    """(inv_freq [rotary_dim/2] float32, attention_factor, long_inv_freq or None, original_max or None) of one
    rope type, as transformers computes them. params: the rope_parameters block (original_max_position_embeddings
    already resolved); max_position: max_position_embeddings."""
    check_rope(rope_type, params, rotary_dim)
    dim = rotary_dim
    shape = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    original = int(params.get("original_max_position_embeddings") or max_position)
    if rope_type in ("default", "linear"):
        inv = 1.0 / (theta ** shape)
        if rope_type == "linear":
            inv /= params["factor"]
        return inv, 1.0, None, None
    if rope_type == "dynamic":
        factor, seq_len = params["factor"], max_position  # positions past max_position are refused
        base = theta * ((factor * seq_len / max_position) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** shape), 1.0, None, None
    if rope_type == "llama3":
        inv = 1.0 / (theta ** shape)
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        low_wavelen, high_wavelen = original / low, original / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0, None, None
    if rope_type == "yarn":
        factor = params.get("factor")
        if factor is None:
            factor = max_position / original
        attention_factor = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
            else:
                attention_factor = get_mscale(factor)
        beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

        def correction_dim(rotations):
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = theta ** shape
        extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        keep = 1 - ramp  # the share of extrapolation per frequency
        return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor), None, None
    # longrope
    factor = params.get("factor")
    if factor is None:
        factor = max_position / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    base = theta ** shape
    short = 1.0 / (torch.tensor(params["short_factor"], dtype=torch.float32) * base)
    long = 1.0 / (torch.tensor(params["long_factor"], dtype=torch.float32) * base)
    return short, float(attention_factor), long, original


def rotary_tables(head_dim: int, n_positions: int, theta: float = 10000.0, device=None, *,
                  linear_factor: float = 1.0, inv_freq: Tensor | None = None,
                  attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """(cos, sin_signed), each [n_positions, r] float32 (r = 2 x len(inv_freq), head_dim by default);
    sin_signed = [-sin | sin] by halves, both x attention_factor (yarn / longrope) as transformers does.
    linear_factor: transformers' "linear" rope scaling (inv_freq / factor, i.e. positions / factor)."""
    if inv_freq is None:
        inv_freq = inverse_frequencies(head_dim, theta)
        if linear_factor != 1.0:
            inv_freq /= linear_factor
    positions = torch.arange(n_positions, dtype=torch.int64).to(torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # (P, r/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, r)
    half = inv_freq.shape[0]
    cos, sin = emb.cos(), emb.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.to(device), sin_signed.to(device)


class RotaryEmbedding(nn.Module):
    """Precomputed cos / sin tables [P, rotary_dim] and the hook that applies them.

    `hook(start, length)` returns a `qk_transform` for tokens at positions start .. start+length-1
    (with a KV cache, start = cache.length); `hook(position_ids=...)` takes explicit positions [B, T]
    (left-padded batches). One hook serves every layer of one forward call.

    rope_type / rope_parameters: transformers' rope types (see the module's notes); rotary_dim: rotate only
    the first rotary_dim dims of each head (partial rotary; default head_dim).

    The tables cover min(max_position, 4096) positions at first and grow (doubling) on demand, up to
    max_position: a 128k-context model does not pay 128 MB of tables it never uses.
    """

    INITIAL_POSITIONS = 4096

    def __init__(self, head_dim: int, max_position: int, theta: float = 10000.0, *, linear_factor: float = 1.0,
                 rope_type: str = "default", rope_parameters: dict | None = None, rotary_dim: int | None = None,
                 device=None):
        super().__init__()
        full = rotary_dim is None or rotary_dim == head_dim
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not is_int(rotary_dim) or not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            if full:
                raise ValueError(f"head_dim: rotary embedding needs an even head_dim, got {head_dim}")
            raise ValueError(f"rotary_dim: expected an even int in (0, head_dim={head_dim}], got {rotary_dim!r}")
        self.linear_factor = positive_float("linear_factor", linear_factor)
        self.head_dim, self.max_position, self.theta = head_dim, max_position, float(theta)
        self.rotary_dim = rotary_dim
        self.rope_type = rope_type
        self.rope_parameters = dict(rope_parameters or {})
        inv, self.attention_factor, long, self.switch_at = rope_frequencies(
            rope_type, self.rope_parameters, rotary_dim, self.theta, max_position)
        if rope_type == "default" and self.linear_factor != 1.0:
            inv = inv / self.linear_factor
        # plain float32 CPU tensors, not buffers: model.to(dtype) must not round them
        self._inv_freq, self._long_inv_freq = inv, long
        cos, sin_signed = self._tables(inv, min(max_position, self.INITIAL_POSITIONS), device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin_signed", sin_signed, persistent=False)
        self._long = None  # longrope's (cos, sin_signed) for calls past switch_at, built on first use

    def _tables(self, inv_freq: Tensor, n_positions: int, device) -> tuple[Tensor, Tensor]:
        # tables built lazily (longrope's long factors, growth past the first 4096 positions) may first be asked
        # for inside torch.inference_mode: built as inference tensors they would break every later call that
        # trains or takes gradients (prune's importance), so they are always built as normal tensors
        with torch.inference_mode(False):
            return rotary_tables(self.rotary_dim, n_positions, device=device, inv_freq=inv_freq,
                                 attention_factor=self.attention_factor)

    def _rebuild(self, n_positions: int) -> None:
        self.cos, self.sin_signed = self._tables(self._inv_freq, n_positions, self.cos.device)

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) must not round the tables: keep them float32, follow the device.
        out = super()._apply(fn, recurse)
        if self.cos.dtype != torch.float32:
            self._rebuild(self.cos.shape[0])
        self._long = None
        return out

    def extra_repr(self) -> str:
        scaled = f", linear_factor={self.linear_factor:g}" if self.linear_factor != 1.0 else ""
        kind = f", rope_type={self.rope_type}" if self.rope_type != "default" else ""
        part = f", rotary_dim={self.rotary_dim}" if self.rotary_dim != self.head_dim else ""
        return f"head_dim={self.head_dim}, max_position={self.max_position}, theta={self.theta:g}{scaled}{kind}{part}"

    def _apply_rotary(self, cos: Tensor, sin: Tensor, x: Tensor) -> Tensor:
        r = self.rotary_dim
        if r != self.head_dim:  # partial rotary: the first r dims turn, the rest pass
            return torch.cat((self._apply_rotary_full(cos, sin, x[..., :r]), x[..., r:]), dim=-1)
        return self._apply_rotary_full(cos, sin, x)

    def _apply_rotary_full(self, cos: Tensor, sin: Tensor, x: Tensor) -> Tensor:
        rolled = torch.roll(x, shifts=self.rotary_dim // 2, dims=-1)  # [x2, x1]
        return torch.addcmul(x * cos, rolled, sin)

    def refills_cache(self, cached: int) -> bool:
        """Whether the next decoded token (after `cached` tokens in the KV cache) is the first past
        original_max_position_embeddings of a LongRoPE model: generation then runs the whole sequence again,
        as transformers' Phi3 generate() does."""
        return self._long_inv_freq is not None and cached == self.switch_at

    def _long_tables(self, end: int) -> tuple[Tensor, Tensor]:
        """longrope's long-factor tables covering positions < end."""
        if self._long is None or self._long[0].shape[0] < end:
            n = min(self.max_position, max(end, self.INITIAL_POSITIONS))
            self._long = self._tables(self._long_inv_freq, n, self.cos.device)
        return self._long

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
        if self._long_inv_freq is not None and end > self.switch_at:
            # longrope: transformers switches to the long factors for a call whose max position + 1 passes
            # original_max_position_embeddings (see the module's notes on the KV cache)
            table_cos, table_sin = self._long_tables(end)
        else:
            if end > self.cos.shape[0]:
                self._rebuild(min(self.max_position, max(end, 2 * self.cos.shape[0])))
            table_cos, table_sin = self.cos, self.sin_signed
        if position_ids is not None:
            cos = table_cos[position_ids].unsqueeze(1)  # (B, 1, T, r)
            sin = table_sin[position_ids].unsqueeze(1)
        else:
            cos = table_cos[start:end]  # (T, r), broadcasts over (B, heads)
            sin = table_sin[start:end]
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
