"""READ-ONLY questions about a model: which heads matter, what each does.

    importance(model, texts=None, method=...) -> HeadScores     head_importance.py, scores.py
    capture(model, batch)                                        capturing.py
    roles(model, texts=None) -> RoleScores                       role_scores.py (patterns.py, syntax.py)
    faithfulness(model, texts=None, layers=None)                 faithful.py
    rank(model, texts=None)                                      score_rank.py
    (modules are named so they never shadow the functions they export)
    token_windows / sentence_batches / resolve_texts             batches.py (texts -> inputs)

analysis never changes a weight: it touches models only through public hooks
(model.layers[i].attn, forward(head_gates=..., need_weights=...)). Lazy exports keep imports cheap.
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {
    "importance": "head_importance", "HeadScores": "scores", "METHODS": "head_importance",
    "capture": "capturing",
    "roles": "role_scores", "RoleScores": "role_scores",
    "faithfulness": "faithful", "Faithfulness": "faithful",
    "rank": "score_rank", "RankResult": "score_rank",
    "token_windows": "batches", "sentence_batches": "batches", "resolve_texts": "batches",
    "split_sentences": "batches",
}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
