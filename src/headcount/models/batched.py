"""Batched generation: several prompts through one forward per step and one KV cache.

    prompts (B rows of L_b tokens) -> ids [B, L] left-padded, mask [B, L + new] (True = a real token)
    positions: 0 .. L_b - 1 on each row's real tokens, then one more per new token
    prefill: one [B, L] forward; decode: one [B_live, 1] forward per step

Left padding puts every row's next token in the same column, so a decode step is one forward for the
whole batch; the padding is masked out as keys and never gets a position of its own. A row stops on
its own, at the end-of-sequence token or at any of `stop` (strings); the cache then keeps only the live
rows (KVCache.select_rows), so a finished row stops costing compute. With no padding among the live
rows, the forward runs without a mask (the fused kernel's causal path).

Greedy rows equal what each prompt gives alone (models/generation.py) token for token, up to the
float rounding of batched matrix products. LongRoPE models that switch factors past
original_max_position_embeddings run each prompt as its own batch: the switch (and the cache refill
that goes with it, as transformers' Phi-3 does it) depends on the row's own length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from headcount.arguments import positive_int
from headcount.models.prompting import GenerationResult, _check_sampling, _prompt_ids
from headcount.models.packing import packed, whole_when_memory_allows

Tensor = torch.Tensor
FINISH_REASONS = ("eos", "stop", "length")


def is_batch(prompt) -> bool:
    """A list / tuple of prompts (strings, id lists or 1-D tensors), as opposed to one prompt's ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and not isinstance(prompt[0], int)


def _check_stop(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    stop = tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop: expected a list of non-empty strings, got {list(stop)!r}")
    return stop


@dataclass
class _Row:
    prompt_ids: list[int]
    new_ids: list
    finish: str | None = None
    stop_string: str | None = None
    decode_s: float = 0.0


def _picker(temperature: float, top_k: int | None, generator) -> Callable[[Tensor], Tensor]:
    def pick(logits: Tensor) -> Tensor:  # logits [B, vocab] -> ids [B]
        if temperature == 0:
            return torch.argmax(logits, dim=-1)
        scaled = logits.float() / temperature
        if top_k is not None and top_k < scaled.shape[-1]:
            values, indices = torch.topk(scaled, top_k, dim=-1)
            chosen = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
            return indices.gather(-1, chosen)[:, 0]
        return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)[:, 0]
    return pick


def _stopped_by(tokenizer, ids: list[int], stop: tuple[str, ...], tail: int) -> str | None:
    """The stop string that the last tokens complete, if any. A stop string of m characters spans at most
    m tokens (every token decodes to >= 1 character), so decoding the last `tail` tokens is enough."""
    text = tokenizer.decode(ids[-tail:])
    return next((s for s in stop if s in text), None)


def prepared(model, prompts, max_new_tokens: int, temperature: float, top_k: int | None, seed: int | None,
             stop) -> tuple[list[list[int]], tuple[str, ...], torch.Generator | None]:
    """(each prompt's ids, the stop strings, the sampling generator or None): every argument of a batched
    generation checked, and the context checked for the longest prompt, before any work."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts: expected a non-empty list of prompts, got {prompts!r}")
    rows = [_prompt_ids(model, p) for p in prompts]
    _check_sampling(temperature, top_k)
    positive_int("max_new_tokens", max_new_tokens)
    stop = _check_stop(stop)
    if stop and model.tokenizer is None:
        raise ValueError("stop: stop strings need a model with a tokenizer")
    context = model.config.max_position
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > context:
        raise ValueError(f"prompt of {longest} token{'s' * (longest != 1)} + {max_new_tokens} new tokens is past "
                         f"the model's context of {context} tokens")
    generator = None
    if temperature > 0:
        generator = torch.Generator(device=model.embed.weight.device)
        generator.manual_seed(seed if seed is not None else torch.seed())
    return rows, stop, generator


def generate_batch(model, prompts: Sequence, max_new_tokens: int = 64, *, temperature: float = 0.0,
                   top_k: int | None = None, seed: int | None = None, stop_at_eos: bool = True,
                   stop: Sequence[str] | str | None = None) -> list[GenerationResult]:
    """One GenerationResult per prompt, in order (see the module docstring). `stop`: strings that end a
    row; its text is cut before the first of them (its new_ids keep the tokens that spelled it)."""
    rows, stop, generator = prepared(model, prompts, max_new_tokens, temperature, top_k, seed, stop)
    rotary = getattr(model, "rotary", None)
    if len(rows) > 1 and rotary is not None and getattr(rotary, "_long_inv_freq", None) is not None:
        return [_generate(model, [r], max_new_tokens, temperature, top_k, generator, stop_at_eos, stop)[0]
                for r in rows]
    return _generate(model, rows, max_new_tokens, temperature, top_k, generator, stop_at_eos, stop)


def _generate(model, rows: list[list[int]], max_new_tokens: int, temperature, top_k, generator, stop_at_eos,
              stop) -> list[GenerationResult]:
    device = model.embed.weight.device
    eos = model.config.eos_token_id if stop_at_eos else None
    tokenizer = model.tokenizer
    tail = max((len(s) for s in stop), default=0) + 2
    pick = _picker(temperature, top_k, generator)
    batch, prompt_len = len(rows), max(len(r) for r in rows)
    total = prompt_len + max_new_tokens
    pad = (tokenizer.pad_token_id if tokenizer is not None else None) or 0
    tokens = torch.full((batch, total), pad, dtype=torch.long, device=device)
    mask = torch.zeros((batch, total), dtype=torch.bool, device=device)
    for b, r in enumerate(rows):
        tokens[b, prompt_len - len(r):prompt_len] = torch.tensor(r, dtype=torch.long)
        mask[b, prompt_len - len(r):] = True  # the new tokens' columns are real for a live row
    lengths = torch.tensor([len(r) for r in rows], device=device)
    state = [_Row(r, []) for r in rows]
    live = torch.arange(batch, device=device)  # cache row -> prompt index
    padded = bool((lengths < prompt_len).any())

    with torch.inference_mode(), packed(model, max_bytes=whole_when_memory_allows(model)):
        t0 = time.perf_counter()
        cache = model.new_cache(batch, total)
        positions = (mask[:, :prompt_len].cumsum(1) - 1).clamp(min=0)  # (B, L)
        logits = model(tokens[:, :prompt_len], cache=cache, attention_mask=mask[:, :prompt_len] if padded else None,
                       position_ids=positions if padded else None, last_only=True).logits[:, -1]
        prefill_s = time.perf_counter() - t0
        rotary = getattr(model, "rotary", None)
        for step in range(max_new_tokens):
            chosen = pick(logits).tolist()  # one sync a step
            tokens[live, prompt_len + step] = torch.tensor(chosen, dtype=torch.long, device=device)
            now = time.perf_counter() - t0 - prefill_s
            keep = []
            for slot, (index, token) in enumerate(zip(live.tolist(), chosen)):
                row = state[index]
                row.new_ids.append(token)
                row.decode_s = now
                if eos is not None and token == eos:
                    row.finish = "eos"
                elif stop and (hit := _stopped_by(tokenizer, row.new_ids, stop, tail)) is not None:
                    row.finish, row.stop_string = "stop", hit
                else:
                    keep.append(slot)
            if step == max_new_tokens - 1 or not keep:
                break
            if len(keep) < len(live):  # finished rows leave the cache: they cost nothing from here on
                index = torch.tensor(keep, dtype=torch.long, device=device)
                for layer_cache in cache:
                    layer_cache.select_rows(index)
                live = live[index]
                padded = bool((lengths[live] < prompt_len).any())
            seen = prompt_len + step + 1
            if rotary is not None and rotary.refills_cache(cache[0].length):
                # LongRoPE past original_max_position_embeddings (one row, see the module docstring): the
                # cached keys were turned with the short factors, so the whole sequence runs again
                cache = model.new_cache(len(live), total)
                logits = model(tokens[live, :seen], cache=cache, last_only=True).logits[:, -1]
                continue
            step_positions = (lengths[live] + step)[:, None]  # (B_live, 1): the new token's position
            logits = model(tokens[live, seen - 1:seen], cache=cache,
                           attention_mask=mask[live, :seen] if padded else None,
                           position_ids=step_positions if padded else None, last_only=True).logits[:, -1]

    results = []
    for row in state:
        text = tokenizer.decode(row.new_ids) if tokenizer is not None else None
        if row.stop_string is not None:
            text = text[:text.find(row.stop_string)]
        finish = row.finish or "length"
        results.append(GenerationResult(row.prompt_ids, row.new_ids, text, prefill_s, row.decode_s,
                                        stopped_at_eos=finish == "eos", finish_reason=finish,
                                        stop_string=row.stop_string))
    return results
