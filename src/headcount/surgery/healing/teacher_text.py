"""Calibration the teacher writes itself: its sampled continuations of short calibration prompts.

    texts = teacher_texts(teacher, tokens=98_304)     # list of str, prompt + continuation each
    heal(student, teacher, calibration=texts)

Distilling on a fixed corpus teaches the student the teacher's distribution on that corpus only; the teacher's
own samples (temperature 1, the full distribution) cover what the teacher itself finds likely, code included
for a code model, without a second corpus. The prompts are consecutive pieces of `stream`'s calibration part,
so nothing held out (and no eval problem) reaches them; the continuations are sampled with a fixed seed.
"""

from __future__ import annotations

import math

from headcount.arguments import positive_float, positive_int

PROMPT_TOKENS = 32
NEW_TOKENS = 480  # a prompt and its continuation fill one 512-token healing window
BATCH_SIZE = 16


def teacher_texts(teacher, tokens: int, *, stream: str = "mixed", prompt_tokens: int = PROMPT_TOKENS,
                  new_tokens: int = NEW_TOKENS, temperature: float = 1.0, seed: int = 0,
                  batch_size: int = BATCH_SIZE, progress: bool = True) -> list[str]:
    """About `tokens` tokens of the teacher's own text: ceil(tokens / (prompt_tokens + new_tokens)) samples, each a
    calibration prompt of `prompt_tokens` tokens and up to `new_tokens` sampled after it (a sample that ends at
    EOS is shorter; the heal windows the joined texts, so the total may fall a little short of `tokens`)."""
    from headcount.analysis.batches import calibration_batches
    from headcount.models.batched import generate_batch
    from headcount.models.continuous import generate_many, supports_continuous

    positive_int("tokens", tokens)
    positive_int("prompt_tokens", prompt_tokens, 2)
    positive_int("new_tokens", new_tokens)
    positive_float("temperature", temperature)
    if not hasattr(teacher, "lm_head") or getattr(teacher, "tokenizer", None) is None:
        raise ValueError("teacher: its own text needs a decoder with a tokenizer")
    new_tokens = min(new_tokens, teacher.config.max_position - prompt_tokens)  # a sample fits the context
    if new_tokens < 1:
        raise ValueError(f"prompt_tokens: {prompt_tokens} leaves no room in the teacher's context of "
                         f"{teacher.config.max_position}")
    n = math.ceil(tokens / (prompt_tokens + new_tokens))
    batches = calibration_batches(teacher, stream, n_windows=n, window=prompt_tokens, batch_size=n)
    prompts = [row.tolist() for b in batches for row in b.ids][:n]
    if len(prompts) < n:  # a short stream: its prompts again, each sampled anew
        prompts = [prompts[i % len(prompts)] for i in range(n)]
    bar = _bar(n) if progress else None
    settings = dict(temperature=temperature, seed=seed)
    if supports_continuous(teacher):
        results = generate_many(teacher, prompts, new_tokens, batch_size=batch_size, **settings,
                                on_result=(lambda i, r: bar.update(1)) if bar else None)
    else:
        results = []
        for i in range(0, n, batch_size):
            results += generate_batch(teacher, prompts[i:i + batch_size], new_tokens, temperature=temperature,
                                      seed=seed + i)
            if bar:
                bar.update(len(prompts[i:i + batch_size]))
    if bar:
        bar.close()
    decode = teacher.tokenizer.decode
    return [decode(p) + r.text for p, r in zip(prompts, results)]


def _bar(total: int):
    from tqdm import tqdm
    return tqdm(total=total, desc="teacher text", unit="sample", leave=False)
