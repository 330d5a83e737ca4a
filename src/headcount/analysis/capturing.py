"""capture(): attention weights one layer at a time, through the public need_weights path.

    for layer, weights in capture(model, batch):        # weights [B, n_heads, T, S], one layer alive
        ...
    capture(model, batch, summaries=fn)                  # {layer: fn(layer, weights)}, one forward

How: a forward pre-hook on the public `model.layers[i].attn` (a headcount MultiHeadAttention) adds
`need_weights=True` to that one call (the eager path; the rest of the model keeps the fused path), and
a forward hook takes `output.weights` off the result, hands it over, and returns the output with
`weights=None`, so nothing downstream keeps a reference. Rotary models need nothing special: the
attention module receives its `qk_transform` in the same call the hook amends.

The generator form runs the forward in a worker thread that waits after each captured layer until
the consumer asks for the next one: only one layer's weights exist at a time (`headcount bench
capture` measures it). Closing the generator early aborts the forward. The summaries form is the
same hook with a callback, no thread.

Weights of padded keys are 0; rows of padded queries (encoders) are meaningless, as in the model.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Sequence

import torch

Tensor = torch.Tensor


class _Abort(Exception):
    """Raised inside the forward when the consumer closed the generator."""


def attention_modules(model) -> list:
    """model.layers[i].attn for every layer; a clear error for a model that cannot return weights."""
    from headcount.attention import MultiHeadAttention

    layers = getattr(model, "layers", None)
    if layers is None or not hasattr(layers, "__len__") or len(layers) == 0:
        raise ValueError(f"model: expected a headcount model with layers[i].attn (a MultiHeadAttention) that "
                         f"can return attention weights, got {type(model).__name__}")
    mods = [getattr(layer, "attn", None) for layer in layers]
    bad = [i for i, m in enumerate(mods) if not isinstance(m, MultiHeadAttention)]
    if bad:
        raise ValueError(f"model: cannot return attention weights: layers[{bad[0]}].attn is "
                         f"{type(mods[bad[0]]).__name__}, not a headcount MultiHeadAttention")
    return mods


def check_layers(model, layers: Sequence[int] | None) -> list[int]:
    """Layer indices, checked against the model (None = all); negative indices count from the end."""
    n = len(attention_modules(model))
    if layers is None:
        return list(range(n))
    if isinstance(layers, int):
        layers = [layers]
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layers: expected ints, got {layer!r}")
        if not -n <= layer < n:
            raise ValueError(f"layers: layer {layer} is out of range for a model with {n} layers (0..{n - 1})")
        out.append(layer % n)
    return sorted(set(out))


def split_batch(batch) -> tuple[Tensor, Tensor | None]:
    """batch: input_ids [B, T] or (input_ids, attention_mask)."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        ids, mask = batch
    else:
        ids, mask = batch, None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int):
        shape = list(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"batch: expected input_ids [B, T] (a long tensor) or (input_ids, attention_mask), got {shape}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != ids.shape):
        raise ValueError(f"batch: attention_mask must have input_ids' shape {list(ids.shape)}")
    return ids, mask


def run_model(model, ids: Tensor, mask: Tensor | None):
    """One forward for any headcount model (decoders skip the lm_head)."""
    from headcount.analysis.batches import is_decoder

    if is_decoder(model):
        return model(ids, attention_mask=mask, compute_logits=False)
    return model(ids, mask)


def _hooks(model, layers: list[int], deliver: Callable[[int, Tensor], None]) -> list:
    mods = attention_modules(model)
    handles = []
    for i in layers:
        def pre(module, args, kwargs):
            kwargs = dict(kwargs)
            kwargs["need_weights"] = True
            return args, kwargs

        def post(module, args, kwargs, output, _i=i):
            weights = output.weights
            if weights is None:
                raise ValueError(f"model: layers[{_i}].attn returned no weights with need_weights=True")
            deliver(_i, weights)
            return output._replace(weights=None)

        handles.append(mods[i].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mods[i].register_forward_hook(post, with_kwargs=True))
    return handles


def capture(model, batch, *, layers: Sequence[int] | None = None,
            summaries: Callable[[int, Tensor], object] | None = None):
    """Per-layer attention weights [B, n_heads, T, S] of `batch`, one layer at a time.

    batch: input_ids [B, T] or (input_ids, attention_mask [B, T], True/1 = a real token).
    layers: which layers (None = all).
    summaries: None -> a generator of (layer, weights) in layer order, each weights tensor handed over
        as soon as its layer has run (one layer's weights alive at a time if the consumer drops it);
        a callable fn(layer, weights) -> value -> {layer: value} after one forward.
    No gradients are taken.
    """
    ids, mask = split_batch(batch)
    chosen = check_layers(model, layers)
    if summaries is not None:
        if not callable(summaries):
            raise TypeError(f"summaries: expected a callable (layer, weights) -> value, got {type(summaries).__name__}")
        results: dict[int, object] = {}

        def deliver(layer, weights):
            results[layer] = summaries(layer, weights)

        handles = _hooks(model, chosen, deliver)
        try:
            with torch.no_grad():
                run_model(model, ids, mask)
        finally:
            for h in handles:
                h.remove()
        return results
    return _stream(model, ids, mask, chosen)


def _stream(model, ids: Tensor, mask: Tensor | None, chosen: list[int]) -> Iterator[tuple[int, Tensor]]:
    handoff: queue.Queue = queue.Queue(maxsize=1)
    resume = threading.Semaphore(0)
    stop = threading.Event()
    done = object()

    def deliver(layer, weights):
        handoff.put((layer, weights))
        resume.acquire()  # wait until the consumer asks for the next layer
        if stop.is_set():
            raise _Abort()

    def worker():
        try:
            with torch.no_grad():
                run_model(model, ids, mask)
            handoff.put(done)
        except _Abort:
            handoff.put(done)
        except BaseException as err:  # handed to the consumer, raised there
            handoff.put(err)

    handles = _hooks(model, chosen, deliver)
    thread = threading.Thread(target=worker, name="headcount-capture", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            del item
            resume.release()
    finally:
        stop.set()
        resume.release()
        # drain so a worker blocked in put() or acquire() can finish
        while thread.is_alive():
            try:
                handoff.get(timeout=0.05)
            except queue.Empty:
                pass
            resume.release()
        thread.join()
        for h in handles:
            h.remove()
