"""Block-wise reconstruction of ONE merged layer (as in BRECQ-style post-training quantisation): Adam on the
layer's own weights (qkv_proj, o_proj) so it reproduces the original layer's output on calibration tokens,
starting from the closed-form merge of fit.py, early-stopped on a held-aside calibration batch."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from headcount.surgery.merging.fit import output_error

Tensor = torch.Tensor


def causal_prefix(cap: dict, y: Tensor, n: int | None) -> tuple[Tensor, dict, Tensor]:
    """The first n tokens of a captured causal batch: (x, kwargs, target), exact because a causal layer's
    output at position t reads positions <= t only. The rotary hook (qk_transform, built for the whole
    window) is applied to q, k padded back to the window's length and cut again: it is elementwise per
    position. Anything else (n None or not shorter, a padding mask, a non-causal layer, any other tensor
    argument): the batch unchanged."""
    x, kwargs = cap["x"], cap["kwargs"]
    t = x.shape[1]
    plain = all(v is None or isinstance(v, (bool, int, float, str)) or callable(v) for v in kwargs.values())
    if n is None or n >= t or cap["mask"] is not None or not kwargs.get("is_causal") or not plain:
        return x, kwargs, y
    kw = dict(kwargs)
    rotate = kw.get("qk_transform")
    if rotate is not None:
        def qk_transform(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            pad = (0, 0, 0, t - q.shape[2])
            q_full, k_full = rotate(torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad))
            return q_full[:, :, :q.shape[2]], k_full[:, :, :k.shape[2]]
        kw["qk_transform"] = qk_transform
    return x[:, :n], kw, y[:, :n]


def refine_layer(attn, captures: list[dict], targets: list[Tensor], *, steps: int = 100, lr: float = 2e-3,
                 validation: int = 1, dp=None, n_batches: int | None = None, step_tokens: int | None = None) -> dict:
    """Local reconstruction of one merged layer: Adam on its own weights (qkv_proj, o_proj) so that the
    layer's output reproduces `targets` on calibration tokens, starting from the closed-form merge.

    Nothing outside the layer moves and no labels are used: this is the block-wise reconstruction of
    post-training quantisation (BRECQ, Li et al. 2021), not fine-tuning. The loss sees the softmax, so
    it can fix the attention patterns the closed form (which fits logits and values in mean square) gets
    wrong. The last `validation` capture batches are held aside (still calibration text) and the
    weights with the lowest error on them are kept, so the refinement cannot make the layer worse there
    than the closed form. Returns {"validation": .., "closed_form_validation": .., "steps": ..} (no error on the
    fit batches: that would be one more attention pass over all of them, and kv_merge refits o_proj after the
    steps, which measures the error on every batch anyway).

    Data parallelism (dp, a headcount.distributed.DataParallel; n_batches = the number of GLOBAL calibration
    batches): each capture carries its global batch number ("slot", from merging.stream.shard_batches); step
    s uses global batch s mod n_fit, to which every rank adds the gradient of the rows it holds (zero when
    it holds none), all-reduced in float64 before the Adam step, and the errors are summed over the ranks:
    every rank takes the single process's steps and keeps the same weights.

    step_tokens: each step fits the first step_tokens tokens of its batch (causal_prefix; None = all of them):
    a 256-token prefix of a 512-token window costs a step less than half as much (attention is quadratic)."""
    if steps <= 0 or not captures:
        return {}
    parallel = dp is not None and dp.world > 1
    # the global batch of each capture: its position in one process, the stream's "slot" over ranks
    slots = [cap["slot"] for cap in captures] if parallel else list(range(len(captures)))
    n_global = n_batches if parallel and n_batches is not None else len(captures)
    if n_global <= validation:
        validation = 0
    n_fit = n_global - validation
    pairs = list(zip(captures, targets))
    fit = [pair for pair, slot in zip(pairs, slots) if slot < n_fit]
    val = [pair for pair, slot in zip(pairs, slots) if slot >= n_fit] if validation else fit
    # each fit batch as a step takes it: (x, kwargs, target, mask), cut to its first step_tokens tokens
    fit_by_slot = {slot: causal_prefix(c, y, step_tokens) + (c["mask"],) for (c, y), slot in zip(pairs, slots)
                   if slot < n_fit}
    params = [p for p in (attn.qkv_proj.weight, attn.qkv_proj.bias, attn.o_proj.weight, attn.o_proj.bias)
              if p is not None]
    flags = [p.requires_grad for p in params]

    def err(pairs) -> float:
        return output_error(attn, [c for c, _ in pairs], [y for _, y in pairs], dp=dp)

    def snapshot() -> list[Tensor]:
        return [p.detach().clone() for p in params]

    best_val = err(val)
    closed = best_val
    best = snapshot()
    den = [0.0] * n_fit
    for slot, (_, _, y, mask) in fit_by_slot.items():
        den[slot] = float((y.reshape(-1, y.shape[-1])[mask] if mask is not None else y).double().pow(2).sum())
    if parallel:
        den = [float(x) for x in dp.sum_many([torch.tensor(den, dtype=torch.float64)])[0]]
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    check_every = max(1, steps // 10)
    try:
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad(), expanded_kv(attn):
            for step in range(steps):
                j = step % n_fit
                opt.zero_grad(set_to_none=True)
                if j in fit_by_slot:
                    x, kwargs, y, mask = fit_by_slot[j]
                    diff = attn(x, **kwargs).output - y
                    diff = diff.reshape(-1, diff.shape[-1])
                    if mask is not None:
                        diff = diff[mask]
                    loss = diff.pow(2).sum() / max(den[j], 1e-30)
                    loss.backward()
                if parallel:  # every rank's share of global batch j: one float64 all-reduce of the gradients
                    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                    for p, g in zip(params, dp.sum_many(grads)):
                        p.grad = g.to(p.dtype)
                opt.step()
                sched.step()
                if (step + 1) % check_every == 0 or step + 1 == steps:
                    value = err(val)
                    if value < best_val:
                        best_val, best = value, snapshot()
    finally:
        with torch.no_grad():
            for p, saved, flag in zip(params, best, flags):
                p.copy_(saved)
                p.requires_grad_(flag)
                p.grad = None
    return {"validation": best_val, "closed_form_validation": closed, "steps": steps}


@contextmanager
def expanded_kv(attn):
    """While gradients flow through a one-KV-head (MQA) layer on the CPU, give it an explicit query -> KV map
    (attn.kv_index, by which the kernels gather K/V per query head) instead of SDPA's enable_gqa: torch's CPU
    backward with enable_gqa and ONE KV head is slow and erratic (smollm2's layer merged to MQA, one step on
    512 tokens: 0.44-4.3 s, against 0.08-0.09 s with K/V expanded; with 2 or 3 KV heads enable_gqa is the
    faster). The same attention, to float32 rounding; the map is taken away again after."""
    device = attn.qkv_proj.weight.device
    if attn.n_kv_heads != 1 or attn.n_heads == 1 or attn.kv_index is not None or device.type != "cpu":
        yield
        return
    attn.kv_index = torch.zeros(attn.n_heads, dtype=torch.long, device=device)
    try:
        yield
    finally:
        attn.kv_index = None
