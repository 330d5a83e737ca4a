"""drop_order: which attention sublayers cost least to drop, cheapest first, measured on calibration windows.

by="similarity" (He et al. 2024, "What Matters in Transformers? Not All Attention is Needed", arXiv 2406.15786):
    the mean over calibration tokens of cos(x, x + a), x the residual stream at the layer's input and a what its
    attention sublayer adds to it (DecoderLayer.attention_update: after a post-attention norm and Granite's
    multiplier). The higher the similarity, the less the attention changes the stream, and the earlier it goes.
    One forward pass of the calibration windows, every layer at once.
by="loss": the increase of the calibration next-token loss when that layer's attention ALONE is dropped (the way
    merge_plan measures a merge: the stream below the layer is computed once, only the layers from it up rerun).
    One pass of the model's tail per layer: about n_layers / 2 forward passes.

Both score each layer alone; dropping several ignores how their effects add (the held-out quality of the whole
edit is measured after it, like every edit's). Calibration: the one path (analysis.batches.calibration_batches),
by default "mixed" (half the default corpus's calibration prose, half code-like text), as prune's and merge-kv's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from headcount.arguments import ArgumentError

BY = ("similarity", "loss")
N_WINDOWS = 8  # calibration windows of WINDOW tokens (4,096 tokens): the order is stable well before that
WINDOW = 512


@dataclass
class DropOrder:
    """Layers whose attention may be dropped, cheapest first, with the score each got (see the module doc)."""

    by: str
    layers: list[int]  # cheapest first; only layers that still had attention
    scores: dict[int, float]  # similarity: mean cos(x, x + a) (higher = cheaper); loss: the loss increase (lower)
    n_layers: int  # of the model it was measured on (a reuse on another model is refused)
    calibration_tokens: int = 0
    base_loss: float | None = None  # by="loss": the calibration loss with nothing dropped
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        data = asdict(self)
        data["scores"] = {str(k): v for k, v in self.scores.items()}
        data["seconds"] = round(self.seconds, 3)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "DropOrder":
        data = dict(data)
        data["scores"] = {int(k): float(v) for k, v in data["scores"].items()}
        data["layers"] = [int(i) for i in data["layers"]]
        return cls(**data)


def _check(model, by: str) -> None:
    from headcount.models.decoder import Decoder

    if by not in BY:
        raise ArgumentError("by", f"expected one of {', '.join(BY)}, got {by!r}")
    if not isinstance(model, Decoder):
        raise ValueError(f"model: drop-attention edits decoders (a layer's MLP keeps the residual stream going); "
                         f"this is {type(model).__name__}")


def _batches(model, calibration, n_windows: int, window: int):
    from headcount.analysis.batches import calibration_batches
    from headcount.arguments import positive_int

    positive_int("n_windows", n_windows)
    positive_int("window", window)
    if calibration is None:  # prune's and merge-kv's default: half prose, half code-like text
        calibration = "mixed"
    elif isinstance(calibration, str) and calibration == "prose":
        calibration = None
    return calibration_batches(model, calibration, n_windows=n_windows, window=window, batch_size=2)


def similarity_scores(model, batches, progress: bool = False) -> dict[int, float]:
    """{layer: mean over tokens of cos(x, x + a)} for every layer that still has attention, in one pass."""
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from headcount.models.dropped import attention_layers

    live = attention_layers(model)
    sums = {i: torch.zeros((), dtype=torch.float64) for i in live}
    counts = {i: 0 for i in live}
    inputs: dict[int, torch.Tensor] = {}
    handles = []
    for i in live:
        layer = model.layers[i]

        def pre(module, args, kwargs, i=i):
            inputs[i] = args[0] if args else kwargs["x"]

        def post(module, args, kwargs, output, i=i, layer=layer):
            x = inputs.pop(i)
            a = layer.attention_update(output[0] if isinstance(output, tuple) else output)
            cos = F.cosine_similarity(x.double(), (x + a).double(), dim=-1)  # [B, T]
            sums[i] += cos.sum()
            counts[i] += cos.numel()

        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.attn.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            for batch in tqdm(batches, desc="drop order (similarity)", disable=None if progress else True,
                              leave=False):
                model(batch.ids, attention_mask=batch.mask, compute_logits=False)
    finally:
        for handle in handles:
            handle.remove()
    return {i: float(sums[i] / max(counts[i], 1)) for i in live}


@contextmanager
def without_attention(layer):
    """Layer's attention dropped for the duration, then put back exactly (the same modules)."""
    saved = (layer.attn, layer.attn_norm, layer.post_attn_norm)
    layer.drop_attention()
    try:
        yield
    finally:
        layer.attn, layer.attn_norm, layer.post_attn_norm = saved


def loss_scores(model, batches, progress: bool = False) -> tuple[float, dict[int, float]]:
    """(base calibration loss, {layer: loss increase when only its attention is dropped})."""
    from tqdm.auto import tqdm

    from headcount.models.dropped import is_dropped
    from headcount.surgery.merging.stream import Stream

    stream = Stream(model, batches)
    base = stream.tail_loss()
    scores = {}
    for i in tqdm(range(len(model.layers)), desc="drop order (loss)", disable=None if progress else True,
                  leave=False):
        layer = model.layers[i]
        if not is_dropped(layer.attn):
            with without_attention(layer):
                scores[i] = stream.tail_loss() - base
        stream.advance(i)
    return base, scores


def drop_order(model, by: str = "similarity", calibration=None, n_windows: int = N_WINDOWS, *, window: int = WINDOW,
               progress: bool = False) -> DropOrder:
    """The layers whose attention may be dropped, cheapest first (see the module doc). Reads the model only."""
    _check(model, by)
    start = time.perf_counter()
    batches = _batches(model, calibration, n_windows, window)
    tokens = sum(b.ids.numel() for b in batches)
    was_training = model.training
    model.eval()
    try:
        if by == "similarity":
            scores, base = similarity_scores(model, batches, progress), None
            layers = sorted(scores, key=lambda i: (-scores[i], i))
        else:
            base, scores = loss_scores(model, batches, progress)
            layers = sorted(scores, key=lambda i: (scores[i], i))
    finally:
        model.train(was_training)
    return DropOrder(by, layers, scores, len(model.layers), tokens, base, time.perf_counter() - start)
