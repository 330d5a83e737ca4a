"""weights_hash(model): sha256 over every parameter and buffer (name, dtype, shape, bytes), in state_dict order.
What the report's cache keys on, and what a saved benchmark result records so that the report shows it only
for the weights it was measured on."""

from __future__ import annotations

import hashlib


def weights_hash(model) -> str:
    import torch

    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.numpy().tobytes())
    return h.hexdigest()
