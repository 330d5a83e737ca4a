"""The per-head reference and its converters; the chapter's worked example (2.3.2)."""

import torch

from headcount import MultiHeadAttention
from headcount.reference import fused_from_per_head, multi_head, per_head


def test_worked_example_d4_h2_dh2_slices():
    """d_model=4, n_h=2, d_h=2: entries 1-2 of a projected row belong to head 1, entries 3-4 to head 2;
    each head's 2 outputs return to the same positions of the Concat."""
    attn = MultiHeadAttention(4, 2, bias=False).double()
    w = per_head(attn)
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    # One big projection, then the slices: Q rows of qkv_proj applied to a row of x.
    q_fused = x @ attn.qkv_proj.weight[:4].T  # (1, 3, 4)
    torch.testing.assert_close(q_fused[..., 0:2], x @ w.W_q[0])
    torch.testing.assert_close(q_fused[..., 2:4], x @ w.W_q[1])
    # Each head's outputs come back to its own positions: with W_O = I the output IS the Concat.
    with torch.no_grad():
        attn.o_proj.weight.copy_(torch.eye(4, dtype=torch.float64))
    out = attn(x).output
    _, weights = multi_head(x, per_head(attn))
    v_fused = x @ attn.qkv_proj.weight[8:12].T
    torch.testing.assert_close(out[..., 0:2], weights[:, 0] @ v_fused[..., 0:2])
    torch.testing.assert_close(out[..., 2:4], weights[:, 1] @ v_fused[..., 2:4])
    # W_O is not optional: a block-permuted W_O lets head 1 write to positions 3-4.
    with torch.no_grad():
        attn.o_proj.weight.copy_(torch.eye(4, dtype=torch.float64)[[2, 3, 0, 1]])
    swapped = attn(x).output
    torch.testing.assert_close(swapped[..., 2:4], out[..., 0:2])


def test_per_head_roundtrip():
    attn = MultiHeadAttention(12, 6, n_kv_heads=2, head_dim=5)
    w = per_head(attn)
    assert len(w.W_q) == 6 and len(w.W_k) == 2 and w.W_q[0].shape == (12, 5) and w.W_o.shape == (30, 12)
    qkv_w, qkv_b, o_w, o_b = fused_from_per_head(w)
    assert torch.equal(qkv_w, attn.qkv_proj.weight) and torch.equal(qkv_b, attn.qkv_proj.bias)
    assert torch.equal(o_w, attn.o_proj.weight) and torch.equal(o_b, attn.o_proj.bias)


def test_every_head_weights_sum_to_one():
    """2.3.1: more heads are not 'more attention' — every head's weights still sum to 1."""
    attn = MultiHeadAttention(16, 8).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    weights = attn(x, need_weights=True).weights
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 8, 5, dtype=torch.float64))
