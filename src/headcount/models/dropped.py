"""A decoder layer without its attention sublayer: what `drop-attention` leaves.

`layers[i].attn` becomes a NoAttention: no heads (n_heads = n_kv_heads = 0), no weights, and a K/V cache of no
bytes (cache.EmptyKVCache, which still counts the tokens seen). The layer's attention norms go with it (they fed
only the attention), the MLP stays, and the residual passes through the attention's place:
x -> x + mlp(mlp_norm(x)). That is the layer whose attention output is exactly zero, which is also what llama.cpp's
`deci` graph computes for a layer with n_head = 0 and vLLM's Nemotron-NAS for `attention: {no_op: true}`.

Code that reads attention modules asks `is_dropped(layer.attn)` (or takes `attention_layers(model)`) and skips
those layers; code that does not ask and reaches for a weight gets one AttributeError that names the layer and says
so, never a NoneType error or one from deep inside torch.
"""

from __future__ import annotations

import torch
from torch import nn

from headcount.cache import EmptyKVCache


class NoAttention(nn.Module):
    """What `layers[index].attn` holds once the layer's attention is dropped (see the module doc)."""

    dropped = True
    n_heads = 0
    n_kv_heads = 0
    kept_heads: tuple[int, ...] = ()
    kv_head_of: tuple[int, ...] = ()
    is_uniform = True
    sliding_window = None

    def __init__(self, index: int, head_dim: int, *, d_model: int, dtype=None, device=None):
        super().__init__()
        self.index, self.head_dim, self.d_model = int(index), int(head_dim), int(d_model)
        # no parameters: this empty buffer only follows the model's .to(device / dtype) for the cache it makes
        self.register_buffer("_anchor", torch.empty(0, dtype=dtype, device=device), persistent=False)

    def new_cache(self, batch_size: int, max_len: int, dtype=None) -> EmptyKVCache:
        """A cache of no bytes that counts tokens (the decoder's positions come from cache[0].length)."""
        return EmptyKVCache(batch_size, max_len, self.head_dim, dtype=dtype or self._anchor.dtype,
                            device=self._anchor.device)

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"layers[{self.index}].attn: this layer's attention was dropped (drop-attention); "
                           "the layer passes its input through and never calls it")

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise AttributeError(f"layers[{self.index}].attn was dropped (drop-attention): it has no {name!r}; skip "
                                 "the layers where headcount.models.dropped.is_dropped(layer.attn)") from None

    def extra_repr(self) -> str:
        return f"layer {self.index}: attention dropped, no heads, no K/V cache"


def is_dropped(attn) -> bool:
    """True for a layer's NoAttention (its attention sublayer dropped)."""
    return isinstance(attn, NoAttention)


def dropped_layers(model) -> tuple[int, ...]:
    """Indices of the layers whose attention was dropped."""
    return tuple(i for i, layer in enumerate(model.layers) if is_dropped(getattr(layer, "attn", None)))


def attention_layers(model) -> list[int]:
    """Indices of the layers that still hold attention (what head analysis and head surgery walk)."""
    return [i for i, layer in enumerate(model.layers) if not is_dropped(getattr(layer, "attn", None))]


# why a transformers checkpoint cannot hold the model (after "transformers' LlamaForCausalLM ")
NO_TRANSFORMERS = ("builds attention in every layer and cannot hold an attention-free one: export --to vllm "
                   "(Nemotron-NAS no_op blocks) or --to gguf (llama.cpp's deci), or keep it in headcount's format (save)")


def refuse_dropped(model, what: str) -> None:
    """Raise ValueError naming the dropped layers when `what` cannot run on a model with any (one line)."""
    gone = dropped_layers(model)
    if gone:
        raise ValueError(f"model: layers {list(gone)} have no attention (drop-attention); {what}")
