"""Zero heads (models/formats/hf_padding.py): a pruned attention written back at a larger, even head layout
computes exactly the pruned attention (biases, per-head sinks, uneven groups, a removed KV head)."""

import pytest
import torch

from headcount import MultiHeadAttention
from headcount.models.formats.hf_padding import pad_attention, padded_slots
from headcount.models.rotary import RotaryEmbedding


def test_a_padded_attention_equals_the_pruned_one():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 6, n_kv_heads=3, head_dim=8, bias=True, sinks=True).double().eval()
    with torch.no_grad():
        attn.sinks.normal_()
    attn.prune_heads([0, 1, 4])  # group 0 removed whole (KV head gone), group 2 left uneven
    assert (attn.n_heads, attn.n_kv_heads, attn.is_uniform) == (3, 2, False)
    padded = pad_attention(attn, 6, 3)
    wide = MultiHeadAttention(32, 6, n_kv_heads=3, head_dim=8, bias=True, o_bias=True, sinks=True).double().eval()
    with torch.no_grad():
        wide.qkv_proj.weight.copy_(padded["qkv"])
        wide.qkv_proj.bias.copy_(padded["qkv_bias"])
        wide.o_proj.weight.copy_(padded["o"])
        wide.o_proj.bias.copy_(attn.o_proj.bias)
        wide.sinks.copy_(padded["sinks"])
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    hook = RotaryEmbedding(8, 64).hook(0, 20, dtype=torch.float64)
    with torch.no_grad():
        want = attn(x, is_causal=True, qk_transform=hook).output
        got = wide(x, is_causal=True, qk_transform=hook).output
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert int((padded["o"].abs().sum(0) == 0).sum()) == 3 * 8  # three zero heads


def test_a_group_larger_than_the_layout_is_refused():
    assert padded_slots((0, 0, 1, 1), 4, 2) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="KV head 0 is read by 3 query heads"):
        padded_slots((0, 0, 0, 1), 4, 2)
