"""Sliding-window attention (sliding_window=) and its KV cache: transformers' semantics, the per-head
reference over shapes, the chunked fused path, NaN-free dead rows, decoding far past the window."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from headcount import KVCache, MultiHeadAttention, kernels
from headcount.cache import SlidingKVCache
from headcount.masks import window_band, window_mask
from headcount.reference import multi_head, per_head


@pytest.fixture
def small_chunks(monkeypatch):
    """Make the chunked fused path kick in at toy sizes (its threshold is >= 256 queries normally)."""
    monkeypatch.setattr(kernels, "_MIN_CHUNK", 3)


# ------------------------------------------------------------------------------ transformers' masks
@pytest.mark.parametrize("window", [1, 2, 3, 7, 20])
def test_causal_window_equals_transformers_mask_function(window):
    from transformers.masking_utils import sliding_window_causal_mask_function

    fn = sliding_window_causal_mask_function(window)  # Mistral, Qwen2/3, Gemma 3 local layers
    for q_start, n_q, n_k in ((0, 12, 12), (9, 3, 12), (11, 1, 12)):  # prefill, a chunk, one decode step
        q_idx = torch.arange(q_start, q_start + n_q)[:, None]
        kv_idx = torch.arange(n_k)[None, :]
        want = fn(0, 0, q_idx, kv_idx)
        assert torch.equal(window_band(q_start, n_q, 0, n_k, window, causal=True), want)
        if q_start + n_q == n_k:  # bottom-right aligned, as attention sees it with a cache
            assert torch.equal(window_mask(n_q, n_k, window, causal=True), want)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("raw_window", [4, 6, 9])
def test_gemma3_masks_equal_transformers(bidirectional, raw_window):
    """The masks transformers builds for a Gemma 3 sliding layer, causal and use_bidirectional_attention
    (whose config turns the window W into W // 2 + 1, then allows |p - j| < it)."""
    from transformers import Gemma3TextConfig
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.gemma3.modeling_gemma3 import _bidirectional_window_overlay

    cfg = Gemma3TextConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=raw_window,
                           use_bidirectional_attention=bidirectional)
    cfg._attn_implementation = "sdpa"
    T = 13
    extra = {"or_mask_function": _bidirectional_window_overlay(cfg.sliding_window)} if bidirectional else {}
    want = create_sliding_window_causal_mask(config=cfg, inputs_embeds=torch.zeros(1, T, 16),
                                             attention_mask=torch.ones(1, T, dtype=torch.long), cache=None,
                                             position_ids=torch.arange(T)[None], **extra)[0, 0]
    assert torch.equal(window_mask(T, T, cfg.sliding_window, causal=not bidirectional), want)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gemma3_sliding_attention_equals_transformers(bidirectional):
    from transformers import Gemma3TextConfig
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.gemma3.modeling_gemma3 import (Gemma3Attention, Gemma3RotaryEmbedding,
                                                             _bidirectional_window_overlay, apply_rotary_pos_emb)

    cfg = Gemma3TextConfig(vocab_size=32, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=5,
                           query_pre_attn_scalar=12, use_bidirectional_attention=bidirectional)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = Gemma3Attention(cfg, layer_idx=0).eval()  # layer 0 is a sliding layer
    assert hf.sliding_window == cfg.sliding_window
    with torch.no_grad():
        hf.q_norm.weight.uniform_(-0.5, 0.5)
        hf.k_norm.weight.uniform_(-0.5, 0.5)
    ours = MultiHeadAttention(24, 4, n_kv_heads=1, head_dim=16, bias=False, qk_norm_eps=cfg.rms_norm_eps,
                              softmax_scale=cfg.query_pre_attn_scalar ** -0.5, sliding_window=cfg.sliding_window)
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.o_proj.weight.copy_(hf.o_proj.weight)
        ours.q_norm.weight.copy_(1 + hf.q_norm.weight)  # Gemma's (1 + w), stored as a plain weight
        ours.k_norm.weight.copy_(1 + hf.k_norm.weight)
    T = 14
    x = torch.randn(2, T, 24)
    kpm = torch.ones(2, T, dtype=torch.long)
    kpm[1, :3] = 0
    extra = {"or_mask_function": _bidirectional_window_overlay(cfg.sliding_window)} if bidirectional else {}
    mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=x, attention_mask=kpm, cache=None,
                                             position_ids=torch.arange(T)[None], **extra)
    cos, sin = Gemma3RotaryEmbedding(cfg)(x, torch.arange(T)[None], "sliding_attention")
    want, _ = hf(x, position_embeddings=(cos, sin), attention_mask=mask)
    for need_weights in (False, True):
        got = ours(x, is_causal=not bidirectional, key_padding_mask=kpm.bool(), need_weights=need_weights,
                   qk_transform=lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)).output
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ the contract
def test_attribute_validation_and_repr():
    attn = MultiHeadAttention(16, 4)
    assert attn.sliding_window is None and "sliding_window" not in repr(attn)
    attn.sliding_window = 8
    assert attn.sliding_window == 8 and "sliding_window=8" in attn.extra_repr()
    assert set(attn.state_dict()) == {"qkv_proj.weight", "qkv_proj.bias", "o_proj.weight", "o_proj.bias"}
    attn.sliding_window = None
    assert attn.sliding_window is None


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("512", TypeError),
                                        (True, TypeError), (8.0, TypeError)])
def test_bad_sliding_window(bad, error):
    with pytest.raises(error, match=r"sliding_window: expected a positive int .* or None, got"):
        MultiHeadAttention(16, 4, sliding_window=bad)
    attn = MultiHeadAttention(16, 4, sliding_window=4)
    with pytest.raises(error, match="sliding_window"):
        attn.sliding_window = bad
    assert attn.sliding_window == 4  # unchanged by the failed assignment


def test_window_refuses_context_and_to_torch():
    attn = MultiHeadAttention(16, 4, sliding_window=4)
    with pytest.raises(ValueError, match="sliding_window=4 .* context="):
        attn(torch.randn(1, 3, 16), torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="sliding_window"):
        attn.to_torch()


# --------------------------------------------------------------------------- against the reference
@st.composite
def configs(draw, max_tgt=12, max_window=14):
    n_kv = draw(st.sampled_from([1, 2, 3]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 3]))  # MHA, GQA, MQA
    T = draw(st.integers(1, max_tgt))
    return dict(n_heads=n_heads, n_kv=n_kv, head_dim=draw(st.integers(1, 6)), d_model=draw(st.integers(2, 12)),
                batch=draw(st.integers(1, 3)), tgt=T, window=draw(st.integers(1, max_window)),
                causal=draw(st.booleans()),
                padding=draw(st.booleans()), mask=draw(st.sampled_from([None, "bool", "float", "bool_per_head"])),
                gates=draw(st.booleans()), norm=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def _build(c, dtype=torch.float64):
    g = torch.Generator().manual_seed(c["seed"])
    attn = MultiHeadAttention(c["d_model"], c["n_heads"], n_kv_heads=c["n_kv"], head_dim=c["head_dim"],
                              sliding_window=c["window"], qk_norm_eps=1e-6 if c["norm"] else None).to(dtype)
    if c["norm"]:
        with torch.no_grad():
            attn.q_norm.weight.uniform_(0.5, 1.5, generator=g)
            attn.k_norm.weight.uniform_(0.5, 1.5, generator=g)
    B, T = c["batch"], c["tgt"]
    x = torch.randn(B, T, c["d_model"], generator=g, dtype=dtype)
    kw = {"is_causal": c["causal"]}
    if c["mask"] == "bool":
        kw["attn_mask"] = torch.rand(T, T, generator=g) > 0.3
    elif c["mask"] == "bool_per_head":
        kw["attn_mask"] = torch.rand(B, c["n_heads"], T, T, generator=g) > 0.3
    elif c["mask"] == "float":
        kw["attn_mask"] = torch.randn(B, T, T, generator=g, dtype=dtype)
    if c["padding"]:
        kw["key_padding_mask"] = torch.rand(B, T, generator=g) > 0.3
    if c["gates"]:
        kw["head_gates"] = torch.rand(B, c["n_heads"], generator=g, dtype=dtype)
    return attn, x, kw


@given(configs())
def test_window_matches_per_head_reference(c):
    attn, x, kw = _build(c)
    want, want_w = multi_head(x, per_head(attn), sliding_window=c["window"], **kw)
    torch.testing.assert_close(attn(x, **kw).output, want, atol=1e-10, rtol=1e-10)
    eager = attn(x, need_weights=True, **kw)
    torch.testing.assert_close(eager.output, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(eager.weights, want_w, atol=1e-12, rtol=1e-12)
    if c["window"] < c["tgt"]:  # zeros outside the window
        allowed = window_mask(c["tgt"], c["tgt"], c["window"], causal=c["causal"])
        assert not eager.weights[..., ~allowed].any()


@given(configs(max_tgt=24, max_window=4))
def test_chunked_fused_path_matches_reference(c):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "_MIN_CHUNK", 2)
        attn, x, kw = _build(c)
        want, _ = multi_head(x, per_head(attn), sliding_window=c["window"], **kw)
        torch.testing.assert_close(attn(x, **kw).output, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_path_never_builds_a_t_by_t_mask(causal, monkeypatch):
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((q.shape[2], k.shape[2], None if attn_mask is None else tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", spy)
    T, W = 2048, 64
    attn = MultiHeadAttention(32, 4, n_kv_heads=1, sliding_window=W)
    x = torch.randn(1, T, 32)
    kpm = torch.rand(1, T) > 0.1
    out = attn(x, is_causal=causal, key_padding_mask=kpm).output
    chunk = kernels._MIN_CHUNK
    assert len(seen) == T // chunk
    keys = chunk + (W - 1) * (1 if causal else 2)
    assert all(n_q <= chunk and n_k <= keys and mask[-2:] == (n_q, n_k) for n_q, n_k, mask in seen)
    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", sdpa)
    eager = attn(x, is_causal=causal, key_padding_mask=kpm, need_weights=True).output
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ dead rows
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("chunked", [False, True])
def test_window_and_padding_masking_a_whole_row_is_zero_not_nan(need_weights, dtype, chunked, monkeypatch):
    if chunked:
        monkeypatch.setattr(kernels, "_MIN_CHUNK", 2)
    T, W = 10, 2
    attn = MultiHeadAttention(8, 2, n_kv_heads=1, bias=False, sliding_window=W).to(dtype)
    x = torch.randn(2, T, 8, dtype=dtype, requires_grad=True)
    kpm = torch.ones(2, T, dtype=torch.bool)
    kpm[0, 5:7] = False  # query 6 of batch 0 sees keys 5 and 6 only: both padding
    out = attn(x, is_causal=True, key_padding_mask=kpm, need_weights=need_weights).output
    assert torch.equal(out[0, 6], torch.zeros_like(out[0, 6]))  # no o_proj bias: a dead row is exactly 0
    assert not out.isnan().any()
    out.float().square().sum().backward()
    assert not x.grad.isnan().any()
    assert all(not p.grad.isnan().any() for p in attn.parameters())


def test_gradcheck_windowed_fp64(small_chunks):
    attn = MultiHeadAttention(6, 3, n_kv_heads=1, head_dim=2, sliding_window=3, qk_norm_eps=1e-3).double()
    x = torch.randn(2, 8, 6, dtype=torch.float64, requires_grad=True)
    gates = torch.rand(3, dtype=torch.float64, requires_grad=True)
    kpm = torch.ones(2, 8, dtype=torch.bool)
    kpm[0, 2:4] = False  # with window 3, query 3 of batch 0 keeps only key 1
    kpm[1, 5] = False
    for causal in (True, False):
        for need_weights in (False, True):
            def f(x, gates):
                return attn(x, key_padding_mask=kpm, is_causal=causal, head_gates=gates,
                            need_weights=need_weights).output
            assert torch.autograd.gradcheck(f, (x, gates))


# ------------------------------------------------------------------------------------ the KV cache
def _rotary(start: int, length: int, head_dim: int):
    """A minimal rotary qk_transform at positions start.. (what the decoder does with cache.length)."""
    pos = torch.arange(start, start + length, dtype=torch.float32)
    freqs = 1.0 / 100.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.cat([pos[:, None] * freqs] * 2, dim=-1)  # (T, dh)
    cos, sin = angles.cos(), angles.sin()

    def rotate(t):
        a, b = t.chunk(2, dim=-1)
        return t * cos + torch.cat([-b, a], dim=-1) * sin

    return lambda q, k: (rotate(q), rotate(k))


def test_new_cache_holds_the_window_and_counts_absolute_tokens():
    attn = MultiHeadAttention(32, 4, n_kv_heads=2, head_dim=8, sliding_window=6)
    cache = attn.new_cache(3, 100, dtype=torch.bfloat16)
    assert isinstance(cache, SlidingKVCache) and isinstance(cache, KVCache)
    assert cache.k.shape == cache.v.shape == (3, 2, 6, 8)
    assert cache.nbytes == 2 * 3 * 2 * 6 * 8 * 2 and cache.capacity == 6 and cache.max_len == 100
    short = attn.new_cache(1, 4)  # never more than max_len
    assert short.k.shape[2] == 4 and short.nbytes == 2 * 2 * 4 * 8 * 4
    c = attn.new_cache(3, 100)
    for n in (9, 1, 1, 4):
        attn(torch.randn(3, n, 32), cache=c, is_causal=True)
    assert c.length == 15 and c.nbytes == 2 * 3 * 2 * 6 * 8 * 4
    full = MultiHeadAttention(32, 4, n_kv_heads=2, head_dim=8).new_cache(3, 100)
    assert type(full) is KVCache and full.k.shape == (3, 2, 100, 8)  # full attention: today's cache


def test_gemma3_270m_cache_bytes_at_32k():
    """18 layers, 1 KV head of 256, window 512 on 15 layers, bf16, batch 1, 32,768 tokens."""
    local = MultiHeadAttention(640, 4, n_kv_heads=1, head_dim=256, sliding_window=512, qk_norm_eps=1e-6)
    glob = MultiHeadAttention(640, 4, n_kv_heads=1, head_dim=256, qk_norm_eps=1e-6)
    per_global = glob.new_cache(1, 32768, torch.bfloat16).nbytes
    per_local = local.new_cache(1, 32768, torch.bfloat16).nbytes
    assert per_global == 2 * 256 * 32768 * 2 == 33_554_432
    assert per_local == 2 * 256 * 512 * 2 == 524_288
    assert 18 * per_global == 603_979_776  # 576 MiB without the window
    assert 3 * per_global + 15 * per_local == 108_527_616  # 103.5 MiB with it


@pytest.mark.parametrize("n_heads, n_kv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("norm", [False, True])
def test_decode_far_past_the_window_equals_full_forward(n_heads, n_kv, norm):
    W, dh = 8, 8
    attn = MultiHeadAttention(32, n_heads, n_kv_heads=n_kv, head_dim=dh, sliding_window=W,
                              qk_norm_eps=1e-6 if norm else None)
    N = 5 * W  # prefill 3 windows, then decode 2 windows one token at a time
    x = torch.randn(2, N, 32)
    kpm = torch.ones(2, N, dtype=torch.bool)
    kpm[1, :3] = False  # left padding
    kpm[0, 3 * W + 2] = False  # a padded key in the decoded part
    full = attn(x, is_causal=True, key_padding_mask=kpm, qk_transform=_rotary(0, N, dh), need_weights=True)
    cache = attn.new_cache(2, N)
    outs, weights = [], []
    for start, end in [(0, 3 * W)] + [(t, t + 1) for t in range(3 * W, N)]:
        assert cache.length == start  # the decoder's rotary offset
        o = attn(x[:, start:end], cache=cache, is_causal=True, key_padding_mask=kpm[:, :end],
                 qk_transform=_rotary(cache.length, end - start, dh), need_weights=True)
        outs.append(o.output)
        weights.append(o.weights)
        assert o.weights.shape == (2, n_heads, end - start, end)  # S counts every token seen
    assert cache.length == N and cache.k.shape[2] == W
    assert (torch.cat(outs, dim=1) - full.output).abs().max().item() <= 1e-5
    for t, w in zip(range(3 * W, N), weights[1:]):
        assert (w[:, :, 0] - full.weights[:, :, t, :t + 1]).abs().max().item() <= 1e-6
    fused = attn.new_cache(2, N)  # the same without weights (the fused path)
    outs = [attn(x[:, s:e], cache=fused, is_causal=True, key_padding_mask=kpm[:, :e],
                 qk_transform=_rotary(fused.length, e - s, dh)).output
            for s, e in [(0, 3 * W)] + [(t, t + 1) for t in range(3 * W, N)]]
    assert (torch.cat(outs, dim=1) - full.output).abs().max().item() <= 1e-5


@given(st.lists(st.one_of(st.just(1), st.integers(1, 11)), min_size=1, max_size=9), st.integers(1, 9),
       st.sampled_from([(4, 4), (4, 2), (6, 1)]), st.booleans(), st.sampled_from([None, "bool", "float"]),
       st.integers(0, 2**16))
def test_any_chunking_of_a_sequence_equals_one_forward(chunks, window, heads, causal, mask, seed):
    """Prefill / chunks / single tokens, in any order, against one forward (causal) or, bidirectional,
    against a forward over the prefix each chunk ends (a cache cannot see tokens not yet given)."""
    g = torch.Generator().manual_seed(seed)
    n_heads, n_kv = heads
    attn = MultiHeadAttention(24, n_heads, n_kv_heads=n_kv, sliding_window=window, qk_norm_eps=1e-6).double()
    N = sum(chunks)
    x = torch.randn(2, N, 24, generator=g, dtype=torch.float64)
    kpm = torch.rand(2, N, generator=g) > 0.2
    attn_mask = None
    if mask == "bool":
        attn_mask = torch.rand(N, N, generator=g) > 0.2
    elif mask == "float":
        attn_mask = torch.randn(2, N, N, generator=g, dtype=torch.float64)
    cache = attn.new_cache(2, N)
    start = 0
    for n in chunks:
        end = start + n
        kw = {"is_causal": causal, "key_padding_mask": kpm[:, :end]}
        if attn_mask is not None:
            kw["attn_mask"] = attn_mask[..., start:end, :end]
        got = attn(x[:, start:end], cache=cache, need_weights=bool(n % 2), **kw)
        ref_kw = dict(kw, attn_mask=None if attn_mask is None else attn_mask[..., :end, :end])
        want, want_w = multi_head(x[:, :end], per_head(attn), sliding_window=window, **ref_kw)
        torch.testing.assert_close(got.output, want[:, start:end], atol=1e-10, rtol=1e-10)
        if got.weights is not None:
            torch.testing.assert_close(got.weights, want_w[:, :, start:end], atol=1e-12, rtol=1e-12)
        start = end
    assert cache.length == N and cache.k.shape[2] == min(N, window)


def test_full_cache_on_a_windowed_module_also_works():
    attn = MultiHeadAttention(16, 4, n_kv_heads=2, sliding_window=3)
    x = torch.randn(1, 12, 16)
    full = attn(x, is_causal=True).output
    cache = KVCache(1, 12, 2, 4)
    outs = [attn(x[:, :5], cache=cache, is_causal=True).output]
    outs += [attn(x[:, t:t + 1], cache=cache, is_causal=True).output for t in range(5, 12)]
    assert (torch.cat(outs, dim=1) - full).abs().max().item() <= 1e-5


def test_sliding_cache_errors_and_rollback():
    attn = MultiHeadAttention(16, 4, n_kv_heads=2, sliding_window=4)
    cache = attn.new_cache(1, 10)
    attn(torch.randn(1, 9, 16), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="max_len=10"):  # max_len still bounds the tokens seen
        attn(torch.randn(1, 2, 16), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="length: a SlidingKVCache of window 4 .* roll back to >= 8"):
        cache.truncate(7)
    cache.truncate(8)  # the ring still holds positions 5..8: position 8 can be recomputed
    assert cache.length == 8
    cache.reset()
    assert cache.length == 0
    other = MultiHeadAttention(16, 4, n_kv_heads=2, sliding_window=4)
    with pytest.raises(ValueError, match="another MultiHeadAttention"):
        other(torch.randn(1, 1, 16), cache=cache, is_causal=True)
    attn.sliding_window = 5
    with pytest.raises(ValueError, match="window of 4 tokens, but the module's sliding_window is 5"):
        attn(torch.randn(1, 1, 16), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="window: expected a positive int"):
        SlidingKVCache(1, 10, 2, 4, window=0)


def test_rollback_then_decode_equals_full_forward():
    attn = MultiHeadAttention(16, 4, n_kv_heads=1, sliding_window=4)
    x = torch.randn(1, 12, 16)
    full = attn(x, is_causal=True).output
    cache = attn.new_cache(1, 12)
    attn(x[:, :10], cache=cache, is_causal=True)
    attn(torch.randn(1, 1, 16), cache=cache, is_causal=True)  # a rejected speculative token
    cache.truncate(10)
    got = torch.cat([attn(x[:, t:t + 1], cache=cache, is_causal=True).output for t in (10, 11)], dim=1)
    assert (got - full[:, 10:]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("causal", [True, False])
def test_long_chunks_through_the_cache_take_the_chunked_path(causal, small_chunks, monkeypatch):
    calls = []
    windowed = kernels._fused_windowed
    monkeypatch.setattr(kernels, "_fused_windowed", lambda *a: calls.append(a[0].shape[2]) or windowed(*a))
    attn = MultiHeadAttention(16, 4, n_kv_heads=2, sliding_window=3, qk_norm_eps=1e-6).double()
    x = torch.randn(2, 45, 16, dtype=torch.float64)
    kpm = torch.rand(2, 45) > 0.2
    cache = attn.new_cache(2, 45)
    start = 0
    for n in (17, 1, 15, 12):
        end = start + n
        got = attn(x[:, start:end], cache=cache, is_causal=causal, key_padding_mask=kpm[:, :end]).output
        want, _ = multi_head(x[:, :end], per_head(attn), is_causal=causal, key_padding_mask=kpm[:, :end],
                             sliding_window=3)
        torch.testing.assert_close(got, want[:, start:end], atol=1e-10, rtol=1e-10)
        start = end
    assert calls == [17, 15, 12]  # every multi-token step walked its queries in chunks
