"""oneDNN pre-packed Linear weights for inference on CPU: the speed of `generate` and `perplexity`.

torch's fp32 matmuls go to MKL. On AMD CPUs (like the EPYC this project is benchmarked on) MKL
takes a generic code path and reaches about 40% of what oneDNN's JIT kernels do, for one token
(decode: a matrix-vector product per weight) and for many (prefill) alike. torch ships oneDNN, and
its inference compiler uses it through two ops: `mkldnn._reorder_linear_weight` (pack a weight into
oneDNN's blocked layout, once) and `mkldnn._linear_pointwise` (x @ W^T + b with the packed weight).

`packed(model)` is a context manager that packs every fp32 Linear weight of a model once and, for
its duration, routes those Linears through oneDNN when no gradient is needed. Outside it (and for
anything that needs gradients, other dtypes or devices) a Linear is a plain nn.Linear. The packed
copies take as much memory as the weights themselves, and are dropped on exit.

Rules, for correct results: do not change weights inside the scope (a parameter replaced by a new
one, as prune_heads does, is detected and falls back to F.linear; values written in place are not).
The scope nests: inner `packed(model)` calls (generate inside a user's scope) reuse the packing.
Where oneDNN or these ops are missing, `packed` does nothing and everything still works.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 512  # oneDNN's blocked layout chosen for ~512 rows; measured as fast for 1 row too
# The packed copies are bounded (so a command's peak stays under 1.3 x the weights + 1 GiB): a model
# of at most PACK_WHOLE bytes of weights packs whole (smollm2's 540 MB); a larger one packs its first Linears up
# to PACK_FIXED + PACK_OF_WEIGHTS x its weights' bytes and runs the rest through MKL (slower on AMD CPUs).
PACK_WHOLE = 768 << 20
PACK_FIXED = 256 << 20
PACK_OF_WEIGHTS = 0.15

_available: bool | None = None
_depth: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()


def available() -> bool:
    """True when torch has oneDNN and the packing ops, and they agree with F.linear (probed once)."""
    global _available
    if _available is None:
        try:
            if not torch.backends.mkldnn.is_available():
                raise RuntimeError("no oneDNN")
            g = torch.Generator().manual_seed(0)
            w, b, x = (torch.randn(24, 16, generator=g), torch.randn(24, generator=g),
                       torch.randn(2, 3, 16, generator=g))
            p = torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT)
            y = torch.ops.mkldnn._linear_pointwise(x, p, b, "none", [], "")
            _available = bool(torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-4))
        except Exception:  # an op missing in this build, or any oneDNN failure: plain torch it is
            _available = False
    return _available


def is_packed(model: nn.Module) -> bool:
    return _depth.get(model, 0) > 0


def _packed_forward(linear: nn.Linear, weight: nn.Parameter, packed: torch.Tensor):
    pointwise = torch.ops.mkldnn._linear_pointwise

    def forward(x: torch.Tensor) -> torch.Tensor:
        w, bias = linear.weight, linear.bias
        if (w is weight and x.dtype == torch.float32 and x.device.type == "cpu"
                and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return pointwise(x if x.is_contiguous() else x.contiguous(), packed, bias, "none", [], "")
        return F.linear(x, w, bias)  # gradients, another dtype, or a replaced weight

    return forward


def whole_when_memory_allows(model: nn.Module, share: float = 0.25) -> int | None:
    """max_bytes for `packed` that packs every Linear when the packed copies fit in `share` of the memory
    available now (batched generation: at 8-32 rows oneDNN runs the matmuls 2-4x faster than MKL on AMD CPUs,
    and the last Linear, lm_head, is the largest: the default bound leaves it plain); else None (the default)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        with open("/proc/meminfo") as f:
            available_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    return weights if weights <= share * available_kb * 1024 else None


@contextlib.contextmanager
def packed(model: nn.Module, *, enabled: bool = True, max_bytes: int | None = None):
    """Pack the model's fp32 CPU Linear weights for oneDNN for the duration of the block.

    Costs one pass over the weights (~0.3 s for SmolLM2's 540 MB) and as much memory again, up to max_bytes
    (None = everything for a model of at most PACK_WHOLE bytes, else PACK_FIXED + PACK_OF_WEIGHTS x its
    weights' bytes): Linears are packed in module order until the next one would pass it; the rest stay plain.
    """
    if is_packed(model):  # nested: reuse the outer scope's packing
        _depth[model] += 1
        try:
            yield model
        finally:
            _depth[model] -= 1
        return
    if not enabled or not available():
        yield model
        return
    # plain nn.Linear only: a subclass (decoder.SoftcapLinear) has its own forward, which packing would shadow
    linears = [m for m in model.modules()
               if type(m) is nn.Linear and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    if max_bytes is None:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        max_bytes = weights if weights <= PACK_WHOLE else int(PACK_FIXED + PACK_OF_WEIGHTS * weights)
    patched = []
    used = 0
    try:
        with torch.no_grad():
            for lin in linears:
                w = lin.weight
                used += w.numel() * w.element_size()
                if used > max_bytes:
                    break
                p = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), PACK_BATCH_HINT)
                lin.forward = _packed_forward(lin, w, p)  # an instance attribute shadows Linear.forward
                patched.append(lin)
        _depth[model] = 1
        yield model
    finally:
        for lin in patched:
            lin.__dict__.pop("forward", None)
        _depth.pop(model, None)
