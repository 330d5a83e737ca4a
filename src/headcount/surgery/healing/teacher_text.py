"""Calibration the teacher writes itself: its sampled continuations of short calibration prompts, or its chat
answers to instructions.

    texts = teacher_texts(teacher, tokens=98_304)     # list of str, prompt + continuation each
    heal(student, teacher, calibration=texts)
    windows = teacher_chat_windows(teacher, 108)      # LongTensor [108, 512]: prose and chat answers, interleaved
    heal(student, teacher, calibration=windows)

Distilling on a fixed corpus teaches the student the teacher's distribution on that corpus only; the teacher's
own samples (temperature 1, the full distribution) cover what the teacher itself finds likely, code included
for a code model, without a second corpus. The prompts are consecutive pieces of `stream`'s calibration part,
so nothing held out (and no eval problem) reaches them; the continuations are sampled with a fixed seed.

The chat form (teacher_chat_windows) is for a chat model that is judged by what it answers: a heal on prose and
docstrings improved a pruned code model's perplexity and not its HumanEval pass@1 (docs/eval.md). Its instructions
are the eval's own prompt (tasks/prompts.py: the format `headcount eval` picks for the teacher, the makers' where
the table has it, with its stops) about function stubs of the calibration part of the torch / numpy source
(data.function_stubs: a signature and docstring, no body), and the teacher answers them greedily, as it answers
when judged: the student is distilled on the states the task visits. Half the windows stay the default
corpus's calibration prose, interleaved, so the heal keeps the prose domain in view.
"""

from __future__ import annotations

import math

from headcount.arguments import positive_float, positive_int

PROMPT_TOKENS = 32
NEW_TOKENS = 480  # a prompt and its continuation fill one 512-token healing window
BATCH_SIZE = 16
CHAT_NEW_TOKENS = 384  # an answer's cap: the eval's answers are ~290 tokens on qwen2.5-coder-0.5b (512 its cap)
CHAT_BATCH_SIZE = 32  # the eval's batch (tasks.harness.BATCH_SIZE)


def teacher_texts(teacher, tokens: int, *, stream: str = "mixed", prompt_tokens: int = PROMPT_TOKENS,
                  new_tokens: int = NEW_TOKENS, temperature: float = 1.0, seed: int = 0,
                  batch_size: int = BATCH_SIZE, progress: bool = True) -> list[str]:
    """About `tokens` tokens of the teacher's own text: ceil(tokens / (prompt_tokens + new_tokens)) samples, each a
    calibration prompt of `prompt_tokens` tokens and up to `new_tokens` sampled after it (a sample that ends at
    EOS is shorter; the heal windows the joined texts, so the total may fall a little short of `tokens`)."""
    from headcount.analysis.batches import calibration_batches

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
    results = _generate(teacher, prompts, new_tokens, batch_size=batch_size, progress=progress,
                        desc=("teacher text", "sample"), temperature=temperature, seed=seed)
    decode = teacher.tokenizer.decode
    return [decode(p) + r.text for p, r in zip(prompts, results)]


def _generate(teacher, prompts: list, new_tokens: int, *, batch_size: int, progress: bool, desc: tuple[str, str],
              temperature: float = 0.0, seed: int | None = None, stop=None) -> list:
    """One GenerationResult per prompt, in order, with a progress bar: continuous batching where the teacher allows
    it, else batches of `batch_size` (batch starting at prompt i seeded seed + i)."""
    from tqdm import tqdm

    from headcount.models.batched import generate_batch
    from headcount.models.continuous import generate_many, supports_continuous

    with tqdm(total=len(prompts), desc=desc[0], unit=desc[1], leave=False, disable=not progress) as bar:
        if supports_continuous(teacher):
            return generate_many(teacher, prompts, new_tokens, batch_size=batch_size, temperature=temperature,
                                 seed=seed, stop=stop, on_result=lambda i, r: bar.update(1))
        results = []
        for i in range(0, len(prompts), batch_size):
            results += generate_batch(teacher, prompts[i:i + batch_size], new_tokens, temperature=temperature,
                                      seed=None if seed is None else seed + i, stop=stop)
            bar.update(len(prompts[i:i + batch_size]))
        return results


def eval_prompts(teacher, stubs: list[str]) -> tuple:
    """(the format, [prompt text], [prompt ids]): each stub asked as `headcount eval` asks the teacher a problem
    (tasks.prompts.choose_format(teacher, "auto"): the makers' format where the table has the model, else
    EvalPlus's chat format). A teacher that is not a decoder with a tokenizer and a chat template: ValueError."""
    from headcount.tasks.problems import Problem
    from headcount.tasks.prompts import choose_format, prompt_ids, prompt_text

    tokenizer = getattr(teacher, "tokenizer", None)
    if not hasattr(teacher, "lm_head") or tokenizer is None:
        raise ValueError("teacher: its chat answers need a decoder with a tokenizer")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("teacher: it has no chat template to be asked through (calibration 'teacher' samples "
                         "its plain continuations instead)")
    fmt = choose_format(teacher, "auto")
    problems = [Problem(f"stub/{i}", stub, "", "") for i, stub in enumerate(stubs)]
    return fmt, [prompt_text(teacher, p, fmt) for p in problems], [prompt_ids(teacher, p, fmt) for p in problems]


def eval_answers(teacher, ids: list, fmt, *, new_tokens: int, batch_size: int, progress: bool) -> list:
    """The teacher's greedy answers (GenerationResult) to prompts `ids`, as eval generates them: the format's
    stops, at most its token budget, `new_tokens` and what the context leaves."""
    room = teacher.config.max_position - max(len(i) for i in ids)
    if room < 1:
        raise ValueError(f"teacher: a stub's prompt of {max(len(i) for i in ids)} tokens fills its context of "
                         f"{teacher.config.max_position}")
    return _generate(teacher, ids, min(new_tokens, fmt.max_new_tokens, room), batch_size=batch_size,
                     progress=progress, desc=("teacher answers", "answer"), stop=fmt.stops(teacher.tokenizer))


def teacher_chat_texts(teacher, n_texts: int, *, new_tokens: int = CHAT_NEW_TOKENS, batch_size: int = CHAT_BATCH_SIZE,
                       progress: bool = True) -> list[str]:
    """The first `n_texts` calibration function stubs (data.function_stubs, cycled when there are fewer) asked
    as `headcount eval` asks this teacher (eval_prompts), each with the teacher's greedy answer: prompt text
    (special tokens written out) + answer + the closing fence. A teacher without a chat template: ValueError."""
    from headcount.data import function_stubs
    from headcount.tasks.prompts import FENCE_STOP

    positive_int("n_texts", n_texts)
    positive_int("new_tokens", new_tokens)
    stubs = function_stubs()
    fmt, prompts, ids = eval_prompts(teacher, [stubs[i % len(stubs)] for i in range(n_texts)])
    results = eval_answers(teacher, ids, fmt, new_tokens=new_tokens, batch_size=batch_size, progress=progress)
    return [p + r.text + FENCE_STOP + "\n" for p, r in zip(prompts, results)]


def teacher_chat_windows(teacher, n_windows: int, *, window: int = 512, progress: bool = True, **kwargs):
    """`n_windows` token windows [n_windows, window]: the default corpus's calibration prose and the teacher's
    chat answers (teacher_chat_texts, about as many tokens as half the windows), interleaved prose, chat, prose, ...
    so that the heal's last (validation) windows hold both. Fewer chat windows than half when the stubs run out."""
    import torch

    from headcount.analysis.batches import token_windows
    from headcount.data import default_corpus

    positive_int("n_windows", n_windows, 2)
    window = min(positive_int("window", window, 2), teacher.config.max_position)
    n_chat = n_windows // 2
    # an answer and its prompt are ~500 tokens on qwen2.5-coder-0.5b: ask for one per window, and a few more
    texts = teacher_chat_texts(teacher, n_chat + max(2, n_chat // 8), progress=progress, **kwargs)
    chat = token_windows(teacher, texts, window=window, max_windows=n_chat)
    prose = token_windows(teacher, default_corpus().texts("calibration"), window=window,
                          max_windows=n_windows - len(chat))
    rows = [r for pair in zip(prose, chat) for r in pair] + list(prose[len(chat):]) + list(chat[len(prose):])
    return torch.stack(rows[:n_windows])
