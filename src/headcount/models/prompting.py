"""What every generation path shares: the result of one prompt, and the checks of its arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headcount.arguments import positive_int

Tensor = torch.Tensor


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    new_ids: list[int]
    text: str | None  # the decoded new tokens (None without a tokenizer)
    prefill_s: float  # time to the first new token
    decode_s: float  # time for the remaining new tokens
    stopped_at_eos: bool = False
    extra: dict = field(default_factory=dict)
    finish_reason: str = "length"  # "eos" | "stop" (a stop string; text cut before it) | "length"
    stop_string: str | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.new_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else float("nan")


def _prompt_ids(model, prompt) -> list[int]:
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError("prompt: a string prompt needs a model with a tokenizer; pass token ids")
        ids = model.tokenizer.encode(prompt)
    elif isinstance(prompt, Tensor):
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ValueError(f"prompt: expected one sequence of token ids, got shape {list(prompt.shape)}")
        ids = prompt.tolist()
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise ValueError("prompt: empty (no tokens)")
    vocab = model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary of {vocab}")
    return ids


def _check_sampling(temperature: float, top_k: int | None) -> None:
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0 (0 = greedy), got {temperature!r}")
    positive_int("top_k", top_k, none=True)


