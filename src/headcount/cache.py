"""KVCache: the keys and values of past tokens, [B, n_kv_heads, max_len, head_dim] — n_kv_heads, not
n_heads, which is the whole point of GQA and MQA (chapter 2.3.7).

Like gpt-fast's cache it only index-assigns into preallocated storage; nothing is concatenated.

SlidingKVCache (what new_cache() gives a module with a sliding_window) keeps only the last `window`
tokens, in a ring buffer: storage [B, n_kv_heads, min(max_len, window), head_dim], while `length`
keeps counting every token seen (the decoder takes rotary positions from it).
"""

from __future__ import annotations

import weakref

import torch

from headcount.arguments import positive_int

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
            positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._store = (self.k, self.v)  # the whole storage: select_rows may leave k, v views of its first rows
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

    def append_held(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, slice | Tensor | None]:
        """append(), plus where the returned keys sit among the `length` tokens seen: None when they
        are all of them, in order (always, here); see SlidingKVCache."""
        k, v = self.append(k, v)
        return k, v, None

    def select_rows(self, index: Tensor) -> None:
        """Keep only the batch rows `index` (1-D long), in that order: batched generation drops the rows
        that finished, so they cost no more compute.

        Rows kept in increasing order (what finishing rows leave) move down within the same storage and k, v
        become views of its first len(index) rows: no allocation, so a decode loop that drops a row every few
        steps neither copies nor page-faults a whole new cache. Any other order is gathered into new storage."""
        if not isinstance(index, Tensor) or index.dim() != 1 or index.dtype != torch.long:
            raise ValueError(f"index: expected a 1-D long tensor of batch rows, got {index!r}")
        rows = index.tolist()
        if rows and not (0 <= min(rows) and max(rows) < self.batch_size):
            raise ValueError(f"index: expected rows in 0..{self.batch_size - 1}, got {rows}")
        if all(a < b for a, b in zip(rows, rows[1:])):
            for new, old in enumerate(rows):  # new <= old: each row is read before anything overwrites it
                if new != old:
                    self.k[new].copy_(self.k[old])
                    self.v[new].copy_(self.v[old])
            self.k, self.v = self.k[:len(rows)], self.v[:len(rows)]
            return
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)
        self._store = (self.k, self.v)

    def spare_rows(self) -> int:
        """Rows of the storage past batch_size that select_rows left behind (extend_rows takes them back)."""
        store_k, store_v = self._store
        if self.k.data_ptr() != store_k.data_ptr() or self.v.data_ptr() != store_v.data_ptr():
            return 0  # k, v replaced from outside: no storage known past them
        return store_k.shape[0] - self.batch_size

    def extend_rows(self, n: int) -> None:
        """Take back n rows of the storage past batch_size (see spare_rows): continuous batching writes a new
        prompt's keys there instead of rebuilding the cache. Their contents are stale until the caller writes them."""
        positive_int("n", n)
        if n > self.spare_rows():
            raise ValueError(f"n: expected at most {self.spare_rows()} rows (the storage's spare rows), got {n}")
        rows = self.batch_size + n
        self.k, self.v = self._store[0][:rows], self._store[1][:rows]

    def reset(self) -> None:
        """Forget every cached token (the storage is kept and overwritten)."""
        self.length = 0

    def truncate(self, length: int) -> None:
        """Keep only the first `length` tokens (to roll back a speculative step)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length: expected 0 <= length <= {self.length}, got {length}")
        self.length = length


class SlidingKVCache(KVCache):
    """A KVCache for a sliding-window module: a ring buffer of the last `window` tokens.

    k, v: [batch_size, n_kv_heads, capacity, head_dim], capacity = min(max_len, window); slot s holds
    the latest position p with p % capacity == s. `length` counts every token seen (absolute
    positions), `max_len` bounds it, and nbytes = 2 * batch_size * n_kv_heads * capacity * head_dim *
    itemsize: the storage, exactly.

    append_held(k, v) for T new tokens at positions p0 = length .. p0 + T - 1 returns the keys those
    queries can see (and where they sit):
    - nothing evicted yet (p0 + T <= capacity): views of slots 0 .. p0 + T - 1, which are positions;
    - one token (decoding): it overwrites the oldest slot; the whole ring is returned, in slot order,
      with each slot's position. Every slot is within the new query's window, so the order does not
      matter (softmax is a sum over keys); only masks given by position are gathered to match;
    - several tokens past the ring (a prefill longer than the window, or a chunk after one): a
      temporary [B, n_kv_heads, min(p0, window - 1) + T, head_dim] of the window before p0 and the new
      tokens, in order (positions p0 - min(p0, window - 1) ..); then the last tokens go into the ring.
    """

    def __init__(self, batch_size: int, max_len: int, n_kv_heads: int, head_dim: int, *, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None, owner=None):
        positive_int("window", window)
        positive_int("max_len", max_len)
        super().__init__(batch_size, min(max_len, window), n_kv_heads, head_dim, dtype=dtype, device=device,
                         owner=owner)
        self.window = window
        self._max_len = max_len

    @property
    def max_len(self) -> int:
        return self._max_len

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def __repr__(self) -> str:
        return (f"SlidingKVCache(batch_size={self.batch_size}, n_kv_heads={self.n_kv_heads}, window={self.window}, "
                f"capacity={self.capacity}, max_len={self.max_len}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"length={self.length}, nbytes={self.nbytes})")

    def check(self, module, *, batch_size: int, new_tokens: int) -> None:
        if getattr(module, "sliding_window", None) != self.window:
            raise ValueError(f"cache: this SlidingKVCache keeps a window of {self.window} tokens, but the module's "
                             f"sliding_window is {getattr(module, 'sliding_window', None)}; make a new cache with "
                             "the module's new_cache()")
        super().check(module, batch_size=batch_size, new_tokens=new_tokens)

    def _slots(self, positions: Tensor) -> Tensor:
        return positions % self.capacity

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values the new queries can see (see the class docstring for their order)."""
        k, v, _ = self.append_held(k, v)
        return k, v

    def append_held(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, slice | Tensor | None]:
        new = k.shape[2]
        self._check_room(new)
        start, end, cap = self.length, self.length + new, self.capacity
        if end <= cap:  # nothing evicted yet: slot == position
            return (*KVCache.append(self, k, v), None)
        device = self.k.device
        if new == 1:  # decoding: overwrite the oldest slot; every slot is inside this query's window
            slot = start % cap
            self.k[:, :, slot] = k[:, :, 0]
            self.v[:, :, slot] = v[:, :, 0]
            self.length = end
            last = end - 1
            positions = last - (last - torch.arange(cap, device=device)) % cap  # (cap,) slot -> position
            return self.k, self.v, positions
        keep = min(start, self.window - 1)  # the window before the first new query
        old = self._slots(torch.arange(start - keep, start, device=device))
        k_all = torch.cat([self.k.index_select(2, old), k], dim=2)  # (B, nkv, keep + T, dh), in order
        v_all = torch.cat([self.v.index_select(2, old), v], dim=2)
        stored = min(new, cap)  # gathered first: these writes may overwrite slots just read
        slots = self._slots(torch.arange(end - stored, end, device=device))
        self.k.index_copy_(2, slots, k[:, :, new - stored:].to(self.dtype))
        self.v.index_copy_(2, slots, v[:, :, new - stored:].to(self.dtype))
        self.length = end
        return k_all, v_all, slice(start - keep, end)

    def truncate(self, length: int) -> None:
        """Roll back to `length` tokens, when the ring still holds the window that length needs."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length: expected 0 <= length <= {self.length}, got {length}")
        oldest_held = max(0, self.length - self.capacity)
        if length and max(0, length - self.window + 1) < oldest_held:
            raise ValueError(f"length: a SlidingKVCache of window {self.window} at {self.length} tokens no longer "
                             f"holds the keys before position {oldest_held}; it can roll back to >= "
                             f"{oldest_held + self.window - 1} tokens (or 0), got {length}")
        self.length = length


class EmptyKVCache(KVCache):
    """The cache of a layer with no attention (a dropped attention sublayer): k, v are
    [batch_size, 0, max_len, head_dim], so nbytes is 0, and `length` still counts the tokens seen, because the
    decoder takes the next position from cache[0].length whichever layer is first. Rows are selected, reset and
    truncated like any cache's (batched and continuous generation treat every layer's cache alike)."""

    def __init__(self, batch_size: int, max_len: int, head_dim: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        for name, value in (("batch_size", batch_size), ("max_len", max_len), ("head_dim", head_dim)):
            positive_int(name, value)
        shape = (batch_size, 0, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._store = (self.k, self.v)
        self.length = 0
        self._owner = None

    def __repr__(self) -> str:
        return f"EmptyKVCache(batch_size={self.batch_size}, max_len={self.max_len}, length={self.length}, nbytes=0)"

    def skip(self, new_tokens: int) -> None:
        """Count `new_tokens` more tokens (a layer without attention stores nothing for them)."""
        self._check_room(new_tokens)
        self.length += new_tokens
