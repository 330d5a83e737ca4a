"""Every bad input gets a ValueError/TypeError naming the argument, the expected and the given value."""

import pytest
import torch

from headcount import MultiHeadAttention


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(d_model=0, n_heads=2), ValueError, r"d_model: expected a positive int, got 0"),
    (dict(d_model=8, n_heads=-1), ValueError, r"n_heads: expected a positive int, got -1"),
    (dict(d_model=8, n_heads=2.0), TypeError, r"n_heads: expected a positive int, got 2.0"),
    (dict(d_model=8, n_heads=4, n_kv_heads=3), ValueError, r"n_kv_heads: expected a divisor of n_heads=4, got 3"),
    (dict(d_model=10, n_heads=4), ValueError, r"n_heads: expected a divisor of d_model=10.*got 4"),
    (dict(d_model=8, n_heads=4, head_dim=0), ValueError, r"head_dim: expected a positive int, got 0"),
    (dict(d_model=8, n_heads=4, dropout=1.5), ValueError, r"dropout: expected a probability"),
    (dict(d_model=8, n_heads=True), TypeError, r"n_heads"),
])
def test_bad_construction(kwargs, exc, pattern):
    d_model = kwargs.pop("d_model")
    n_heads = kwargs.pop("n_heads")
    with pytest.raises(exc, match=pattern):
        MultiHeadAttention(d_model, n_heads, **kwargs)


ATTN = MultiHeadAttention(8, 2)


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: ATTN(torch.randn(3, 8)), ValueError, r"x: expected rank 3 .*got shape \[3, 8\]"),
    (lambda: ATTN(torch.randn(1, 3, 7)), ValueError, r"x: expected last dim d_model=8, got shape \[1, 3, 7\]"),
    (lambda: ATTN([[1.0]]), TypeError, r"x: expected a torch.Tensor"),
    (lambda: ATTN(torch.randn(1, 3, 8, dtype=torch.float64)), TypeError,
     r"x: expected dtype torch.float32 \(the weights'\), got torch.float64"),
    (lambda: ATTN(torch.randn(1, 3, 8, device="meta")), ValueError, r"x: expected device cpu"),
    (lambda: ATTN(torch.randn(1, 3, 8), torch.randn(2, 3, 8)), ValueError, r"context: expected batch size 1"),
    (lambda: ATTN(torch.randn(1, 3, 8), torch.randn(1, 3, 5)), ValueError, r"context: expected last dim"),
    (lambda: ATTN(torch.randn(1, 3, 8), attn_mask=torch.ones(3, 4, dtype=torch.bool)), ValueError,
     r"attn_mask: expected shape .*T=3, S=3; got \[3, 4\]"),
    (lambda: ATTN(torch.randn(1, 3, 8), attn_mask=torch.ones(3, 3, dtype=torch.long)), TypeError,
     r"attn_mask: expected dtype bool .*got torch.int64"),
    (lambda: ATTN(torch.randn(1, 3, 8), attn_mask=torch.ones(3, 3, dtype=torch.float64)), TypeError,
     r"attn_mask: a float mask must have the query dtype torch.float32, got torch.float64"),
    (lambda: ATTN(torch.randn(1, 3, 8), attn_mask=torch.ones(2, 3, 3, dtype=torch.bool)), ValueError,
     r"attn_mask: expected shape"),
    (lambda: ATTN(torch.randn(2, 3, 8), key_padding_mask=torch.ones(2, 4, dtype=torch.bool)), ValueError,
     r"key_padding_mask: expected shape \[B, S\] = \[2, 3\], got \[2, 4\]"),
    (lambda: ATTN(torch.randn(2, 3, 8), key_padding_mask=torch.ones(2, 3)), TypeError,
     r"key_padding_mask: expected dtype torch.bool"),
    (lambda: ATTN(torch.randn(2, 3, 8), head_gates=torch.ones(3)), ValueError,
     r"head_gates: expected shape \[2\] or \[2, 2\] .*got \[3\]"),
    (lambda: ATTN(torch.randn(2, 3, 8), head_gates=torch.ones(2, dtype=torch.long)), TypeError, r"head_gates"),
    (lambda: ATTN(torch.randn(1, 3, 8), torch.randn(1, 3, 8), cache=ATTN.new_cache(1, 4)), ValueError,
     r"cache: a KVCache holds self-attention keys"),
    (lambda: ATTN(torch.randn(1, 3, 8), cache=ATTN.new_cache(1, 4, dtype=torch.float64)), TypeError,
     r"cache: expected dtype torch.float32"),
    (lambda: ATTN(torch.randn(1, 3, 8), qk_transform=lambda q, k: (q[..., :1], k)), ValueError,
     r"qk_transform: must keep the shapes"),
    (lambda: ATTN.new_cache(0, 4), ValueError, r"batch_size: expected a positive int, got 0"),
])
def test_bad_forward(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()
