"""Continuous batching: many prompts through at most `batch_size` live rows, a finished row's place taken
by the next prompt, so a batch never waits on its longest answer.

    live rows, right-aligned in one KV cache of width W:   row r holds its n_r tokens in columns W - n_r .. W - 1
    a decode step:       [B_live, 1] tokens, position n_r each, mask: the last n_r + 1 of W + 1 columns
    a row finishes:      it leaves the cache (KVCache.select_rows) and its result is handed back at once
    admitting prompts:   as soon as a row is free, the next prompts no longer than W are prefilled together
                         (left-padded among themselves) and written into the rows the cache's storage has spare,
                         right-aligned at W: no copy of the live rows. A longer prompt waits until a quarter of
                         the rows are free; then one new cache of width max(n_r, prompt lengths) takes the live
                         rows' last columns and the new rows' prefill, all right-aligned

A prefix every prompt shares (a chat template's system turn and the instruction before each problem) is
prefilled once: its keys are copied into each new row's cache, and only the rows' own suffixes run through the
model (prefill cache [B, W]: the prefix, the suffixes left-padded among themselves; the merge places each row's
prefix right before its suffix).

Right alignment keeps each row's keys contiguous and ending at the current column, so one forward serves
rows of any age; positions come from each row's own count, so its tokens are those it gets alone (batched.py's
equality, up to the float rounding of batched products). Models whose keys depend on the column (a
sliding-window ring buffer) or on the whole batch's length (LongRoPE's switch) use batched.py instead.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import torch

from headcount.arguments import positive_int
from headcount.models.batched import _picker, _stopped_by, prepared
from headcount.models.packing import packed, whole_when_memory_allows
from headcount.models.prompting import GenerationResult

Tensor = torch.Tensor


def supports_continuous(model) -> bool:
    """True when every layer's cache is a plain KVCache and rotary has no length-dependent switch."""
    rotary = getattr(model, "rotary", None)
    if rotary is not None and getattr(rotary, "_long_inv_freq", None) is not None:
        return False
    return all(getattr(layer.attn, "sliding_window", None) is None for layer in model.layers)


class _Rows:
    """The live rows: prompt index, tokens cached (n), the token to feed next, generated ids, timings."""

    def __init__(self):
        self.index: list[int] = []
        self.n: list[int] = []
        self.next: list[int] = []
        self.new: list[list[int]] = []
        self.started: list[float] = []

    def __len__(self) -> int:
        return len(self.index)

    def keep(self, slots: list[int]) -> None:
        for name in ("index", "n", "next", "new", "started"):
            setattr(self, name, [getattr(self, name)[s] for s in slots])


def generate_many(model, prompts: Sequence, max_new_tokens: int = 64, *, batch_size: int = 8,
                  temperature: float = 0.0, top_k: int | None = None, seed: int | None = None,
                  stop_at_eos: bool = True, stop: Sequence[str] | str | None = None,
                  on_result: Callable[[int, GenerationResult], None] | None = None) -> list[GenerationResult]:
    """One GenerationResult per prompt, in order; on_result(i, result) as each prompt finishes."""
    results: list[GenerationResult | None] = [None] * len(prompts)
    for i, result in stream_many(model, prompts, max_new_tokens, batch_size=batch_size, temperature=temperature,
                                 top_k=top_k, seed=seed, stop_at_eos=stop_at_eos, stop=stop):
        results[i] = result
        if on_result is not None:
            on_result(i, result)
    return results  # type: ignore[return-value]


def stream_many(model, prompts: Sequence, max_new_tokens: int = 64, *, batch_size: int = 8,
                temperature: float = 0.0, top_k: int | None = None, seed: int | None = None,
                stop_at_eos: bool = True, stop=None) -> Iterator[tuple[int, GenerationResult]]:
    """(prompt index, GenerationResult) as each row finishes (see the module docstring)."""
    positive_int("batch_size", batch_size)
    if not supports_continuous(model):
        raise ValueError("model: its sliding-window or LongRoPE layers need generate(model, [prompts]) "
                         "(models/batched.py), not continuous batching")
    rows, stop, generator = prepared(model, prompts, max_new_tokens, temperature, top_k, seed, stop)
    with torch.inference_mode(), packed(model, max_bytes=whole_when_memory_allows(model)):
        yield from _run(model, rows, max_new_tokens, batch_size, _picker(temperature, top_k, generator),
                        model.config.eos_token_id if stop_at_eos else None, stop)


MIN_SHARED = 8  # tokens: a shorter common prefix is not worth its copies
# columns a rebuilt cache holds past its widest row: a rebuild allocates batch x (width + GROWTH) per layer, and a
# full cache is rebuilt wider at the loop's top. With the whole token budget as room (2,048 for the makers' eval
# format), 32 rows of a 24-layer model allocate and copy ~2 GB at every admission; most rows stop long before.
GROWTH = 256


def shared_prefix(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row shares, leaving each row at least one token of its own (its last
    token's logits choose its first new token)."""
    first, n = rows[0], min(len(r) for r in rows) - 1
    for r in rows[1:]:
        n = next((i for i in range(n) if r[i] != first[i]), n)
    return n


class _Prefix:
    """The shared prefix's keys and values, one [1, n_kv_heads, n, head_dim] pair per layer, computed once."""

    def __init__(self, model, ids: list[int]):
        self.n = len(ids)
        self.cache = model.new_cache(1, self.n)
        device = model.embed.weight.device
        model(torch.tensor([ids], dtype=torch.long, device=device), cache=self.cache, compute_logits=False)


def _prefill(model, rows: list[list[int]], pick, prefix: _Prefix | None = None) -> tuple[list, list[int]]:
    """The new rows' caches and their first tokens. Without a prefix the rows are left-padded among themselves;
    with one, each row's cache holds [the prefix, padding, the row's suffix] (see _merged_cache)."""
    device = model.embed.weight.device
    p = prefix.n if prefix is not None else 0
    tails = [r[p:] for r in rows]
    width = max(len(t) for t in tails)
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), p + width), dtype=torch.bool, device=device)
    mask[:, :p] = True
    for i, t in enumerate(tails):
        ids[i, width - len(t):] = torch.tensor(t, dtype=torch.long)
        mask[i, p + width - len(t):] = True
    padded = not bool(mask.all())
    cache = model.new_cache(len(rows), p + width)
    if prefix is not None:
        for layer_cache, shared in zip(cache, prefix.cache):
            layer_cache.k[:, :, :p] = shared.k[:, :, :p]
            layer_cache.v[:, :, :p] = shared.v[:, :, :p]
            layer_cache.length = p
    positions = (mask[:, p:].cumsum(1) - 1).clamp(min=0) + p if padded else None
    logits = model(ids, cache=cache, attention_mask=mask if padded else None, position_ids=positions,
                   last_only=True).logits[:, -1]
    return cache, pick(logits).tolist()


def _write_new(cache, first: int, new, new_n: list[int], prefix: int, width: int) -> None:
    """The new rows' prefill (one layer's cache, [prefix | padding | suffix] when prefix > 0) written into rows
    first.. of `cache`, each row's tokens ending at column width - 1: the suffix block to the right edge, then
    each row's prefix right before its own suffix (over the padding's columns)."""
    b, cols = new.batch_size, max(new_n) - prefix
    cache.k[first:first + b, :, width - cols:width] = new.k[:, :, prefix:prefix + cols]
    cache.v[first:first + b, :, width - cols:width] = new.v[:, :, prefix:prefix + cols]
    for j, n in enumerate(new_n if prefix else ()):
        at = width - n  # the row's first column
        cache.k[first + j, :, at:at + prefix] = new.k[j, :, :prefix]
        cache.v[first + j, :, at:at + prefix] = new.v[j, :, :prefix]


def _merged_cache(model, old, old_n: list[int], new, new_n: list[int], room: int, prefix: int = 0,
                  rows: int = 0):
    """One cache per layer: the old rows' last max(old_n) columns and the new rows' prefill, right-aligned.

    new_n: each new row's token count. With a shared prefix of `prefix` tokens the new rows' prefill cache is
    [prefix | padding | suffix] (see _write_new). rows: storage for at least this many rows, the ones past the
    live rows spare (KVCache.extend_rows), so later prompts are admitted without a rebuild."""
    width = max([*old_n, *new_n])
    capacity = min(width + room, model.config.max_position)
    keep = max(old_n, default=0)
    merged = []
    for i, layer in enumerate(model.layers):
        batch = (old[i].batch_size if old is not None and old_n else 0) + (new[i].batch_size if new else 0)
        cache = layer.attn.new_cache(max(batch, rows), capacity)
        if cache.batch_size > batch:
            cache.select_rows(torch.arange(batch, device=cache.k.device))  # in place: the rest stays spare
        row = 0
        if old is not None and old_n:
            b = old[i].batch_size
            cache.k[:b, :, width - keep:width] = old[i].k[:, :, old[i].length - keep:old[i].length]
            cache.v[:b, :, width - keep:width] = old[i].v[:, :, old[i].length - keep:old[i].length]
            row = b
        if new is not None:
            _write_new(cache, row, new[i], new_n, prefix, width)
        cache.length = width
        merged.append(cache)
    return merged


def _placed(cache, new, new_n: list[int], prefix: int) -> None:
    """The new rows' prefill written into each layer's spare rows, right-aligned at the cache's width."""
    width = cache[0].length
    for layer_cache, src in zip(cache, new):
        first = layer_cache.batch_size
        layer_cache.extend_rows(src.batch_size)
        _write_new(layer_cache, first, src, new_n, prefix, width)


def _run(model, rows, max_new_tokens, batch_size, pick, eos, stop) -> Iterator[tuple[int, GenerationResult]]:
    device = model.embed.weight.device
    tokenizer = model.tokenizer
    tail = max((len(s) for s in stop), default=0) + 2
    pending = list(range(len(rows)))
    live, cache = _Rows(), None
    admit_at = max(1, batch_size // 4)  # free slots that make a prefill + cache rebuild worth its copy
    p = shared_prefix(rows) if len(rows) > 1 else 0
    prefix = _Prefix(model, rows[0][:p]) if p >= MIN_SHARED else None

    def finish(slot: int, reason: str, hit: str | None) -> tuple[int, GenerationResult]:
        index, new = live.index[slot], live.new[slot]
        text = tokenizer.decode(new) if tokenizer is not None else None
        if hit is not None:
            text = text[:text.find(hit)]
        now = time.perf_counter()
        result = GenerationResult(rows[index], new, text, 0.0, now - live.started[slot],
                                  stopped_at_eos=reason == "eos", finish_reason=reason, stop_string=hit)
        return index, result

    def placeable(free: int) -> bool:  # the next prompts fit the live cache: spare rows, none wider than it
        take = pending[:free]
        return bool(take) and cache is not None and bool(live) and cache[0].spare_rows() >= len(take) and \
            cache[0].length + 1 <= cache[0].max_len and max(len(rows[i]) for i in take) <= cache[0].length

    while pending or live:
        free = batch_size - len(live)
        room_left = cache is None or cache[0].length + 1 > cache[0].max_len
        in_place = placeable(free)
        if in_place or pending and (free >= admit_at or not live) or (live and room_left):
            take, pending = pending[:free], pending[free:]
            new_cache, first = _prefill(model, [rows[i] for i in take], pick, prefix) if take else (None, [])
            t0 = time.perf_counter()
            new_n, p = [len(rows[i]) for i in take], prefix.n if prefix is not None else 0
            if in_place:
                _placed(cache, new_cache, new_n, p)
            else:
                cache = _merged_cache(model, cache, live.n, new_cache, new_n, min(max_new_tokens, GROWTH), p,
                                      rows=batch_size)
            live.index += take
            live.n += new_n
            live.next += first
            live.new += [[t] for t in first]
            live.started += [t0] * len(take)
        # the tokens just chosen (by the prefill or the last step) may end their rows
        done, keep = [], []
        for slot, token in enumerate(live.next):
            new = live.new[slot]
            if eos is not None and token == eos:
                done.append(finish(slot, "eos", None))
            elif stop and (hit := _stopped_by(tokenizer, new, stop, tail)) is not None:
                done.append(finish(slot, "stop", hit))
            elif len(new) >= max_new_tokens:
                done.append(finish(slot, "length", None))
            else:
                keep.append(slot)
        yield from done
        if len(keep) < len(live):
            live.keep(keep)
            index = torch.tensor(keep, dtype=torch.long, device=device)
            for layer_cache in cache:
                layer_cache.select_rows(index)
        if not live:
            cache = None
            continue
        if pending and (batch_size - len(live) >= admit_at or placeable(batch_size - len(live))):
            continue  # admit before the next step
        if cache[0].length + 1 > cache[0].max_len:
            continue  # rebuild the cache narrower (the loop's top)
        width = cache[0].length + 1
        n = torch.tensor(live.n, device=device)
        mask = torch.arange(width, device=device)[None, :] >= (width - (n + 1))[:, None]  # (B, W + 1)
        step = torch.tensor(live.next, dtype=torch.long, device=device)[:, None]
        logits = model(step, cache=cache, attention_mask=mask, position_ids=n[:, None], last_only=True).logits[:, -1]
        chosen = pick(logits).tolist()
        live.n = [x + 1 for x in live.n]
        live.next = chosen
        for slot, token in enumerate(chosen):
            live.new[slot].append(token)
