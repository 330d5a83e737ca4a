"""Block-wise reconstruction of ONE merged layer (as in BRECQ-style post-training quantisation): Adam on the
layer's own weights (qkv_proj, o_proj) so it reproduces the original layer's output on calibration tokens,
starting from the closed-form merge of fit.py, early-stopped on a held-aside calibration batch."""

from __future__ import annotations

import torch

from headcount.surgery.merging.fit import output_error

Tensor = torch.Tensor


def refine_layer(attn, captures: list[dict], targets: list[Tensor], *, steps: int = 100, lr: float = 2e-3,
                 validation: int = 1) -> dict:
    """Local reconstruction of one merged layer: Adam on its own weights (qkv_proj, o_proj) so that the
    layer's output reproduces `targets` on calibration tokens, starting from the closed-form merge.

    Nothing outside the layer moves and no labels are used: this is the block-wise reconstruction of
    post-training quantisation (BRECQ, Li et al. 2021), not fine-tuning. The loss sees the softmax, so
    it can fix the attention patterns the closed form (which fits logits and values in mean square) gets
    wrong. The last `validation` capture batches are held aside (still calibration text) and the
    weights with the lowest error on them are kept, so the refinement cannot make the layer worse there
    than the closed form. Returns {"fit": .., "validation": .., "closed_form_validation": .., "steps": ..}."""
    if steps <= 0 or not captures:
        return {}
    if len(captures) <= validation:
        validation = 0
    fit = list(zip(captures, targets))[: len(captures) - validation] if validation else list(zip(captures, targets))
    val = list(zip(captures, targets))[len(captures) - validation:] if validation else fit
    params = [p for p in (attn.qkv_proj.weight, attn.qkv_proj.bias, attn.o_proj.weight, attn.o_proj.bias)
              if p is not None]
    flags = [p.requires_grad for p in params]

    def err(pairs) -> float:
        return output_error(attn, [c for c, _ in pairs], [y for _, y in pairs])

    def snapshot() -> list[Tensor]:
        return [p.detach().clone() for p in params]

    best_val = err(val)
    closed = best_val
    best = snapshot()
    den = [float((y.reshape(-1, y.shape[-1])[c["mask"]] if c["mask"] is not None else y).double().pow(2).sum())
           for c, y in fit]
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    check_every = max(1, steps // 10)
    try:
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            for step in range(steps):
                j = step % len(fit)
                cap, y = fit[j]
                diff = attn(cap["x"], **cap["kwargs"]).output - y
                diff = diff.reshape(-1, diff.shape[-1])
                if cap["mask"] is not None:
                    diff = diff[cap["mask"]]
                loss = diff.pow(2).sum() / max(den[j], 1e-30)
                opt.zero_grad(set_to_none=True)
                loss.backward()
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
    return {"fit": err(fit), "validation": best_val, "closed_form_validation": closed, "steps": steps}
