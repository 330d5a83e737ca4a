"""Every head's attention on one sample sentence, compact enough to embed every layer in the page.

Weights come through the public path `model(ids, need_weights=True).weights` (a tuple per layer of
[B, n_heads, T, S]) and are stored as integers in thousandths (0..1000), one layer at a time.
"""

from __future__ import annotations

# A sentence that repeats itself: the second half lets induction and duplicate-token heads show.
DEFAULT_SAMPLE = ("When Mary and John went to the store, John gave a drink to Mary. "
                  "When Mary and John went to the store, John gave a drink to Mary.")
MAX_TOKENS = 48


def _token_labels(model, ids: list[int]) -> list[str]:
    """Readable token strings: decoded text where a token is whole characters, the raw token otherwise."""
    tok = model.tokenizer
    labels = []
    for i in ids:
        raw = tok.token(i) or ""
        text = tok.decode([i])
        if raw.startswith("##") or (raw.startswith("[") and raw.endswith("]")) or "\ufffd" in text:
            label = raw
        else:
            label = text.strip() or raw
        labels.append(label.replace("\n", "\\n") or "?")
    return labels


def sample_attention(model, sentence: str = DEFAULT_SAMPLE, *, max_tokens: int = MAX_TOKENS) -> dict:
    """{"sentence", "tokens": [...], "scale": 1000, "layers": [[n_heads x T x T ints] per layer]}"""
    import torch

    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError(f"sample: expected a non-empty sentence, got {sentence!r}")
    if getattr(model, "tokenizer", None) is None:
        raise ValueError("model: the report needs a model with a tokenizer (to put tokens on the axes)")
    ids = model.tokenizer.encode(sentence)[:max_tokens]
    if len(ids) < 2:
        raise ValueError(f"sample: {sentence!r} gives {len(ids)} token; the heatmaps need at least 2")
    x = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    with torch.inference_mode():
        out = model(x, need_weights=True)
    weights = out.weights if hasattr(out, "weights") else out[-1]
    if weights is None:
        raise ValueError("model: it returned no attention weights with need_weights=True")
    layers = []
    for w in weights:  # [1, n_heads, T, S]
        q = torch.round(w[0].float().clamp(0, 1) * 1000).to(torch.int32)
        layers.append(q.tolist())
    return {"sentence": sentence, "tokens": _token_labels(model, ids), "scale": 1000, "layers": layers}
