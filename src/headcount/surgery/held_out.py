"""Quality on held-out text, the one measure every edit reports (pruning, merging, gates, the CLIs).

    held_out_sets(model, held_out, eval_windows, window)   {name: token windows | sentences}
    evaluate(model, sets, references)                      {name: perplexity | (cosine, spearman)}
    embed(model, sentences), fidelity(model, reference, sentences)   encoders' embedding fidelity

Decoders: perplexity on windows of held-out text. Encoders: embedding fidelity on held-out sentences,
mean cosine to the unmodified model's embedding and Spearman of all pairwise similarities.
"""

from __future__ import annotations

import torch

EVAL_WINDOWS = 8
HELD_OUT_SENTENCES = 256


def _is_decoder(model) -> bool:
    return hasattr(model, "lm_head")


def held_out_sets(model, held_out, eval_windows: int, window: int, sentences: int = HELD_OUT_SENTENCES) -> dict:
    """{name: LongTensor windows (decoder) | list of `sentences` sentences (encoder)}."""
    from headcount.analysis.batches import split_sentences, token_windows

    if held_out is None:
        held_out = {"prose": None}
    elif not isinstance(held_out, dict):
        held_out = {"text": held_out}
    out = {}
    for name, texts in held_out.items():
        if _is_decoder(model):
            out[name] = token_windows(model, texts, window=window, max_windows=eval_windows, part="held_out")
        else:
            found = split_sentences(texts, part="held_out", max_sentences=sentences)
            if len(found) < 3:
                raise ValueError(f"held_out: {name!r} has {len(found)} sentences; at least 3 are needed")
            out[name] = found
    return out


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    from scipy.stats import spearmanr
    return float(spearmanr(a.numpy(), b.numpy()).statistic)


def embed(model, sentences: list[str]) -> torch.Tensor:
    """L2-normalised mean-pooled sentence embeddings [N, d], in batches of 32 truncated at 128 tokens
    (Encoder.embed_sentences pads everything to the longest sentence at once)."""
    import torch.nn.functional as F

    from headcount.analysis.batches import sentence_batches

    out = []
    with torch.no_grad():
        for ids, mask in sentence_batches(model, sentences, batch_size=32, max_len=128):
            hidden = model(ids, mask).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            out.append(F.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1))
    return torch.cat(out)


def fidelity(model, reference: torch.Tensor, sentences: list[str]) -> tuple[float, float]:
    """(mean cosine to the reference embeddings, Spearman of pairwise similarities)."""
    emb = embed(model, sentences)
    cos = float((emb * reference).sum(-1).mean())
    iu = torch.triu_indices(len(sentences), len(sentences), 1)
    sims, ref = (emb @ emb.T)[iu[0], iu[1]], (reference @ reference.T)[iu[0], iu[1]]
    return cos, _spearman(sims, ref)


def evaluate(model, sets: dict, references: dict | None = None) -> dict:
    """{name: ppl} (decoder) or {name: (cosine, spearman)} (encoder)."""
    from headcount.models.evaluation import evaluate_perplexity

    out = {}
    for name, data in sets.items():
        if _is_decoder(model):
            out[name] = evaluate_perplexity(model, data.reshape(-1).tolist(), data.shape[1],
                                            batch_size=4).perplexity
        else:
            out[name] = fidelity(model, references[name], data)
    return out
