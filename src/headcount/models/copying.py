"""attention_copy(model): a copy for an attention edit (pruning, K/V merging) that costs the attention
weights only.

Every `layers[i].attn` is deep-copied; every other parameter and buffer (embeddings, MLPs, norms, lm_head)
is SHARED with the original (copy.deepcopy with those tensors pre-entered in its memo). A prune or a merge
replaces or rewrites attention modules only, so the original stays intact while the copy is edited, and a
report that tries several edits holds one model plus one set of attention weights, not two models
(qwen2.5-coder-0.5b: 0.2 GB instead of 2.5 GB per copy). Changing a shared tensor IN PLACE (training the
MLPs of the copy, say) would change both models: use copy.deepcopy for that.
"""

from __future__ import annotations

import copy
import itertools


def attention_copy(model):
    """A copy of `model` with its own attention modules and every other tensor shared (see the module doc)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        raise TypeError(f"model: expected a headcount model with .layers, got {type(model).__name__}")
    own = {id(t) for layer in layers for t in itertools.chain(layer.attn.parameters(), layer.attn.buffers())}
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers()) if id(t) not in own}
    return copy.deepcopy(model, memo)
