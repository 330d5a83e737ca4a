"""KVCache: storage of n_kv_heads, exact nbytes, decoding == one causal forward, safe failures."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headcount import KVCache, MultiHeadAttention


@pytest.mark.parametrize("n_kv", [8, 4, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_shape_and_nbytes_formula(n_kv, dtype):
    attn = MultiHeadAttention(64, 8, n_kv_heads=n_kv, head_dim=16)
    cache = attn.new_cache(3, 50, dtype=dtype)
    assert cache.k.shape == cache.v.shape == (3, n_kv, 50, 16)
    itemsize = torch.finfo(dtype).bits // 8
    assert cache.nbytes == 2 * 3 * n_kv * 50 * 16 * itemsize
    assert cache.length == 0


@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 2)]),
       st.booleans())
def test_chunked_decoding_equals_full_causal_forward(chunks, heads, padded):
    n_heads, n_kv = heads
    attn = MultiHeadAttention(24, n_heads, n_kv_heads=n_kv)
    total = sum(chunks)
    x = torch.randn(2, total, 24)
    kpm = None
    if padded:  # left padding on the second sequence, as in batched generation
        kpm = torch.ones(2, total, dtype=torch.bool)
        kpm[1, :1] = False
    full = attn(x, is_causal=True, key_padding_mask=kpm).output
    cache = attn.new_cache(2, total + 3)
    outs, start = [], 0
    for n in chunks:
        end = start + n
        part = attn(x[:, start:end], cache=cache, is_causal=True,
                    key_padding_mask=None if kpm is None else kpm[:, :end]).output
        outs.append(part)
        start = end
    assert cache.length == total
    got = torch.cat(outs, dim=1)  # the padded first row attends nothing on both sides: exactly o_proj.bias
    assert (got - full).abs().max().item() <= 1e-5


def test_cache_errors_leave_cache_unchanged():
    attn = MultiHeadAttention(16, 4, n_kv_heads=2)
    cache = attn.new_cache(2, 5)
    attn(torch.randn(2, 4, 16), cache=cache, is_causal=True)
    k_before, v_before = cache.k.clone(), cache.v.clone()
    with pytest.raises(ValueError, match="max_len=5"):
        attn(torch.randn(2, 2, 16), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="batch size 2"):
        attn(torch.randn(3, 1, 16), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="attn_mask"):
        attn(torch.randn(2, 1, 16), cache=cache, attn_mask=torch.ones(1, 4, dtype=torch.bool))
    assert cache.length == 4 and torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)
    attn(torch.randn(2, 1, 16), cache=cache, is_causal=True)  # still usable
    assert cache.length == 5


def test_cache_from_another_module_is_refused():
    a, b = MultiHeadAttention(16, 4), MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="another MultiHeadAttention"):
        b(torch.randn(1, 2, 16), cache=a.new_cache(1, 8))
    with pytest.raises(TypeError, match="cache"):
        b(torch.randn(1, 2, 16), cache=(torch.zeros(1), torch.zeros(1)))
    foreign = KVCache(1, 8, 2, 4)  # built by hand: shape is checked against the module
    with pytest.raises(ValueError, match="n_kv_heads=4"):
        b(torch.randn(1, 2, 16), cache=foreign)


def test_cache_reset_and_truncate():
    attn = MultiHeadAttention(16, 4)
    x = torch.randn(1, 6, 16)
    cache = attn.new_cache(1, 6)
    first = attn(x, cache=cache, is_causal=True).output
    cache.truncate(3)
    again = attn(x[:, 3:], cache=cache, is_causal=True).output
    torch.testing.assert_close(again, first[:, 3:])
    cache.reset()
    torch.testing.assert_close(attn(x, cache=cache, is_causal=True).output, first)
    with pytest.raises(ValueError, match="length"):
        cache.truncate(7)


@given(st.integers(1, 6), st.data())
def test_select_rows_keeps_each_row_whole_in_any_order(batch, data):
    """select_rows(index) leaves row i of the cache equal to the old row index[i]: compacted in place for an
    increasing index, gathered otherwise; appending afterwards writes into the kept rows only."""
    cache = KVCache(batch, 5, 2, 3)
    gen = torch.Generator().manual_seed(batch)
    cache.append(torch.randn(batch, 2, 3, 3, generator=gen), torch.randn(batch, 2, 3, 3, generator=gen))
    k0, v0 = cache.k.clone(), cache.v.clone()
    rows = data.draw(st.lists(st.integers(0, batch - 1), max_size=batch))
    if data.draw(st.booleans()):
        rows = sorted(set(rows))
    cache.select_rows(torch.tensor(rows, dtype=torch.long))
    assert cache.batch_size == len(rows)
    assert torch.equal(cache.k, k0[rows]) and torch.equal(cache.v, v0[rows])
    k, v = cache.append(torch.ones(len(rows), 2, 1, 3), torch.ones(len(rows), 2, 1, 3))
    assert torch.equal(k[:, :, :3], k0[rows][:, :, :3]) and bool((k[:, :, 3] == 1).all())


def test_select_rows_refuses_rows_outside_the_batch():
    cache = KVCache(2, 4, 1, 2)
    with pytest.raises(ValueError, match="index: expected rows in 0..1"):
        cache.select_rows(torch.tensor([0, 2]))


@given(st.integers(1, 6), st.data())
def test_extend_rows_takes_back_what_an_in_place_select_left(batch, data):
    """After an increasing select_rows, the storage's rows past the kept ones are spare: extend_rows(n) takes n of
    them back without touching the kept rows; a gathered select (new storage) or a request past them is refused."""
    cache = KVCache(batch, 5, 2, 3)
    cache.append(torch.randn(batch, 2, 2, 3), torch.randn(batch, 2, 2, 3))
    rows = sorted(set(data.draw(st.lists(st.integers(0, batch - 1), min_size=1, max_size=batch))))
    cache.select_rows(torch.tensor(rows, dtype=torch.long))
    kept = cache.k.clone()
    assert cache.spare_rows() == batch - len(rows)
    n = data.draw(st.integers(0, batch - len(rows)))
    if n:
        cache.extend_rows(n)
    assert cache.batch_size == len(rows) + n and torch.equal(cache.k[:len(rows)], kept)
    with pytest.raises(ValueError, match=f"n: expected at most {batch - len(rows) - n} rows"):
        cache.extend_rows(batch - len(rows) - n + 1)
    if len(rows) > 1:
        cache.select_rows(torch.tensor([1, 0], dtype=torch.long))  # gathered: its own storage, nothing spare
        assert cache.spare_rows() == 0
