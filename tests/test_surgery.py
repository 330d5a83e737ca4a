"""prune_heads: structural removal == gating those heads to 0, even and uneven across GQA groups."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headcount import MultiHeadAttention
from headcount.reference import multi_head, per_head


def _gates_off(n_heads, heads):
    g = torch.ones(n_heads)
    g[list(heads)] = 0.0
    return g


@pytest.mark.parametrize("n_heads,n_kv,prune", [
    (8, 8, [1, 5]),            # MHA
    (8, 2, [0, 1, 2, 3]),      # GQA, a whole group: its KV head goes, still uniform
    (9, 3, [4]),               # GQA uneven: group sizes 3, 2, 3
    (8, 1, [0, 7]),            # MQA
    (6, 3, [0, 3]),            # uneven: groups of 1, 1, 2 query heads
])
@pytest.mark.parametrize("need_weights", [False, True])
def test_prune_equals_zero_gates(n_heads, n_kv, prune, need_weights):
    attn = MultiHeadAttention(36, n_heads, n_kv_heads=n_kv, head_dim=4)
    x = torch.randn(2, 7, 36)
    kpm = torch.ones(2, 7, dtype=torch.bool)
    kpm[0, -2:] = False
    want = attn(x, head_gates=_gates_off(n_heads, prune), is_causal=True, key_padding_mask=kpm).output
    attn.prune_heads(prune)
    got = attn(x, is_causal=True, key_padding_mask=kpm, need_weights=need_weights)
    assert (got.output - want).abs().max().item() <= 1e-6
    assert attn.n_heads == n_heads - len(prune)
    assert attn.kept_heads == tuple(h for h in range(n_heads) if h not in prune)
    assert attn.qkv_proj.weight.shape[0] == (attn.n_heads + 2 * attn.n_kv_heads) * 4
    assert attn.o_proj.weight.shape[1] == attn.n_heads * 4
    if need_weights:
        assert got.weights.shape[1] == attn.n_heads


def test_uneven_groups_keep_an_explicit_map_and_match_reference():
    attn = MultiHeadAttention(36, 9, n_kv_heads=3).double()
    attn.prune_heads([4])  # groups of query heads per KV head: 3, 2, 3
    assert attn.kv_head_of == (0, 0, 0, 1, 1, 2, 2, 2) and not attn.is_uniform
    x = torch.randn(2, 5, 36, dtype=torch.float64)
    want, _ = multi_head(x, per_head(attn), is_causal=True)
    torch.testing.assert_close(attn(x, is_causal=True).output, want)
    cache = attn.new_cache(2, 5)
    steps = torch.cat([attn(x[:, t:t + 1], cache=cache, is_causal=True).output for t in range(5)], dim=1)
    torch.testing.assert_close(steps, want)


def test_pruning_a_whole_group_frees_its_kv_head_and_stays_uniform():
    attn = MultiHeadAttention(32, 8, n_kv_heads=4)
    attn.prune_heads([2, 3])
    assert attn.n_kv_heads == 3 and attn.is_uniform and attn.kv_index is None
    assert attn.new_cache(1, 10).k.shape[1] == 3


@given(st.sets(st.integers(0, 11), min_size=1, max_size=11), st.sampled_from([12, 6, 4, 3, 2, 1]))
def test_random_pruning_equals_gates(heads, n_kv):
    torch.manual_seed(0)
    attn = MultiHeadAttention(24, 12, n_kv_heads=n_kv, head_dim=3)
    x = torch.randn(1, 6, 24)
    want = attn(x, head_gates=_gates_off(12, heads), is_causal=True).output
    attn.prune_heads(heads)
    assert (attn(x, is_causal=True).output - want).abs().max().item() <= 1e-6


def test_pruning_twice_tracks_original_indices():
    attn = MultiHeadAttention(16, 8)
    attn.prune_heads([0])
    attn.prune_heads([0, 6])  # current 0 and 6 = original 1 and 7
    assert attn.kept_heads == (2, 3, 4, 5, 6)


def test_prune_bad_input():
    attn = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        attn.prune_heads([4])
    with pytest.raises(ValueError, match="all 4 heads"):
        attn.prune_heads(range(4))
    with pytest.raises(TypeError, match="heads"):
        attn.prune_heads(3)
    old_cache = attn.new_cache(1, 4)
    attn.prune_heads([1])
    with pytest.raises(ValueError, match="pruned"):
        attn(torch.randn(1, 2, 16), cache=old_cache)


@pytest.mark.parametrize("target", [4, 2, 1])
def test_merge_kv_heads_exact_when_pooled_heads_are_equal(target):
    attn = MultiHeadAttention(32, 8).double()
    dh = 4
    with torch.no_grad():  # make K/V heads equal within each future group, so pooling loses nothing
        w, b = attn.qkv_proj.weight, attn.qkv_proj.bias
        r = 8 // target
        for block in (1, 2):  # K block, V block
            for h in range(8):
                src = block * 32 + (h // r * r) * dh
                dst = block * 32 + h * dh
                w[dst:dst + dh] = w[src:src + dh]
                b[dst:dst + dh] = b[src:src + dh]
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    want, _ = multi_head(x, per_head(attn), is_causal=True)
    attn.merge_kv_heads(target)
    assert attn.n_kv_heads == target and attn.qkv_proj.weight.shape[0] == (8 + 2 * target) * dh
    torch.testing.assert_close(attn(x, is_causal=True).output, want)
    assert attn.new_cache(1, 10).nbytes == 2 * target * 10 * dh * 8


def test_merge_kv_heads_is_the_mean_and_refuses_bad_targets():
    attn = MultiHeadAttention(16, 4, n_kv_heads=4, bias=False)
    k_before = attn.qkv_proj.weight[16:32].clone()
    attn.merge_kv_heads(2)
    torch.testing.assert_close(attn.qkv_proj.weight[16:20], (k_before[0:4] + k_before[4:8]) / 2)
    with pytest.raises(ValueError, match="divisor of the current n_kv_heads=2, got 3"):
        attn.merge_kv_heads(3)
    pruned = MultiHeadAttention(36, 9, n_kv_heads=3)
    pruned.prune_heads([4])
    with pytest.raises(ValueError, match="uniform"):
        pruned.merge_kv_heads(1)
