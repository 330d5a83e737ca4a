"""Token generation with the KV cache: prefill the prompt once, then one token per step.

Greedy by default (temperature 0): the token with the highest logit, ties to the lowest id (as
torch.argmax and transformers' greedy search). temperature > 0 samples from softmax(logits / T),
restricted to the top_k logits when top_k is given, from a torch.Generator seeded with `seed`.

Speed: the Linear weights are packed for oneDNN for the call (packing.py; hold
`headcount.models.packed(model)` around many calls to pack once); one cache of exactly
prompt + max_new_tokens positions, allocated once; every decode step reuses one [1, 1] input
tensor; logits are computed for the last position only; everything runs under torch.inference_mode.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import torch

from headcount.arguments import positive_int
from headcount.models.batched import generate_batch, is_batch
from headcount.models.packing import packed
from headcount.models.prompting import GenerationResult, _check_sampling, _prompt_ids  # noqa: F401 (exported here)

Tensor = torch.Tensor


def stream_tokens(model, prompt: str | Sequence[int] | Tensor, max_new_tokens: int = 64, *,
                  temperature: float = 0.0, top_k: int | None = None, seed: int | None = None,
                  stop_at_eos: bool = True, timings: dict | None = None) -> Iterator[int]:
    """Yield new token ids one at a time (a generator: the caller can print as they come).

    Raises ValueError before any work when prompt + max_new_tokens exceeds the model's context.
    `timings`, when given, receives "prefill_s" (to the first token) and "decode_s" (the rest).
    """
    ids = _prompt_ids(model, prompt)
    _check_sampling(temperature, top_k)
    positive_int("max_new_tokens", max_new_tokens)
    context = model.config.max_position
    if len(ids) + max_new_tokens > context:
        raise ValueError(f"prompt of {len(ids)} token{'s' * (len(ids) != 1)} + {max_new_tokens} new tokens is past "
                         f"the model's context of {context} tokens")
    return _stream(model, ids, max_new_tokens, temperature, top_k, seed, stop_at_eos, timings)


def _stream(model, ids, max_new_tokens, temperature, top_k, seed, stop_at_eos, timings) -> Iterator[int]:
    device = model.embed.weight.device
    eos = model.config.eos_token_id if stop_at_eos else None
    generator = None
    if temperature > 0:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed if seed is not None else torch.seed())

    def pick(logits: Tensor) -> int:  # logits [vocab]
        if temperature == 0:
            return int(torch.argmax(logits))
        scaled = logits.float() / temperature
        if top_k is not None and top_k < scaled.shape[-1]:
            values, indices = torch.topk(scaled, top_k)
            probs = torch.softmax(values, dim=-1)
            return int(indices[torch.multinomial(probs, 1, generator=generator)])
        return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))

    with torch.inference_mode(), packed(model):
        t0 = time.perf_counter()
        cache = model.new_cache(1, len(ids) + max_new_tokens)
        prompt = torch.tensor([ids], dtype=torch.long, device=device)
        logits = model(prompt, cache=cache, last_only=True).logits
        token = pick(logits[0, -1])
        t1 = time.perf_counter()
        if timings is not None:
            timings["prefill_s"], timings["decode_s"] = t1 - t0, 0.0
        yield token
        step = torch.empty((1, 1), dtype=torch.long, device=device)
        rotary = getattr(model, "rotary", None)
        seen = list(ids)
        for _ in range(max_new_tokens - 1):
            if eos is not None and token == eos:
                break
            seen.append(token)
            if rotary is not None and rotary.refills_cache(cache[0].length):
                # LongRoPE passing original_max_position_embeddings: the cached keys were turned with the short
                # factors; transformers' Phi3 generate() drops its cache here and runs the whole sequence again
                # (long factors on every key), and so does headcount
                cache = model.new_cache(1, len(ids) + max_new_tokens)
                logits = model(torch.tensor([seen], dtype=torch.long, device=device), cache=cache,
                               last_only=True).logits
            else:
                step.fill_(token)
                logits = model(step, cache=cache, last_only=True).logits
            token = pick(logits[0, -1])
            if timings is not None:
                timings["decode_s"] = time.perf_counter() - t1
            yield token


def generate(model, prompt, max_new_tokens: int = 64, *, temperature: float = 0.0, top_k: int | None = None,
             seed: int | None = None, stop_at_eos: bool = True, stop: Sequence[str] | str | None = None,
             on_token: Callable[[int], None] | None = None) -> GenerationResult | list[GenerationResult]:
    """Generate up to max_new_tokens after `prompt` (a string, token ids or a [T] / [1, T] tensor).

    A list of prompts (strings or id lists) gives a list of GenerationResult, one per prompt, generated
    together (models/batched.py: left-padded, one KV cache, each row stopping on its own).
    Stops early at the model's eos token when stop_at_eos (the eos token is included in new_ids), and at
    any string of `stop` (the text is cut before it). on_token(id) is called as each token is produced
    (one prompt only).
    """
    if is_batch(prompt) or stop:
        if on_token is not None:
            raise ValueError("on_token: streams one prompt without stop strings; a batch or stop= returns results")
        results = generate_batch(model, list(prompt) if is_batch(prompt) else [prompt], max_new_tokens,
                                 temperature=temperature, top_k=top_k, seed=seed, stop_at_eos=stop_at_eos, stop=stop)
        return results if is_batch(prompt) else results[0]
    timings: dict = {}
    prompt_ids = _prompt_ids(model, prompt)
    new: list[int] = []
    for token in stream_tokens(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                               stop_at_eos=stop_at_eos, timings=timings):
        new.append(token)
        if on_token is not None:
            on_token(token)
    eos = model.config.eos_token_id
    text = model.tokenizer.decode(new) if model.tokenizer is not None else None
    at_eos = bool(stop_at_eos and new and new[-1] == eos and len(new) < max_new_tokens)
    return GenerationResult(prompt_ids, new, text, timings.get("prefill_s", 0.0), timings.get("decode_s", 0.0),
                            stopped_at_eos=at_eos, finish_reason="eos" if at_eos else "length")


class TextStreamer:
    """Turns a stream of token ids into printable text pieces, holding back incomplete UTF-8."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens: wait for the rest
            return ""
        piece, self.printed = text[self.printed:], len(text)
        return piece
