"""Perplexity over non-overlapping windows.

Definition (what `perplexity(model, texts, window)` computes, exactly):

1. The texts are joined with a blank line ("\\n\\n") into one string and tokenized once, without
   special tokens: a token stream x_0 .. x_{N-1}. (A single string is used as is.)
2. The stream is cut into consecutive, non-overlapping windows of `window` tokens:
   [x_0 .. x_{w-1}], [x_w .. x_{2w-1}], ...; the last window holds what is left and is dropped
   if it has fewer than 2 tokens. Where the model's tokenizer opens every sequence with BOS (Gemma 3:
   `bos_id(model)`), each window is BOS followed by the next `window - 1` stream tokens, as llama.cpp's
   perplexity tool does; without it Gemma 3 scores a perplexity in the thousands. Token ids given
   directly are taken as already windowed (analysis.batches.token_windows adds the same BOS).
3. Each window is run through the model on its own (no context carried over from the previous
   window). Within a window, token j >= 1 is scored with its negative log-likelihood
   -log p(x_j | the window's tokens before it). The FIRST token of each window is not scored: it has
   no context inside its window. A window of L tokens scores L - 1 tokens.
4. perplexity = exp(sum of all scored NLLs / number of scored tokens): a token-level mean over the
   whole stream, not a mean of per-window perplexities.

This is what transformers' causal-LM loss gives per window (labels = input_ids: the logits at
position j - 1 predict token j), so the two agree on the same windows. NLLs are summed in float64.
The logits are computed chunk by chunk (decoder.chunked_nll) so a 1024-token window never holds
[1024, vocab] floats at once: Gemma 3's vocabulary of 262,144 would make that 1 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from headcount.arguments import positive_int
from headcount.models.decoder import chunked_nll
from headcount.models.packing import packed

Tensor = torch.Tensor


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    n_scored: int  # tokens scored = n_tokens - n_windows
    n_tokens: int  # tokens in all kept windows
    n_windows: int
    window: int

    def __str__(self) -> str:
        return (f"perplexity {self.perplexity:.4f} (mean NLL {self.nll:.4f} nats over {self.n_scored:,} tokens "
                f"in {self.n_windows} windows of <= {self.window})")


def token_stream(model, texts: str | Sequence[str]) -> list[int]:
    """Step 1 of the definition: the texts joined by a blank line, tokenized once."""
    if model.tokenizer is None:
        raise ValueError("perplexity: this model has no tokenizer; pass token ids instead of text")
    text = texts if isinstance(texts, str) else "\n\n".join(texts)
    if not text.strip():
        raise ValueError("perplexity: the text is empty")
    return model.tokenizer.encode(text, add_special_tokens=False)


def bos_id(model) -> int | None:
    """The BOS token every window opens with, where the decoder's tokenizer adds one (Gemma 3); else None."""
    tok = getattr(model, "tokenizer", None)
    if tok is None or not hasattr(model, "lm_head") or not getattr(tok, "add_special_tokens", False):
        return None
    return tok.bos_token_id


def windows(ids: Sequence[int], window: int, bos: int | None = None) -> list[list[int]]:
    """Step 2: consecutive non-overlapping windows (each BOS + window - 1 tokens when bos is given); a last
    window of fewer than 2 tokens is dropped."""
    if bos is None:
        out = [list(ids[i:i + window]) for i in range(0, len(ids), window)]
    else:
        out = [[bos] + list(ids[i:i + window - 1]) for i in range(0, len(ids), window - 1)]
    return [w for w in out if len(w) >= 2]


def window_nll(model, input_ids: Tensor, *, chunk: int | None = None) -> Tensor:
    """Summed NLL (float64) of tokens 1..L-1 of each row of input_ids [B, L] given the tokens before.

    The loss comes from the final hidden states through lm_head `chunk` positions at a time
    (decoder.chunked_nll; None = a 128 MiB budget of fp32 logits): never a [B, L, vocab] tensor."""
    hidden = model(input_ids, compute_logits=False).hidden_states  # (B, L, d)
    nll = chunked_nll(hidden[:, :-1], input_ids[:, 1:], model.lm_head, chunk=chunk)  # (B, L-1) float32
    return nll.double().sum(dim=1)


def evaluate_perplexity(model, texts: str | Sequence[str] | Sequence[int] | Tensor, window: int = 1024, *,
                        batch_size: int = 1, max_tokens: int | None = None, progress=None) -> PerplexityResult:
    """Perplexity with the details (see the module docstring for the exact definition).

    texts: a string, a list of strings, or token ids (a list of ints or a 1-D tensor) used as the stream.
    max_tokens: use only the first max_tokens tokens of the stream.
    batch_size: full-length windows evaluated together (the result does not depend on it).
    progress: called with (windows done, windows total) after each batch.
    """
    positive_int("window", window, 2)
    if window > model.config.max_position:
        raise ValueError(f"window: {window} tokens is past the model's context of {model.config.max_position}")
    bos = None  # given ids are the windows' own tokens
    if isinstance(texts, Tensor):
        ids = texts.reshape(-1).tolist()
    elif isinstance(texts, (list, tuple)) and texts and all(isinstance(t, int) for t in texts):
        ids = list(texts)
    else:
        ids = token_stream(model, texts)
        bos = bos_id(model)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    chunks = windows(ids, window, bos)
    if not chunks:
        raise ValueError(f"perplexity: the text has {len(ids)} token(s); at least 2 are needed")
    device = model.embed.weight.device
    total, scored = 0.0, 0
    with torch.inference_mode(), packed(model):
        done = 0
        full = [c for c in chunks if len(c) == len(chunks[0])]
        rest = chunks[len(full):]
        groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)] + [[c] for c in rest]
        for group in groups:
            batch = torch.tensor(group, dtype=torch.long, device=device)
            total += float(window_nll(model, batch).sum())
            scored += batch.numel() - batch.shape[0]
            done += len(group)
            if progress is not None:
                progress(done, len(chunks))
    nll = total / scored
    return PerplexityResult(math.exp(nll), nll, scored, sum(len(c) for c in chunks), len(chunks), window)


def perplexity(model, texts: str | Sequence[str] | Sequence[int] | Tensor, window: int = 1024, **kwargs) -> float:
    """exp(mean NLL per scored token) over non-overlapping windows of `window` tokens; the first token
    of each window is not scored. See the module docstring; `evaluate_perplexity` gives the details."""
    return evaluate_perplexity(model, texts, window, **kwargs).perplexity
