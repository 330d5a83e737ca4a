"""A layer-by-layer walk through a model, for K/V merging (kv_merge.py, planner.py) and uptraining.

    calibration_batches, Batch, is_decoder     re-exported from headcount.analysis.batches (the one path)
    shard_batches(batches, dp)        data parallelism: this rank's batches (r::world), or rows when too few
    Stream(model, batches, index=)    the residual stream at the input of one layer, batch by batch;
        .layer_io(l, ...)             run layer l, capture its attention's input / kwargs / output
        .advance(l)                   move the stream past layer l
    calibration_loss(model, batches, reference=None) -> float
        decoders: mean next-token NLL (nats); encoders: 1 - mean cosine of the mean-pooled sentence
        embeddings to `reference` (the embeddings of the unmodified model, from sentence_embeddings).

Everything goes through public hooks: forward (pre-)hooks on `model.layers[i]` and
`model.layers[i].attn`, and the layers' own forward with the keyword arguments the model passed to
layer 0 (the rotary hook `qk_transform`, the padding mask). No private attribute is read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headcount.analysis.batches import Batch, calibration_batches, is_decoder  # noqa: F401 (re-exported)

Tensor = torch.Tensor


class _Stop(Exception):
    """Raised by a hook to end a forward once the wanted input has been captured."""


def _run_model(model, batch: Batch):
    if is_decoder(model):
        return model(batch.ids, compute_logits=False)
    return model(batch.ids, batch.mask)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def shard_batches(batches: list[Batch], dp) -> tuple[list[Batch], list[tuple[int, list[int]]]]:
    """This rank's share of the calibration batches under data parallelism (dp: a
    headcount.distributed.DataParallel). With at least as many batches as ranks, whole batches r::world:
    each batch then runs exactly as in one process (a float32 forward of a batch is not bitwise the same
    as of part of it, and the merge's eigenvectors amplify that), so only the float64 sums' order differs.
    With fewer batches, rows: global row w (windows, or sentences for an encoder, counted across the batches
    in order) on rank w % world, kept grouped by the batch they came from (the same padded width). Either
    way a batch-by-batch step (refine.py's Adam steps) can all-reduce the gradient of each global batch.
    Returns (batches, index): index[b] = (global batch number, global rows) of this rank's b-th batch.
    A world of one gets the batches unchanged. More ranks than rows: ValueError."""
    index, start = [], 0
    for slot, batch in enumerate(batches):
        n = batch.ids.shape[0]
        index.append((slot, list(range(start, start + n))))
        start += n
    if dp.world == 1:
        return list(batches), index
    what = "calibration windows" if all(b.mask is None for b in batches) else "calibration sentences"
    dp.shard(range(start), what)  # the error when there are fewer rows than ranks
    if len(batches) >= dp.world:
        return list(batches[dp.rank::dp.world]), index[dp.rank::dp.world]
    out, out_index = [], []
    for batch, (slot, rows) in zip(batches, index):
        mine = [p for p, row in enumerate(rows) if row % dp.world == dp.rank]
        if not mine:
            continue
        sel = torch.tensor(mine, dtype=torch.long, device=batch.ids.device)
        out.append(Batch(batch.ids.index_select(0, sel),
                         None if batch.mask is None else batch.mask.index_select(0, sel)))
        out_index.append((slot, [rows[p] for p in mine]))
    return out, out_index


class Stream:
    """The residual stream of `model` on calibration batches, at the input of one layer at a time.

    index: per batch, (global batch number, global rows), as shard_batches returns it (default: batch b is
    global batch b, rows counted in order); each capture of layer_io carries them as "slot" and "rows"."""

    def __init__(self, model, batches: list[Batch], index: list[tuple[int, list[int]]] | None = None):
        self.model, self.batches = model, batches
        if index is None:
            index, start = [], 0
            for slot, batch in enumerate(batches):
                index.append((slot, list(range(start, start + batch.ids.shape[0]))))
                start += batch.ids.shape[0]
        self.index = index
        self.hidden: list[Tensor] = []
        self.kwargs: list[dict] = []
        layer0 = model.layers[0]

        def grab(module, args, kwargs):
            self.hidden.append(args[0].detach())
            self.kwargs.append({k: v for k, v in kwargs.items() if k != "x"})
            raise _Stop

        handle = layer0.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with torch.no_grad():
                for batch in batches:
                    try:
                        _run_model(model, batch)
                    except _Stop:
                        pass
        finally:
            handle.remove()
        self.layer = 0

    def copy(self) -> "Stream":
        other = Stream.__new__(Stream)
        other.model, other.batches, other.index = self.model, self.batches, self.index
        other.hidden, other.kwargs, other.layer = list(self.hidden), self.kwargs, self.layer
        return other

    def token_mask(self, b: int) -> Tensor | None:
        """[B*T] bool of real tokens in batch b (None: all tokens are real)."""
        mask = self.batches[b].mask
        return None if mask is None else mask.reshape(-1).bool()

    def layer_io(self, layer: int, *, advance: bool = False) -> list[dict]:
        """Run layer `layer` on the stream; per batch: attention input x, its kwargs, its output y,
        and the layer's residual input h. With advance=True the stream moves past the layer; without, the
        layer stops at its attention's output (the MLP after it is not run)."""
        if layer != self.layer:
            raise ValueError(f"layer: the stream stands at layer {self.layer}, not {layer}")
        block = self.model.layers[layer]
        attn = block.attn
        out: list[dict] = []
        current: dict = {}

        def pre(module, args, kwargs):
            current["x"] = args[0].detach()
            current["kwargs"] = dict(kwargs)

        def post(module, args, kwargs, output):
            current["y"] = _first(output).detach()
            if not advance:  # the rest of the block (its MLP) is not needed: the stream stays where it is
                raise _Stop

        handles = [attn.register_forward_pre_hook(pre, with_kwargs=True),
                   attn.register_forward_hook(post, with_kwargs=True)]
        try:
            with torch.no_grad():
                for b, (h, kw) in enumerate(zip(self.hidden, self.kwargs)):
                    current.clear()
                    try:
                        new_h = _first(block(h, **kw))
                    except _Stop:
                        new_h = None
                    out.append({"x": current["x"], "kwargs": current["kwargs"], "y": current["y"], "h": h,
                                "mask": self.token_mask(b), "slot": self.index[b][0], "rows": self.index[b][1]})
                    if advance:
                        self.hidden[b] = new_h.detach()
        finally:
            for handle in handles:
                handle.remove()
        if advance:
            self.layer += 1
        return out

    def advance(self, layer: int) -> None:
        """Move the stream past layer `layer` (no capture)."""
        if layer != self.layer:
            raise ValueError(f"layer: the stream stands at layer {self.layer}, not {layer}")
        block = self.model.layers[layer]
        with torch.no_grad():
            self.hidden = [_first(block(h, **kw)).detach() for h, kw in zip(self.hidden, self.kwargs)]
        self.layer += 1

    def tail_loss(self, reference=None) -> float:
        """The calibration loss of the model from the stream's current layer to the end."""
        hidden = list(self.hidden)
        with torch.no_grad():
            for layer in self.model.layers[self.layer:]:
                hidden = [_first(layer(h, **kw)) for h, kw in zip(hidden, self.kwargs)]
            return _loss_from_hidden(self.model, self.batches, hidden, reference)


def _loss_from_hidden(model, batches: list[Batch], hidden: list[Tensor], reference) -> float:
    if is_decoder(model):
        total, count = 0.0, 0
        for batch, h in zip(batches, hidden):
            h = model.norm(h)
            for start in range(0, h.shape[1] - 1, 256):  # bounded [chunk, vocab] logits
                end = min(start + 256, h.shape[1] - 1)
                logits = model.lm_head(h[:, start:end]).float()
                targets = batch.ids[:, start + 1:end + 1]
                total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                               reduction="sum"))
                count += targets.numel()
        return total / count
    pooled = torch.cat([_pool(h, batch.mask) for h, batch in zip(hidden, batches)])
    if reference is None:
        raise ValueError("reference: an encoder's calibration loss needs the unmodified model's embeddings")
    return float(1.0 - F.cosine_similarity(pooled, reference, dim=-1).mean())


def _pool(hidden: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return hidden.mean(1)
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def sentence_embeddings(model, batches: list[Batch]) -> Tensor | None:
    """Mean-pooled last hidden states [N, d] of an encoder on the batches (None for decoders)."""
    if is_decoder(model):
        return None
    with torch.no_grad():
        return torch.cat([_pool(model(b.ids, b.mask).last_hidden_state, b.mask) for b in batches])


def calibration_loss(model, batches: list[Batch], reference: Tensor | None = None) -> float:
    """Decoders: mean next-token NLL over the batches; encoders: 1 - mean cosine to `reference`."""
    with torch.no_grad():
        if is_decoder(model):
            hidden = [model(b.ids, compute_logits=False).hidden_states for b in batches]
            total, count = 0.0, 0
            for batch, h in zip(batches, hidden):
                for start in range(0, h.shape[1] - 1, 256):
                    end = min(start + 256, h.shape[1] - 1)
                    logits = model.lm_head(h[:, start:end]).float()
                    targets = batch.ids[:, start + 1:end + 1]
                    total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                   reduction="sum"))
                    count += targets.numel()
            return total / count
        pooled = sentence_embeddings(model, batches)
        if reference is None:
            raise ValueError("reference: an encoder's calibration loss needs the unmodified model's embeddings")
        return float(1.0 - F.cosine_similarity(pooled, reference, dim=-1).mean())
