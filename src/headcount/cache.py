"""KVCache: the keys and values of past tokens, [B, n_kv_heads, max_len, head_dim] — n_kv_heads, not
n_heads, which is the whole point of GQA and MQA (chapter 2.3.7).

Like gpt-fast's cache it only index-assigns into preallocated storage; nothing is concatenated.
"""

from __future__ import annotations

import weakref

import torch

Tensor = torch.Tensor


class KVCache:
    """Preallocated K/V storage for one attention module.

    k, v: [batch_size, n_kv_heads, max_len, head_dim]; `length` tokens are filled.
    nbytes = 2 * batch_size * n_kv_heads * max_len * head_dim * itemsize, exactly.
    """

    def __init__(self, batch_size: int, max_len: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None, owner=None):
        for name, value in (("batch_size", batch_size), ("max_len", max_len), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self._owner = weakref.ref(owner) if owner is not None else None

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def __repr__(self) -> str:
        return (f"KVCache(batch_size={self.batch_size}, n_kv_heads={self.n_kv_heads}, max_len={self.max_len}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, length={self.length}, nbytes={self.nbytes})")

    def check(self, module, *, batch_size: int, new_tokens: int) -> None:
        """Raise (changing nothing) unless `new_tokens` more tokens of this batch fit, for this module."""
        if self._owner is not None and self._owner() is not module:
            raise ValueError("cache: this KVCache was made by another MultiHeadAttention; "
                             "make one with this module's new_cache()")
        if (self.n_kv_heads, self.head_dim) != (module.n_kv_heads, module.head_dim):
            raise ValueError(f"cache: expected n_kv_heads={module.n_kv_heads}, head_dim={module.head_dim} "
                             f"(this module), got a cache with n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}"
                             " (was the module pruned after the cache was made?)")
        if batch_size != self.batch_size:
            raise ValueError(f"cache: expected inputs of batch size {self.batch_size} (the cache's), got {batch_size}")
        self._check_room(new_tokens)

    def _check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.max_len:
            raise ValueError(f"cache: appending {new_tokens} tokens to {self.length} cached would exceed "
                             f"max_len={self.max_len}; make a larger cache or reset() it")

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v [B, n_kv_heads, T, head_dim] after the cached tokens; return views of all of them."""
        self._check_room(k.shape[2])
        start, end = self.length, self.length + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reset(self) -> None:
        """Forget every cached token (the storage is kept and overwritten)."""
        self.length = 0

    def truncate(self, length: int) -> None:
        """Keep only the first `length` tokens (to roll back a speculative step)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length: expected 0 <= length <= {self.length}, got {length}")
        self.length = length
