"""Text -> model inputs, shared by every analysis: token windows (decoders), sentences (encoders).

    texts=None          -> the calibration part of headcount.data.default_corpus() (never held-out)
    token_windows()     -> LongTensor [N, window] of consecutive, non-overlapping windows (decoders)
    sentence_batches()  -> [(input_ids [B, T], attention_mask [B, T]), ...] (encoders)

Anything that chooses (scores, orders, fits) calls these on calibration text; quality numbers call
them with part="held_out" or on a user's held-out text.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Sequence

import torch

Tensor = torch.Tensor

PARTS = ("calibration", "held_out")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def resolve_texts(texts: str | Sequence[str] | None, part: str = "calibration") -> list[str]:
    """texts as a list of strings; None = that part of the default corpus; "mixed" = that part of the
    default corpus's prose followed by the code-like text (mixed_texts; "prose+source": the verbatim source, STREAMS):
    the text half of the one calibration path (calibration_batches), for steps that build their own probes from
    text (roles)."""
    if isinstance(texts, str) and texts in STREAMS:
        return mixed_texts(part, texts)
    if texts is None:
        if part not in PARTS:
            raise ValueError(f"part: expected one of {PARTS}, got {part!r}")
        from headcount.data import default_corpus
        return default_corpus().texts(part)
    if isinstance(texts, str):
        texts = [texts]
    texts = [t for t in texts if isinstance(t, str)] if isinstance(texts, (list, tuple)) else None
    if not texts or not any(t.strip() for t in texts):
        raise ValueError("texts: expected a non-empty string or list of strings (or None for the default corpus)")
    return list(texts)


def is_decoder(model) -> bool:
    """True for a causal language model (headcount.models.Decoder), False for an encoder."""
    return hasattr(model, "lm_head")


def token_windows(model, texts: str | Sequence[str] | None = None, *, window: int = 512,
                  max_windows: int | None = None, part: str = "calibration") -> Tensor:
    """Consecutive, non-overlapping full windows of `window` tokens: LongTensor [N, window].

    The texts are joined by a blank line and tokenized once (the perplexity definition's stream);
    a last partial window is dropped so every row has the same length. Where the model opens sequences
    with BOS (Gemma 3, evaluation.bos_id), every row is BOS + the next window - 1 stream tokens.
    """
    from headcount.models.evaluation import bos_id, token_stream, windows
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window: expected an int >= 2, got {window!r}")
    if window > model.config.max_position:
        raise ValueError(f"window: {window} tokens is past the model's context of {model.config.max_position}")
    ids = token_stream(model, resolve_texts(texts, part))
    rows = [w for w in windows(ids, window, bos_id(model)) if len(w) == window]  # the perplexity's windows
    if max_windows is not None:
        rows = rows[:max_windows]
    if not rows:
        raise ValueError(f"texts: {len(ids)} tokens is less than one window of {window}; "
                         "give more text or a smaller window")
    return torch.tensor(rows, dtype=torch.long)


# the named calibration streams: half the default corpus's prose, half the second corpus of headcount.data
STREAMS = {"mixed": "code_corpus",  # docstrings and comments of torch / numpy (the one calibration path's default)
           "prose+source": "package_source_corpus"}  # the same files verbatim (healing's choice for code models)


def _second(stream: str):
    import headcount.data as data
    return getattr(data, STREAMS[stream])()


def mixed_texts(part: str = "calibration", stream: str = "mixed") -> list[str]:
    """That part of the default corpus's prose followed by the stream's second text (code_corpus for "mixed")."""
    from headcount.data import default_corpus
    return default_corpus().texts(part) + _second(stream).texts(part)


def mixed_token_windows(model, n_windows: int, *, window: int = 512, part: str = "calibration",
                        stream: str = "mixed") -> Tensor:
    """`n_windows` windows, half prose (default corpus) and half the stream's second text (STREAMS: code-like text
    for "mixed", verbatim torch / numpy source for "prose+source"), interleaved prose, code, prose, ... so that
    any prefix of the rows is mixed too."""
    from headcount.data import default_corpus
    half = max(1, n_windows // 2)
    prose = token_windows(model, default_corpus().texts(part), window=window, max_windows=half)
    code = token_windows(model, _second(stream).texts(part), window=window, max_windows=max(1, n_windows - half))
    rows = [r for pair in zip(prose, code) for r in pair] + list(prose[len(code):]) + list(code[len(prose):])
    return torch.stack(rows[:max(1, n_windows)])


def split_sentences(texts: str | Sequence[str] | None = None, *, part: str = "calibration",
                    min_words: int = 4, max_sentences: int | None = None) -> list[str]:
    """Sentences (a light rule: split after . ! ? before a capital), at least `min_words` words."""
    out = []
    for text in resolve_texts(texts, part):
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            for s in _SENTENCE_END.split(para):
                if len(s.split()) >= min_words:
                    out.append(s)
                    if max_sentences is not None and len(out) >= max_sentences:
                        return out
    return out


def sentence_batches(model, sentences: Sequence[str], *, batch_size: int = 32,
                     max_len: int = 128) -> list[tuple[Tensor, Tensor]]:
    """Padded (input_ids [B, T], attention_mask [B, T]) batches for an encoder, truncated at max_len."""
    if model.tokenizer is None:
        raise ValueError("sentence_batches: this model has no tokenizer")
    if not sentences:
        raise ValueError("sentences: expected at least one sentence, got none")
    device = model.embed.weight.device
    batches = []
    for i in range(0, len(sentences), batch_size):
        ids, mask = model.tokenizer.batch(list(sentences[i:i + batch_size]))
        batches.append((ids[:, :max_len].to(device), mask[:, :max_len].to(device)))
    return batches


# ------------------------------------------------------------------------ the one calibration path
class Batch(NamedTuple):
    """One calibration batch: input_ids [B, T] and, for encoders, attention_mask [B, T] (1 = real token).
    A tuple, so `for ids, mask in batches` works as well as `batch.ids`."""

    ids: Tensor
    mask: Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.ids.numel() if self.mask is None else self.mask.sum())


def calibration_batches(model, calibration=None, *, n_windows: int = 8, window: int = 512, batch_size: int = 4,
                        part: str = "calibration", n_sentences: int = 256) -> list[Batch]:
    """THE calibration path: whatever a user passes as `calibration=` -> a list of Batch, for every step that
    chooses (importance, roles, prune, merge, gates, uptrain).

    calibration: None (that `part` of the default corpus), "mixed" (half prose, half code-like text,
        interleaved: mixed_token_windows / mixed_texts), "prose+source" (half prose, half verbatim torch / numpy
        source: STREAMS), a string, a list of strings, a LongTensor [N, T]
        of token windows, or a list of ready batches ((ids, mask) tuples or Batch).
    Decoders get `n_windows` windows of `window` tokens (clamped to the model's context); encoders get up to
    `n_sentences` sentences in batches of 32.
    """
    if isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1:
        raise ValueError(f"n_windows: expected a positive int, got {n_windows!r}")
    if isinstance(calibration, list) and calibration and all(isinstance(b, tuple) for b in calibration):
        return [b if isinstance(b, Batch) else Batch(*b) for b in calibration]
    device = model.embed.weight.device
    decoder = is_decoder(model)
    if isinstance(calibration, str) and calibration in STREAMS:
        calibration = (mixed_token_windows(model, n_windows, window=min(window, model.config.max_position), part=part,
                                           stream=calibration) if decoder else mixed_texts(part, calibration))
    if isinstance(calibration, Tensor):
        if calibration.dim() != 2 or calibration.dtype != torch.long:
            raise ValueError(f"calibration: expected token windows, a LongTensor [N, T]; got {calibration.dtype} "
                             f"{list(calibration.shape)}")
        ids = calibration.to(device)
        return [Batch(ids[i:i + batch_size]) for i in range(0, ids.shape[0], batch_size)]
    if decoder:
        ids = token_windows(model, calibration, window=min(window, model.config.max_position), max_windows=n_windows,
                            part=part)
        return calibration_batches(model, ids, batch_size=batch_size)
    sentences = split_sentences(calibration, part=part, max_sentences=n_sentences)
    if not sentences:
        raise ValueError("calibration: no sentences of at least 4 words in the calibration text")
    return [Batch(ids, mask) for ids, mask in sentence_batches(model, sentences, batch_size=32)]
