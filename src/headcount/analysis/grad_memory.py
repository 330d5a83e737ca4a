"""Activation memory of the passes that need gradients through a frozen model (importance by gradient and
by reconstruction): what autograd keeps, measured, and layer checkpointing chosen to fit a budget.

    with gradient_pass(model, tokens_per_batch) as info: ...   # info: what was chosen (to_json-able)

Two things make a backward pass through a 1.5B model fit beside its weights:
1. The weights are frozen for the pass (requires_grad off; the hidden state entering layer 0 is made the
   leaf the graph grows from). A Linear whose weight needs no gradient saves no input for the backward, so
   autograd keeps only what the elementwise ops, norms and attention need; and the backward computes input
   gradients only: about one forward's FLOPs instead of two.
2. Layers are checkpointed (their activations recomputed in the backward, torch.utils.checkpoint,
   non-reentrant) only as many as needed: the bytes autograd saves per token are MEASURED on three short
   inputs (a + b T + c T^2 per sequence, so a quadratic attention path is seen), and the first k layers are
   checkpointed for the smallest k with (L - k) P + k h + P <= budget (P: one layer's saved bytes for the
   batch, h: one layer's input, which a checkpointed layer keeps; the last P is the layer being recomputed).

Cost in forward-pass equivalents of the calibration tokens: 1 (forward) + 1 (input-gradient backward)
+ k / L (recompute) = `info["forward_equivalents"]`.
Budget (bytes, default): BUDGET_FIXED + BUDGET_OF_WEIGHTS x the weights' bytes — what the scale issue's
peak-memory target (1.3 x weights + 1 GiB) leaves for activations after the weights and the process.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

Tensor = torch.Tensor

BUDGET_FIXED = 384 << 20  # 512 left the 1.5B bf16 prune 0.04 GiB under its target; 384 costs smollm2 5 of 30
                          # layers recomputed (+0.17 forward-equivalents)
BUDGET_OF_WEIGHTS = 0.1  # 0.25 put gradient importance on the 1.5B at 1.71 x its weights (11.3 GiB)
_PROBE_MAX = 128  # the longest probe sequence


def release_free_memory() -> None:
    """Hand the memory a finished backward freed back to the OS (glibc's malloc_trim; nothing elsewhere).

    glibc keeps freed blocks in its heap, and the next batch's tensors do not always fit the holes, so the
    process's resident size climbs batch after batch although the live tensors do not: measured on
    qwen2.5-coder-0.5b in bf16, the reconstruction order peaked at 3.66 GB, 3.41 GB when trimmed after each
    batch, at the same speed (39 s)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def default_budget(model) -> int:
    return int(BUDGET_FIXED + BUDGET_OF_WEIGHTS * weight_bytes(model))


@contextmanager
def _frozen(model):
    """Weights without gradients; the hidden state entering layer 0 is the graph's leaf."""
    saved = [(p, p.requires_grad) for p in model.parameters()]

    def leaf(module, args, kwargs):
        if torch.is_grad_enabled():
            return (args[0].detach().requires_grad_(True),) + tuple(args[1:]), kwargs
        return None

    handle = model.layers[0].register_forward_pre_hook(leaf, with_kwargs=True)
    try:
        for p, _ in saved:
            p.requires_grad_(False)
        yield
    finally:
        handle.remove()
        for p, flag in saved:
            p.requires_grad_(flag)


def _saved_bytes(model, length: int) -> int:
    """Bytes autograd saves for one sequence of `length` tokens through every layer (weights excluded)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    kept: list[Tensor] = []  # alive until counted, so that no freed storage's address is reused meanwhile

    def pack(t: Tensor):
        if t.data_ptr() not in params and t.device.type != "meta":
            kept.append(t)
        # the graph gets None, not the tensor: a graph holding, through a Python hook, the tensor it saved as
        # its own output is a reference cycle no collector sees, and it outlived the probe (0.26 GiB on the
        # 1.5B model at 128 tokens, measured). Nothing runs a backward through this graph.
        return None

    device = model.embed.weight.device
    ids = torch.arange(length, device=device).remainder(model.config.vocab_size - 1).add(1)[None]
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked):
        if hasattr(model, "lm_head"):
            out = model(ids, compute_logits=False).hidden_states
        else:
            out = model(ids, torch.ones_like(ids)).last_hidden_state
    del out
    for t in kept:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    kept.clear()
    return sum(seen.values())


def _never_unpacked(packed):
    raise RuntimeError("grad_memory: the probe's graph is measured, never differentiated")


def saved_bytes_per_sequence(model, length: int) -> float:
    """Bytes autograd saves for one sequence of `length` tokens (frozen weights): measured at `length` when
    it is short, else at three shorter lengths and extrapolated (a + b T + c T^2, never below linear)."""
    top = min(length, _PROBE_MAX, getattr(model.config, "max_position", length) or length)
    lengths = sorted({max(2, top // 4), max(2, top // 2), top})
    with _frozen(model):
        ys = [_saved_bytes(model, t) for t in lengths]
    linear = ys[-1] * length / top
    if top == length or len(lengths) < 3:
        return float(linear)
    a = torch.tensor([[1.0, t, t * t] for t in lengths], dtype=torch.float64)
    coef = torch.linalg.solve(a, torch.tensor(ys, dtype=torch.float64))
    return max(float(coef[0] + coef[1] * length + coef[2] * length * length), float(linear))


def plan(model, batch_shape: tuple[int, int], budget: int | None = None) -> dict:
    """How many layers to checkpoint for batches of [B, T] tokens within `budget` bytes (None = default)."""
    if budget is None:
        budget = default_budget(model)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget: expected bytes as an int >= 0 or None, got {budget!r}")
    b, t = batch_shape
    n_layers = len(model.layers)
    per_layer = b * saved_bytes_per_sequence(model, t) / n_layers
    layer_input = b * t * model.config.d_model * model.embed.weight.element_size()
    k = 0
    while k < n_layers and (n_layers - k) * per_layer + k * layer_input + (per_layer if k else 0) > budget:
        k += 1
    return {"checkpointed_layers": k, "n_layers": n_layers, "budget_bytes": budget,
            "saved_bytes_per_layer": int(per_layer),
            "activation_bytes": int((n_layers - k) * per_layer + k * layer_input + (per_layer if k else 0)),
            "forward_equivalents": round(2.0 + k / n_layers, 3)}


@contextmanager
def gradient_pass(model, batch_shape: tuple[int, int], budget: int | None = None):
    """Frozen weights and the planned layer checkpointing while the block runs; yields plan()'s dict."""
    info = plan(model, batch_shape, budget)
    k = info["checkpointed_layers"]
    wrapped = []
    with _frozen(model):
        try:
            for layer in list(model.layers)[:k]:
                forward = layer.forward

                def run(*args, _forward=forward, **kwargs):
                    return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

                layer.forward = run
                wrapped.append(layer)
            yield info
        finally:
            for layer in wrapped:
                del layer.forward  # back to the class's forward
