"""from_torch / to_torch against torch.nn.MultiheadAttention on the same inputs (masks translated)."""

import pytest
import torch
from torch import nn

from headcount import MultiHeadAttention
from headcount.masks import from_torch_mask, to_torch_mask


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_same_outputs_with_translated_masks(bias):
    torch_mha = nn.MultiheadAttention(32, 4, bias=bias, batch_first=True).eval()
    attn = MultiHeadAttention.from_torch(torch_mha).eval()
    x = torch.randn(3, 6, 32)
    ours_mask = torch.rand(6, 6) > 0.3
    ours_mask.fill_diagonal_(True)  # no fully masked rows: torch returns NaN there
    ours_kpm = torch.ones(3, 6, dtype=torch.bool)
    ours_kpm[1, 4:] = False
    want, want_w = torch_mha(x, x, x, attn_mask=to_torch_mask(ours_mask), key_padding_mask=to_torch_mask(ours_kpm),
                             need_weights=True, average_attn_weights=False)
    got = attn(x, attn_mask=ours_mask, key_padding_mask=ours_kpm, need_weights=True)
    torch.testing.assert_close(got.output, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.weights, want_w, atol=1e-6, rtol=1e-5)
    fused = attn(x, attn_mask=ours_mask, key_padding_mask=ours_kpm)
    torch.testing.assert_close(fused.output, want, atol=1e-6, rtol=1e-5)


def test_to_torch_roundtrip_cross_attention_and_float_mask():
    attn = MultiHeadAttention(24, 3).eval()
    torch_mha = attn.to_torch().eval()
    assert torch_mha.batch_first
    x, ctx = torch.randn(2, 4, 24), torch.randn(2, 9, 24)
    fmask = torch.randn(4, 9)
    want, _ = torch_mha(x, ctx, ctx, attn_mask=fmask, need_weights=False)
    torch.testing.assert_close(attn(x, ctx, attn_mask=fmask).output, want, atol=1e-6, rtol=1e-5)
    back = MultiHeadAttention.from_torch(torch_mha)
    assert all(torch.equal(a, b) for a, b in zip(attn.state_dict().values(), back.state_dict().values()))


def test_mask_translation_is_polarity_flip_and_float_passthrough():
    m = torch.tensor([[True, False]])
    assert torch.equal(from_torch_mask(m), ~m)
    f = torch.randn(2, 2)
    assert from_torch_mask(f) is f


def test_to_torch_refuses_what_torch_cannot_express():
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(16, 4, n_kv_heads=2).to_torch()
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(16, 4, head_dim=8).to_torch()
    with pytest.raises(ValueError, match="bias"):
        MultiHeadAttention(16, 4, o_bias=False).to_torch()


def test_from_torch_refuses_what_headcount_does_not_model():
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 4, kdim=8, vdim=8, batch_first=True))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 4, add_bias_kv=True, batch_first=True))
    with pytest.raises(TypeError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(3, 3))
