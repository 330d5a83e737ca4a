"""Calibration of the teacher's answers alone: one window per (prompt, answer), the loss on the answer's tokens.

    cal = teacher_answers(teacher, 108)      MaskedWindows: ids [n, T], mask [n, T] True on the answer's tokens
    heal(student, teacher, calibration=cal)  the KL summed over answer tokens only, in training and validation

What a chat model is judged by is its answer to the eval's prompt: each window is one calibration function stub
(data.function_stubs: calibration source only, so no eval problem and no held-out text) asked as `headcount eval`
asks the teacher (teacher_text.eval_prompts: the makers' format where the table has the model, its stops and token
budget), followed by the tokens the teacher generated greedily (its own token ids, up to and including the stop).
The prompt is context, not a target: the student is pulled toward the teacher's answer distribution at the states
the answer visits, not toward re-predicting a system prompt and a docstring it was given. No prose: the validation
KL, which chooses the weights kept, is then the KL on answers the heal never trained on.

Every window holds a different stub (duplicates removed, never cycled): the heal's last windows, its validation
split, are answers to stubs no training window asked. With fewer stubs than windows asked for, fewer windows.
A window is T = min(window, the context) tokens: longer rows are cut (their prompt kept, the answer's tail lost),
shorter ones padded after the answer (padding is masked out and, the attention being causal, changes nothing
before it); a prompt with no room left for an answer token is skipped.
"""

from __future__ import annotations

from headcount.arguments import positive_int
from headcount.surgery.healing.masked import MaskedWindows
from headcount.surgery.healing.teacher_text import CHAT_BATCH_SIZE, CHAT_NEW_TOKENS, eval_answers, eval_prompts

NAME = "teacher-answers"


def answer_stubs(n: int) -> list[str]:
    """The first `n` distinct calibration function stubs (fewer when the calibration source has fewer)."""
    from headcount.data import function_stubs

    return list(dict.fromkeys(function_stubs()))[:n]


def teacher_answers(teacher, n_windows: int, *, window: int = 512, new_tokens: int = CHAT_NEW_TOKENS,
                    batch_size: int = CHAT_BATCH_SIZE, progress: bool = True) -> MaskedWindows:
    """Up to `n_windows` windows [n, T] of one stub's eval prompt + the teacher's greedy answer each, with the mask
    True on the answer's tokens (see the module doc). A teacher without a chat template: ValueError."""
    import torch

    positive_int("n_windows", n_windows, 2)
    window = min(positive_int("window", window, 2), teacher.config.max_position)
    positive_int("new_tokens", new_tokens)
    fmt, _, prompts = eval_prompts(teacher, answer_stubs(n_windows))
    fits = [p for p in prompts if len(p) < window]  # room for at least one answer token
    if len(fits) < 2:
        raise ValueError(f"window: {len(fits)} of {len(prompts)} stub prompts leave room for an answer in "
                         f"{window} tokens; expected at least 2")
    results = eval_answers(teacher, fits, fmt, new_tokens=min(new_tokens, window - min(map(len, fits))),
                           batch_size=batch_size, progress=progress)
    pad = _pad_id(teacher.tokenizer)
    ids = torch.full((len(fits), window), pad, dtype=torch.long)
    mask = torch.zeros((len(fits), window), dtype=torch.bool)
    for i, (prompt, r) in enumerate(zip(fits, results)):
        row = (list(prompt) + list(r.new_ids))[:window]
        ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, len(prompt):len(row)] = True
    keep = mask.any(dim=1)  # an answer of no tokens (an immediate stop the generator never kept) has no target
    return MaskedWindows(ids[keep], mask[keep], name=NAME)


def _pad_id(tokenizer) -> int:
    """A token to pad with (masked out, after the answer): the tokenizer's padding or end token, else 0."""
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int) and value >= 0:
            return value
    return 0
