"""Rotary tables built lazily inside torch.inference_mode stay usable for gradients afterwards: `headcount
prune` on a LongRoPE model (Phi-3) evaluated under inference_mode first, then took gradients, and stopped
with "Inference tensors cannot be saved for backward"."""

import torch

from headcount.models.rotary import RotaryEmbedding, apply_rotary_reference


def test_tables_grown_in_inference_mode_take_gradients():
    rope = RotaryEmbedding(8, 8192)
    with torch.inference_mode():
        rope.hook(4090, 20)  # past the first 4096 positions: the tables grow here
    q = torch.randn(1, 2, 20, 8, requires_grad=True)
    k = torch.randn(1, 1, 20, 8)
    rq, _ = rope.hook(4090, 20)(q, k)
    rq.sum().backward()  # raised before the fix
    positions = torch.arange(4090, 4110)
    torch.testing.assert_close(rq.detach(), apply_rotary_reference(q.detach(), positions, 10000.0),
                               rtol=1e-4, atol=1e-4)
    assert q.grad is not None and torch.isfinite(q.grad).all()
