"""Continuous batching: many prompts through at most `batch_size` live rows, a finished row's place taken
by the next prompt, so a batch never waits on its longest answer.

    live rows, right-aligned in one KV cache of width W:   row r holds its n_r tokens in columns W - n_r .. W - 1
    a decode step:       [B_live, 1] tokens, position n_r each, mask: the last n_r + 1 of W + 1 columns
    a row finishes:      it leaves the cache (KVCache.select_rows) and its result is handed back at once
    admitting prompts:   when a quarter of the rows are free, the next prompts are prefilled together (left-padded
                         among themselves), and one new cache of width max(n_r, prompt lengths) takes the live rows'
                         last columns and the new rows' prefill, all right-aligned

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


def _prefill(model, rows: list[list[int]], pick) -> tuple[list, list[int]]:
    """The new rows' caches (left-padded among themselves) and their first tokens."""
    device = model.embed.weight.device
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = True
    padded = not bool(mask.all())
    cache = model.new_cache(len(rows), width)
    positions = (mask.cumsum(1) - 1).clamp(min=0) if padded else None
    logits = model(ids, cache=cache, attention_mask=mask if padded else None, position_ids=positions,
                   last_only=True).logits[:, -1]
    return cache, pick(logits).tolist()


def _merged_cache(model, old, old_n: list[int], new, new_width: int, room: int):
    """One cache per layer: the old rows' last max(old_n) columns and the new rows' prefill, right-aligned."""
    width = max([*old_n, new_width])
    capacity = min(width + room, model.config.max_position)
    keep = max(old_n, default=0)
    merged = []
    for i, layer in enumerate(model.layers):
        parts = []
        if old is not None and old_n:
            parts.append((old[i], old[i].length - keep, keep))
        if new is not None:
            parts.append((new[i], 0, new_width))
        batch = sum(p[0].batch_size for p in parts)
        cache = layer.attn.new_cache(batch, capacity)
        row = 0
        for src, start, cols in parts:
            b = src.batch_size
            cache.k[row:row + b, :, width - cols:width] = src.k[:, :, start:start + cols]
            cache.v[row:row + b, :, width - cols:width] = src.v[:, :, start:start + cols]
            row += b
        cache.length = width
        merged.append(cache)
    return merged


def _run(model, rows, max_new_tokens, batch_size, pick, eos, stop) -> Iterator[tuple[int, GenerationResult]]:
    device = model.embed.weight.device
    tokenizer = model.tokenizer
    tail = max((len(s) for s in stop), default=0) + 2
    pending = list(range(len(rows)))
    live, cache = _Rows(), None
    admit_at = max(1, batch_size // 4)  # free slots that make a prefill + cache rebuild worth its copy

    def finish(slot: int, reason: str, hit: str | None) -> tuple[int, GenerationResult]:
        index, new = live.index[slot], live.new[slot]
        text = tokenizer.decode(new) if tokenizer is not None else None
        if hit is not None:
            text = text[:text.find(hit)]
        now = time.perf_counter()
        result = GenerationResult(rows[index], new, text, 0.0, now - live.started[slot],
                                  stopped_at_eos=reason == "eos", finish_reason=reason, stop_string=hit)
        return index, result

    while pending or live:
        free = batch_size - len(live)
        room_left = cache is None or cache[0].length + 1 > cache[0].max_len
        if pending and (free >= admit_at or not live) or (live and room_left):
            take, pending = pending[:free], pending[free:]
            new_cache, first = _prefill(model, [rows[i] for i in take], pick) if take else (None, [])
            t0 = time.perf_counter()
            cache = _merged_cache(model, cache, live.n, new_cache,
                                  max((len(rows[i]) for i in take), default=0), max_new_tokens)
            live.index += take
            live.n += [len(rows[i]) for i in take]
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
        if pending and batch_size - len(live) >= admit_at:
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
