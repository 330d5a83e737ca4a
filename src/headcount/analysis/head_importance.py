"""Head importance: `importance(model, texts=None, method="gradient") -> HeadScores`.

Methods (higher score = more important; every score is a mean over calibration tokens / sentences):

  gradient        Michel et al. 2019. A gate xi_{h,t} = 1 on head h at the input of o_proj at position
                  t; I_h = mean over positions t of |dL/dxi_{h,t}| = |<context_{t,h}, dL/dcontext_{t,h}>|,
                  L = the window's summed next-token cross-entropy. One forward and one backward per
                  batch for all heads (autograd.grad to the o_proj inputs only: no weight gradients).
                  normalize=True divides each layer by its L2 norm (the paper's default).
                  On an encoder the fidelity loss has zero gradient at the unmodified model, so the
                  score is the second-order (Gauss-Newton) term instead: I_h = E_sentences 1/2 ||d e / d
                  xi_h||^2 (e = the normalised sentence embedding, xi_h a per-sentence gate), estimated
                  with `probes` random Gaussian probes v (E (v . J)^2 = ||J||^2), one backward each
                  (probes=None: exact, one backward per embedding dim). It
                  predicts ablation's 1 - cos (tests check it tracks ablation on minilm).
  ablation        The exact loss increase with head h gated to 0 (mean NLL per token on a decoder,
                  mean 1 - cos on an encoder). `heads_per_forward` heads of one layer per forward: the
                  layers below run once, then the batch is repeated (a pre-hook on that layer) into one
                  replica per head, each with its head off (per-example gates [B, n_heads]). The truth.
  confidence      Voita et al. 2019: mean over query tokens of the head's largest attention weight,
                  the first token left out (as a key: the attention sink / [CLS]; and as a query).
  reconstruction  The retraining-free order for pruning WITH a least-squares refit of o_proj
                  (refit.py): per layer, the Gram statistics of o_proj's inputs; removing head h and
                  refitting o_proj on the rest (ridge, closed form) leaves a residual r on the layer's
                  output; its effect on the loss is estimated by the second-order Taylor term
                  1/2 sum_j F_j RSS_j / N with F_j the diagonal (empirical / Gauss-Newton) Fisher of the
                  loss w.r.t. the layer's attention output (estimator="second"; "first" adds nothing
                  but the first-order term g.r, "both" sums them). Within a layer heads are removed
                  greedily (the cheapest given the ones already gone); a head's score is its marginal
                  cost in that sequence (made non-decreasing), so order() interleaves the layers'
                  greedy sequences by marginal cost.
                  Why "second": at the unmodified model the refit residual is what the kept heads cannot
                  express, and its cost is a curvature effect (for an encoder the first-order term is
                  exactly zero); the first-order term g.r is signed and noisy per head. A check of the
                  estimators against the true loss after prune-and-refit on a separate calibration
                  subset was started but not finished in the time available;
                  `estimator=` keeps the alternatives available for that comparison.

Data-parallel (group=): with a torch.distributed process group (or "auto" = the default group when
initialised), rank r scores windows / sentences r::world and the float64 SUMS are all-reduced
before dividing, so every rank returns the single-process scores (to float64 summation order).

Benchmarks: `cost_ratio(model)` (time of gradient / ablation per batch over a plain forward) and
`agreement(model)` (Spearman of each method against ablation) return dicts.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import lru_cache
from typing import Sequence

import torch

from headcount.analysis import grad_memory, objectives
from headcount.analysis.batches import sentence_batches, split_sentences, token_windows
from headcount.analysis.refit import DEFAULT_RIDGE, GramStats, RemovalSequence
from headcount.analysis.scores import HeadScores

Tensor = torch.Tensor

METHODS = ("gradient", "ablation", "confidence", "reconstruction")
ESTIMATORS = ("second", "first", "both")
DEFAULT_SOURCE = "default corpus: calibration"
_PROBE_SEED = 20190517


# ------------------------------------------------------------------------------------------- inputs
class _Batch:
    """ids [B, T], mask [B, T] or None, idx [B] global item indices (for probe seeds)."""

    def __init__(self, ids: Tensor, mask: Tensor | None, idx: Tensor):
        self.ids, self.mask, self.idx = ids, mask, idx

    @property
    def size(self) -> int:
        return self.ids.shape[0]


class _Group:
    """The data-parallel process group (or none): shard items, all-reduce float64 sums
    (headcount.distributed.DataParallel, keeping importance's summation dtype)."""

    def __init__(self, group):
        from headcount.distributed import DataParallel

        self._dp = DataParallel(group)
        self.group, self.rank, self.world = self._dp.group, self._dp.rank, self._dp.world

    def sum(self, t: Tensor) -> Tensor:
        return self._dp.sum(t).to(t.dtype) if self.world > 1 else t


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def _inputs(model, texts, windows, *, window: int, max_windows: int | None, max_sentences: int,
            batch_size: int, part: str, shard: _Group) -> tuple[list[_Batch], int]:
    """Shard the items r::world, then batch them. Returns (batches, total items over all ranks)."""
    device = model.embed.weight.device
    if objectives.is_decoder(model):
        if windows is None:  # the one calibration path: None, "mixed", a text or texts -> windows
            from headcount.analysis.batches import calibration_batches
            windows = torch.cat([b.ids.cpu() for b in calibration_batches(
                model, texts, n_windows=max_windows or 10**9, window=window, part=part)])
        if not isinstance(windows, Tensor) or windows.dim() != 2 or windows.dtype != torch.long:
            raise ValueError("windows: expected a LongTensor [N, T] of token windows for a decoder")
        if windows.shape[1] < 2 or windows.shape[0] == 0:
            raise ValueError(f"windows: expected at least one window of >= 2 tokens, got {list(windows.shape)}")
        idx = torch.arange(windows.shape[0])[shard.rank::shard.world]
        mine = windows[idx]
        batches = [_Batch(mine[i:i + batch_size].to(device), None, idx[i:i + batch_size])
                   for i in range(0, len(idx), batch_size)]
        return batches, windows.shape[0]
    # encoder: sentences (or given (ids, mask) batches)
    if windows is None:
        sentences = split_sentences(texts, part=part, max_sentences=max_sentences)
        if not sentences:
            raise ValueError("texts: no sentence of at least 4 words found")
        ids_masks = sentence_batches(model, sentences, batch_size=len(sentences),
                                     max_len=min(window, model.config.max_position))
        windows = ids_masks
    if isinstance(windows, Tensor):
        windows = [(windows, torch.ones_like(windows))]
    rows_ids, rows_mask = [], []
    for ids, mask in windows:
        rows_ids.extend(ids.unbind(0))
        rows_mask.extend((torch.ones_like(ids) if mask is None else mask).unbind(0))
    total = len(rows_ids)
    if total == 0:
        raise ValueError("windows: expected at least one sentence")
    mine = list(range(shard.rank, total, shard.world))
    batches = []
    for i in range(0, len(mine), batch_size):
        sel = mine[i:i + batch_size]
        mask = torch.stack([rows_mask[j] for j in sel])
        length = int(mask.sum(1).max())  # trim padding shared by the whole batch
        ids = torch.stack([rows_ids[j] for j in sel])[:, :length]
        batches.append(_Batch(ids.to(device), mask[:, :length].to(device), torch.tensor(sel)))
    return batches, total


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=None if enabled else True, leave=False)


@contextmanager
def _o_proj_io(model, want_output: bool = False):
    """Capture each layer's o_proj input (and output) of the current forward, graph kept."""
    inputs: dict[int, Tensor] = {}
    outputs: dict[int, Tensor] = {}
    handles = []
    for i, layer in enumerate(model.layers):
        handles.append(layer.attn.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: inputs.__setitem__(i, args[0]) or None))
        if want_output:
            handles.append(layer.attn.o_proj.register_forward_hook(
                lambda m, args, out, i=i: outputs.__setitem__(i, out) or None))
    try:
        yield inputs, outputs
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _replicate_from(model, layer: int, k: int):
    """Repeat the batch k times at the input of model.layers[layer] (forward pre-hooks on the public
    layers, which also repeat a padding mask): the layers below run once, the rest on k * B rows."""
    def hook(first: bool):
        def pre(module, args, kwargs):
            if first:
                args = (args[0].repeat(k, 1, 1),) + tuple(args[1:])
            mask = kwargs.get("key_padding_mask")  # every layer gets the model's [B, S] padding mask
            if mask is not None:
                kwargs = dict(kwargs, key_padding_mask=mask.repeat(k, 1))
            return args, kwargs
        return pre

    handles = [model.layers[i].register_forward_pre_hook(hook(i == layer), with_kwargs=True)
               for i in range(layer, len(model.layers))] if k > 1 else []
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _heads_per_layer(model) -> tuple[int, ...]:
    return tuple(layer.attn.n_heads for layer in model.layers)


def _probe(batch: _Batch, p: int, dim: int, device, dtype) -> Tensor:
    """[B, dim] Gaussian probes, fixed by (global item index, probe number): shard-independent."""
    rows = []
    for i in batch.idx.tolist():
        g = torch.Generator().manual_seed(_PROBE_SEED + 7919 * int(i) + p)
        rows.append(torch.randn(dim, generator=g, dtype=torch.float64))
    return torch.stack(rows).to(device=device, dtype=dtype)


def _gate_grads(ctx: Tensor, grad: Tensor, n_heads: int) -> Tensor:
    """[B, T, n_heads] per-position gate derivatives <context_{t,h}, dL/dcontext_{t,h}>."""
    b, t, _ = ctx.shape
    return (ctx.detach() * grad).view(b, t, n_heads, -1).sum(-1).double()


# ----------------------------------------------------------------------------------------- methods
def _gradient(model, batches, hpl, group: _Group, probes: int, progress: bool):
    decoder = objectives.is_decoder(model)
    sums = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    with _progress(len(batches), "gradient importance", progress) as bar:
        for batch in batches:
            with torch.enable_grad(), _o_proj_io(model) as (ctx, _):
                scored = objectives.scored_positions(batch.ids, batch.mask, decoder)
                if decoder:
                    loss = objectives.require_finite(objectives.lm_nll(model, batch.ids).sum(), "the loss",
                                                     model.embed.weight.dtype)
                    grads = torch.autograd.grad(loss, [ctx[i] for i in range(len(hpl))])
                    for i, n in enumerate(hpl):
                        gp = _gate_grads(ctx[i], grads[i], n).abs()
                        sums[i, :n] += (gp * scored[..., None]).sum((0, 1)).cpu()
                    count += float(scored.sum())
                else:
                    emb = objectives.pooled(model, batch.ids, batch.mask)
                    n_probes = emb.shape[-1] if probes is None else probes
                    for p in range(n_probes):
                        if probes is None:  # exact: the basis vectors, sum_i (e_i . J)^2 = ||J||^2
                            v = torch.zeros_like(emb)
                            v[:, p] = 1.0
                        else:
                            v = _probe(batch, p, emb.shape[-1], emb.device, emb.dtype)
                        grads = torch.autograd.grad((v * emb).sum(), [ctx[i] for i in range(len(hpl))],
                                                    retain_graph=p + 1 < n_probes)
                        for i, n in enumerate(hpl):
                            per_sentence = (_gate_grads(ctx[i], grads[i], n) * scored[..., None]).sum(1)
                            sums[i, :n] += (0.5 * per_sentence ** 2).sum(0).cpu() / (
                                1 if probes is None else probes)
                    count += batch.size
            grad_memory.release_free_memory()  # what the batch's backward freed
            bar.update(1)
    sums, count = group.sum(sums.to(model.embed.weight.device)).cpu(), float(group.sum(count.to(sums.device)))
    return sums / count, count


def _ablation(model, batches, hpl, group: _Group, heads_per_forward: int, progress: bool):
    decoder = objectives.is_decoder(model)
    sums = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    # chunks of heads of ONE layer: the layers below run once on the batch, then it is repeated
    chunks = [[(l, h) for h in range(i, min(i + heads_per_forward, n))]
              for l, n in enumerate(hpl) for i in range(0, n, heads_per_forward)]
    with torch.no_grad(), _progress(len(batches) * len(chunks), "ablation importance", progress) as bar:
        for batch in batches:
            b = batch.size
            if decoder:
                base = objectives.lm_nll(model, batch.ids)  # [B]
                count += b * (batch.ids.shape[1] - 1)
            else:
                ref = objectives.pooled(model, batch.ids, batch.mask)
                count += b
            for chunk in chunks:
                k = len(chunk)
                gates: list = [None] * len(hpl)
                layer = chunk[0][0]
                gates[layer] = torch.ones(k * b, hpl[layer], device=batch.ids.device, dtype=model.embed.weight.dtype)
                for j, (_, h) in enumerate(chunk):
                    gates[layer][j * b:(j + 1) * b, h] = 0.0
                with _replicate_from(model, layer, k):
                    if decoder:
                        inc = (objectives.lm_nll(model, batch.ids, gates, replicas=k).view(k, b) - base).sum(1)
                    else:
                        emb = objectives.pooled(model, batch.ids, batch.mask, gates, replicas=k)
                        inc = objectives.fidelity(emb, ref.repeat(k, 1)).view(k, b).sum(1)
                for j, (l, h) in enumerate(chunk):
                    sums[l, h] += float(inc[j])
                bar.update(1)
    sums, count = group.sum(sums.to(model.embed.weight.device)).cpu(), float(group.sum(count.to(sums.device)))
    return sums / count, count


def _confidence(model, batches, hpl, group: _Group, progress: bool):
    decoder = objectives.is_decoder(model)
    sums = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    with torch.no_grad(), _progress(len(batches), "confidence", progress) as bar:
        for batch in batches:
            if decoder:
                weights = model(batch.ids, need_weights=True, compute_logits=False).weights
                queries = torch.ones(batch.ids.shape, dtype=torch.bool, device=batch.ids.device)
            else:
                weights = model(batch.ids, batch.mask, need_weights=True).weights
                queries = batch.mask.bool().clone()
            queries = queries[:, 1:]  # the first token is left out as a query ...
            for i, (w, n) in enumerate(zip(weights, hpl)):
                top = w[:, :, 1:, 1:].amax(-1).double()  # ... and as a key: [B, n, T-1]
                sums[i, :n] += (top * queries[:, None, :]).sum((0, 2)).cpu()
            count += float(queries.sum())
            bar.update(1)
    sums, count = group.sum(sums.to(model.embed.weight.device)).cpu(), float(group.sum(count.to(sums.device)))
    return sums / count, count


def _own_output_moments(attn, xtx: Tensor) -> tuple[Tensor, Tensor]:
    """X1^T Y [D+1, d_model] and sum_t y^2 [d_model] of o_proj's own output Y = X W^T + b, from X1^T X1 and
    the weights in float64: exact, and neither sum is held per layer during the backward (on a 1.5B model the
    two would add 1.1 GB to the 0.5 GB of Gram matrices)."""
    w = attn.o_proj.weight.detach().to(device=xtx.device, dtype=torch.float64)
    b = attn.o_proj.bias
    b = torch.zeros(w.shape[0], dtype=torch.float64, device=xtx.device) if b is None else \
        b.detach().to(device=xtx.device, dtype=torch.float64)
    beta = torch.cat([w.T, b[None]], 0)  # [D+1, d_model]
    xty = xtx @ beta
    return xty, (xty * beta).sum(0)


def _reconstruction_stats(model, batches, hpl, group: _Group, probes: int, progress: bool,
                          first_order: bool = True):
    """Per layer, summed over tokens in float64 (and over ranks): [X1^T X1 packed (_upper), the Fisher diagonal
    F [d_model] of the loss w.r.t. the layer's attention output, the token count] and, when `first_order`,
    [X1^T G [D+1, d_model], sum g.y]. _layer_stats turns one layer's into GramStats.

    Only X1^T X1 is summed over tokens: o_proj's targets are its own outputs, so X1^T Y and Y^T Y follow from
    it and the weights (_own_output_moments). It is kept as its upper triangle (half the bytes: 0.26 GB for
    every layer of the 1.5B model), and the order unpacks one layer at a time."""
    decoder = objectives.is_decoder(model)
    first_order = first_order and decoder
    n_layers = len(hpl)
    acc: dict[int, list] = {}
    with _progress(len(batches), "reconstruction statistics", progress) as bar:
        for batch in batches:
            with torch.enable_grad(), _o_proj_io(model, want_output=True) as (ctx, out):
                tokens = batch.mask.reshape(-1).bool() if batch.mask is not None else None
                if decoder:
                    loss = objectives.require_finite(objectives.lm_nll(model, batch.ids).sum(), "the loss",
                                                     model.embed.weight.dtype)
                    gs = [torch.autograd.grad(loss, [out[i] for i in range(n_layers)])]
                else:
                    emb = objectives.pooled(model, batch.ids, batch.mask)
                    gs = []
                    for p in range(probes):
                        v = _probe(batch, p, emb.shape[-1], emb.device, emb.dtype)
                        gs.append(torch.autograd.grad((v * emb).sum(), [out[i] for i in range(n_layers)],
                                                      retain_graph=p + 1 < probes))
                for i in range(n_layers):
                    x = ctx[i].detach().reshape(-1, ctx[i].shape[-1]).double()
                    g = [gg[i].reshape(-1, gg[i].shape[-1]).double() for gg in gs]
                    if tokens is not None:
                        x, g = x[tokens], [gg[tokens] for gg in g]
                    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)
                    fisher = sum((gg ** 2).sum(0) for gg in g) / len(g)
                    parts = [_upper(x1.T @ x1), fisher,
                             torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)]
                    if first_order:
                        y = out[i].detach().reshape(-1, out[i].shape[-1]).double()
                        y = y[tokens] if tokens is not None else y
                        parts += [x1.T @ g[0], (g[0] * y).sum()]
                    if i in acc:
                        for a, b in zip(acc[i], parts):
                            a.add_(b)
                    else:
                        acc[i] = parts
                    del x, x1, g, parts
            grad_memory.release_free_memory()  # what the batch's backward freed
            bar.update(1)
    return {i: [group.sum(t).cpu() for t in acc.pop(i)] for i in range(n_layers)}  # summed over ranks, packed


def _upper(a: Tensor) -> Tensor:
    """The upper triangle of a symmetric [n, n] matrix, row by row, as one [n (n + 1) / 2] vector."""
    rows, cols = _triu(a.shape[0], a.device)
    return a[rows, cols]


@lru_cache(maxsize=4)
def _triu(n: int, device) -> tuple[Tensor, Tensor]:
    """torch.triu_indices(n, n), made once per width (every batch packs every layer's Gram matrix)."""
    return tuple(torch.triu_indices(n, n, device=device))


def _symmetric(packed: Tensor) -> Tensor:
    """The [n, n] symmetric matrix whose upper triangle `packed` holds (the inverse of _upper)."""
    n = int(round(((8 * packed.numel() + 1) ** 0.5 - 1) / 2))
    rows, cols = _triu(n, packed.device)
    out = packed.new_empty(n, n)
    out[rows, cols] = packed
    out[cols, rows] = packed
    return out


def _layer_stats(attn, sums: list, first_order: bool):
    """One layer's (GramStats, fisher, X1^T G, sum g.y) from its packed sums (_reconstruction_stats)."""
    xtx = _symmetric(sums[0])
    xty, yty = _own_output_moments(attn, xtx)
    xtg, gy = (sums[3], float(sums[4])) if first_order else (None, 0.0)
    return GramStats(xtx, xty, yty, int(sums[2])), sums[1], xtg, gy


def _first_order(stats: GramStats, heads: list[list[int]], xtg: Tensor, gy: float, lam: float) -> Tensor:
    """[H] first-order loss change sum_t g_t . (Y_new - Y)_t when each head is removed and o_proj refit."""
    d = stats.n_inputs
    idx = torch.tensor(sorted(c for cols in heads for c in cols) + [d], dtype=torch.long)
    a = stats.xtx[idx][:, idx].clone()
    a.diagonal().add_((idx != d).double() * lam)
    pinv = torch.linalg.inv(a)
    beta = pinv @ stats.xty[idx]
    g = xtg[idx]
    pos = {int(c): k for k, c in enumerate(idx.tolist())}
    out = torch.empty(len(heads), dtype=torch.float64)
    for h, cols in enumerate(heads):
        s = torch.tensor([pos[c] for c in cols], dtype=torch.long)
        delta = pinv[:, s] @ torch.linalg.solve(pinv[s][:, s], beta[s])  # beta - b_new, rows idx
        b_new = beta - delta
        out[h] = float((b_new * g).sum()) - gy
    return out


def _first_order_kept(stats: GramStats, cols: list[int], xtg: Tensor, gy: float, lam: float) -> float:
    """First-order loss change of replacing o_proj by its ridge refit on all `cols` (nothing removed)."""
    d = stats.n_inputs
    idx = torch.tensor(sorted(cols) + [d], dtype=torch.long)
    a = stats.xtx[idx][:, idx].clone()
    a.diagonal().add_((idx != d).double() * lam)
    beta = torch.linalg.solve(a, stats.xty[idx])
    return float((beta * xtg[idx]).sum()) - gy


def _reconstruction(model, batches, hpl, group: _Group, probes: int, ridge: float, estimator: str,
                    progress: bool, greedy: bool = True):
    decoder = objectives.is_decoder(model)
    per_layer = _reconstruction_stats(model, batches, hpl, group, probes, progress,
                                       first_order=estimator in ("first", "both"))
    scores = torch.full((len(hpl), max(hpl)), float("nan"), dtype=torch.float64)
    n_tokens = 0
    dh = model.layers[0].attn.head_dim
    for i, n in enumerate(hpl):
        stats, fisher, xtg, gy = _layer_stats(model.layers[i].attn, per_layer.pop(i), estimator in ("first", "both"))
        n_tokens = stats.n_tokens
        norm = max(stats.n_tokens, 1)
        weights = 0.5 * fisher / norm  # 1/2 F_j (per token) per output dim
        lam = DEFAULT_RIDGE * float(stats.xtx.diagonal()[:-1].mean()) if ridge is None else \
            ridge * float(stats.xtx.diagonal()[:-1].mean())
        remaining = list(range(n))
        r = DEFAULT_RIDGE if ridge is None else ridge
        all_cols = list(range(n * dh))
        # the second-order term's refits along the greedy sequence: one inverse per layer, downdated per removal
        seq = (RemovalSequence(stats, [list(range(h * dh, (h + 1) * dh)) for h in remaining], ridge=r,
                               weights=weights) if estimator in ("second", "both") else None)
        previous = 0.0  # the estimate with every head kept (the ridge refit is not exactly o_proj)
        if seq is not None:
            previous += seq.objective() / norm
        if estimator in ("first", "both") and decoder:
            previous += _first_order_kept(stats, all_cols, xtg, gy, lam) / norm
        running = -float("inf")
        marginal: dict[int, float] = {}
        while remaining:
            cols = [list(range(h * dh, (h + 1) * dh)) for h in remaining]
            value = torch.zeros(len(remaining), dtype=torch.float64)
            if seq is not None:
                value += seq.errors() / norm
            if estimator in ("first", "both") and decoder:
                value += _first_order(stats, cols, xtg, gy, lam) / norm
            if not greedy:  # one step: each head's cost when it alone is removed
                for h, v in zip(remaining, value.tolist()):
                    marginal[h] = v - previous
                break
            j = int(torch.argmin(value))  # ties: the lowest head index
            h = remaining.pop(j)
            if seq is not None:
                seq.remove(j)
            cost = float(value[j])
            running = max(running, cost - previous)  # non-decreasing along the layer's sequence
            marginal[h] = running
            previous = cost
        for h, c in marginal.items():
            scores[i, h] = c
    return scores, n_tokens


# ------------------------------------------------------------------------------------------- entry
def importance(model, texts: str | Sequence[str] | None = None, method: str = "gradient", *,
               window: int = 512, max_windows: int | None = 16, batch_size: int | None = None,
               normalize: bool = False, group=None, progress: bool = True, windows=None,
               max_sentences: int = 256, heads_per_forward: int | None = None, probes: int | None = 4,
               ridge: float | None = None, estimator: str = "second", greedy: bool = True,
               source: str | None = None,
               part: str = "calibration", activation_budget: int | None = None) -> HeadScores:
    """Score every head of `model` (see the module docstring for the methods).

    texts: a string or list of strings; None = the calibration part of the default corpus.
    window, max_windows: decoder token windows (at most max_windows windows of `window` tokens);
        on an encoder `window` caps the sentence length and max_sentences the number of sentences.
    windows: precomputed inputs instead of texts (a LongTensor [N, T] for a decoder; a LongTensor or
        a list of (input_ids, attention_mask) batches for an encoder).
    batch_size: windows (decoder) or sentences (encoder) per forward; None = a per-method default.
    group: None, "auto" or a torch.distributed process group (data-parallel scoring).
    activation_budget: bytes the gradient / reconstruction backward may keep (None = grad_memory's default);
        layers are checkpointed to fit it. info["memory"] says how many; info["forward_equivalents"] the cost.
    reconstruction only: ridge (relative, default refit.DEFAULT_RIDGE), estimator ("second" | "first" |
        "both"), greedy (False: each head's cost when removed alone, no sequence).
    """
    from headcount.models.dropped import refuse_dropped
    refuse_dropped(model, "importance scores the heads of every layer (hooks on each o_proj); score the model "
                   "before dropping attention")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator: expected one of {ESTIMATORS}, got {estimator!r}")
    decoder = objectives.is_decoder(model)
    if method == "reconstruction" and estimator == "first" and not decoder:
        raise ValueError("estimator: 'first' is zero on an encoder (the fidelity gradient vanishes); use 'second'")
    _check_int("window", window, 2)
    if max_windows is not None:
        _check_int("max_windows", max_windows)
    if probes is not None:
        _check_int("probes", probes)
    if batch_size is None:
        batch_size = 1 if decoder else 32  # decoders: one window a batch (a backward keeps half of two's activations)
    _check_int("batch_size", batch_size)
    if heads_per_forward is None:  # every head of a layer in one forward
        heads_per_forward = max(layer.attn.n_heads for layer in model.layers)
    _check_int("heads_per_forward", heads_per_forward)
    if ridge is not None and (isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or ridge < 0):
        raise ValueError(f"ridge: expected a float >= 0, got {ridge!r}")
    shard = _Group(group)
    batches, _ = _inputs(model, texts, windows, window=window, max_windows=max_windows,
                         max_sentences=max_sentences, batch_size=batch_size, part=part, shard=shard)
    hpl = _heads_per_layer(model)
    was_training = model.training
    model.eval()
    try:
        info: dict = {}
        if method in ("gradient", "reconstruction"):  # frozen weights, layers checkpointed to fit the budget
            shape = (max((b.ids.shape[0] for b in batches), default=1),  # a rank may hold none
                     max((b.ids.shape[1] for b in batches), default=2))
            with grad_memory.gradient_pass(model, shape, activation_budget) as memory:
                if method == "gradient":
                    scores, count = _gradient(model, batches, hpl, shard, probes, progress)
                else:
                    scores, count = _reconstruction(model, batches, hpl, shard, probes, ridge, estimator,
                                                    progress, greedy)
            info["memory"] = memory
            backwards = 1 if decoder else (model.config.d_model if probes is None else probes)
            info["forward_equivalents"] = round(1.0 + backwards * (memory["forward_equivalents"] - 1.0), 3)
        if method == "gradient":
            info["loss"] = "next-token cross-entropy" if decoder else \
                "embedding fidelity, second-order (Gauss-Newton) term with random probes"
            if not decoder:
                info["probes"] = "exact" if probes is None else probes
        elif method == "ablation":
            scores, count = _ablation(model, batches, hpl, shard, heads_per_forward, progress)
            info["loss"] = "mean next-token NLL increase (nats)" if decoder else "mean 1 - cos increase"
        elif method == "confidence":
            scores, count = _confidence(model, batches, hpl, shard, progress)
            info["forward_equivalents"] = 1.0
        else:
            info.update(estimator=estimator, ridge=DEFAULT_RIDGE if ridge is None else ridge, greedy=greedy)
    finally:
        model.train(was_training)
    if not decoder and method in ("gradient", "ablation"):  # means over sentences; report tokens too
        info["n_sentences"] = int(count)
        tokens = torch.tensor(float(sum(int(b.mask.sum()) for b in batches)), dtype=torch.float64,
                              device=model.embed.weight.device)
        count = float(shard.sum(tokens))
    scores = scores.clone()
    for i, n in enumerate(hpl):
        scores[i, n:] = float("nan")
    if source is None:
        source = f"default corpus: {part}" if texts is None and windows is None else \
            ("given windows" if windows is not None else "given text")
    result = HeadScores(scores, method, source, int(count), hpl,
                        tuple(tuple(layer.attn.kept_heads) for layer in model.layers), False,
                        getattr(model, "name", None), info)
    return result.normalize() if normalize else result


# -------------------------------------------------------------------------------------- benchmarks
def _one_batch(model, window: int, texts=None):
    if objectives.is_decoder(model):
        return token_windows(model, texts, window=window, max_windows=1)
    sentences = split_sentences(texts, max_sentences=32)
    return sentence_batches(model, sentences, batch_size=32, max_len=min(window, model.config.max_position))


def cost_ratio(model, texts=None, *, window: int = 512, methods: Sequence[str] = ("gradient", "ablation"),
               repeats: int = 1, windows=None) -> dict:
    """Time of each method on ONE batch (one window of `window` tokens, or 32 sentences; or `windows` as
    importance takes them) over a plain forward (with the loss) on the same batch.
    Returns {"forward_s", "<method>_s", "<method>_ratio", "tokens", "n_heads", "model"}."""
    batch = _one_batch(model, window, texts) if windows is None else windows
    if not objectives.is_decoder(model) and isinstance(batch, Tensor):
        batch = [(batch, torch.ones_like(batch))]
    decoder = objectives.is_decoder(model)

    def plain():
        with torch.no_grad():
            if decoder:
                objectives.lm_nll(model, batch)
            else:
                for ids, mask in batch:
                    objectives.pooled(model, ids, mask)

    plain()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        plain()
    forward = (time.perf_counter() - t0) / repeats
    out = {"model": getattr(model, "name", None), "tokens": int(batch.numel()) if decoder else
           int(sum(int(m.sum()) for _, m in batch)), "forward_s": forward}
    for method in methods:
        t0 = time.perf_counter()
        for _ in range(repeats):
            importance(model, method=method, windows=batch, progress=False,
                       batch_size=batch.shape[0] if decoder else 32)
        elapsed = (time.perf_counter() - t0) / repeats
        out[f"{method}_s"] = elapsed
        out[f"{method}_ratio"] = elapsed / forward
    out["n_heads"] = sum(_heads_per_layer(model))
    return out


def agreement(model, texts=None, *, window: int = 512, max_windows: int = 4, max_sentences: int = 64,
              methods: Sequence[str] = ("gradient", "confidence", "reconstruction"), progress: bool = True,
              windows=None, given: dict | None = None) -> dict:
    """Spearman of each method (and normalised gradient) against ablation over all heads, on calibration
    text. Returns {"spearman": {method: rho}, "n_heads", "n_tokens", "scores": {method: HeadScores JSON}}.

    given: {method: HeadScores} already computed with these same arguments (reused, not recomputed;
    one computed on a different number of tokens is refused)."""
    kw = dict(window=window, max_windows=max_windows, max_sentences=max_sentences, progress=progress,
              windows=windows)
    given = dict(given or {})

    def score(method: str) -> HeadScores:
        if method in given:
            return given[method]
        return importance(model, texts, method, **kw)

    truth = score("ablation")
    for method, s in given.items():
        # objectives count positions differently (next-token: T - 1 per window; confidence skips the first
        # token of each sentence): 10% slack, and the same source text
        if s.source != truth.source or abs(s.n_tokens - truth.n_tokens) > 0.1 * max(s.n_tokens, truth.n_tokens):
            raise ValueError(f"given: {method!r} scores came from {s.n_tokens} tokens of {s.source!r}, ablation "
                             f"from {truth.n_tokens} of {truth.source!r}; scores compared must come from the "
                             "same text")
    out = {"model": getattr(model, "name", None), "n_heads": len(truth.values()), "n_tokens": truth.n_tokens,
           "spearman": {}, "scores": {"ablation": truth.to_json()}}
    for method in methods:
        s = score(method)
        out["spearman"][method] = s.spearman(truth)
        out["scores"][method] = s.to_json()
        if method == "gradient":
            out["spearman"]["gradient_normalized"] = s.normalize().spearman(truth)
    return out
