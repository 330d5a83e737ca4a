"""Per-head q/k RMSNorm (qk_norm_eps): the contract, against the per-head reference and transformers."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headcount import MultiHeadAttention
from headcount.norms import HeadRMSNorm
from headcount.reference import multi_head, per_head


def _randomise_norms(attn, generator):
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=generator, dtype=norm.weight.dtype))


# ------------------------------------------------------------------------------------------ contract
def test_no_norm_by_default_and_state_dict_unchanged():
    attn = MultiHeadAttention(16, 4, n_kv_heads=2)
    assert attn.q_norm is None and attn.k_norm is None
    assert set(attn.state_dict()) == {"qkv_proj.weight", "qkv_proj.bias", "o_proj.weight", "o_proj.bias"}
    assert "qk_norm" not in repr(attn)


def test_norm_parameters_shape_init_and_keys():
    attn = MultiHeadAttention(16, 4, n_kv_heads=2, head_dim=6, qk_norm_eps=1e-6)
    assert isinstance(attn.q_norm, torch.nn.Module) and isinstance(attn.k_norm, torch.nn.Module)
    for norm in (attn.q_norm, attn.k_norm):
        assert norm.weight.shape == (6,) and torch.equal(norm.weight, torch.ones(6)) and norm.eps == 1e-6
    assert set(attn.state_dict()) == {"qkv_proj.weight", "qkv_proj.bias", "o_proj.weight", "o_proj.bias",
                                      "q_norm.weight", "k_norm.weight"}
    assert "qk_norm(eps=1e-06)" in attn.extra_repr()
    half = MultiHeadAttention(16, 4, qk_norm_eps=1e-6, dtype=torch.bfloat16)
    assert half.q_norm.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("bad, error", [("1e-6", TypeError), (True, TypeError), ([1e-6], TypeError),
                                        (0.0, ValueError), (-1e-6, ValueError), (math.nan, ValueError),
                                        (math.inf, ValueError)])
def test_bad_qk_norm_eps(bad, error):
    with pytest.raises(error, match=r"qk_norm_eps: expected a positive .*float.* or None, got"):
        MultiHeadAttention(16, 4, qk_norm_eps=bad)


def test_to_torch_refuses_a_norm():
    with pytest.raises(ValueError, match="qk_norm_eps"):
        MultiHeadAttention(16, 4, qk_norm_eps=1e-6).to_torch()


# ------------------------------------------------------------------------------------- the norm itself
def test_head_rms_norm_matches_transformers_qwen3_and_gemma3():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g) * 3
    w = torch.randn(8, generator=g) * 0.1
    qwen, ours = Qwen3RMSNorm(8, eps=1e-6), HeadRMSNorm(8, eps=1e-6, cast_before_weight=True)
    gemma, ours_gemma = Gemma3RMSNorm(8, eps=1e-6), HeadRMSNorm(8, eps=1e-6)
    with torch.no_grad():
        qwen.weight.copy_(1 + w)
        ours.weight.copy_(1 + w)
        gemma.weight.copy_(w)  # Gemma multiplies by (1 + w): the loaders store 1 + w
        ours_gemma.weight.copy_(1 + w)
    torch.testing.assert_close(ours(x), qwen(x), atol=0, rtol=0)
    torch.testing.assert_close(ours_gemma(x), gemma(x), atol=1e-7, rtol=1e-6)
    # bf16: each order bit-equal to its model (w on a grid where 1 + w is exact in bf16)
    xb = x.bfloat16()
    wb = torch.round(w * 64) / 64
    for module, reference, weight in ((ours.bfloat16(), qwen.bfloat16(), 1 + wb),
                                      (ours_gemma.bfloat16(), gemma.bfloat16(), None)):
        with torch.no_grad():
            if weight is not None:
                module.weight.copy_(weight)
                reference.weight.copy_(weight)
            else:
                module.weight.copy_(1 + wb)
                reference.weight.copy_(wb)
        assert module(xb).dtype == torch.bfloat16
        assert torch.equal(module(xb), reference(xb))


def test_norm_applied_before_qk_transform_and_before_k_is_cached():
    attn = MultiHeadAttention(12, 3, n_kv_heads=1, head_dim=8, qk_norm_eps=1e-6).double()
    _randomise_norms(attn, torch.Generator().manual_seed(1))
    seen = {}

    def hook(q, k):
        seen["q"], seen["k"] = q, k
        return q, k

    x = torch.randn(2, 5, 12, dtype=torch.float64) * 4
    cache = attn.new_cache(2, 5)
    attn(x, cache=cache, is_causal=True, qk_transform=hook)
    # what the hook saw: each head row divided by its RMS, times the shared weight
    for name, norm in (("q", attn.q_norm), ("k", attn.k_norm)):
        unit = seen[name] / norm.weight
        torch.testing.assert_close(unit.pow(2).mean(-1), torch.ones(unit.shape[:-1], dtype=torch.float64),
                                   atol=1e-5, rtol=0)
    torch.testing.assert_close(cache.k[:, :, :5], seen["k"])


# ------------------------------------------------------------------------------------ vs the reference
@st.composite
def configs(draw):
    n_kv = draw(st.sampled_from([1, 2, 3]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 3]))  # MHA, GQA, MQA
    head_dim = draw(st.integers(1, 6))
    return dict(n_heads=n_heads, n_kv=n_kv, head_dim=head_dim, d_model=draw(st.integers(2, 12)),
                batch=draw(st.integers(1, 3)), tgt=draw(st.integers(1, 6)), cross=draw(st.booleans()),
                src=draw(st.integers(1, 6)), causal=draw(st.booleans()), padding=draw(st.booleans()),
                mask=draw(st.sampled_from([None, "bool", "float"])), gates=draw(st.booleans()),
                bias=draw(st.booleans()), eps=draw(st.sampled_from([1e-6, 1e-2, 1.0])),
                seed=draw(st.integers(0, 2**16)))


@given(configs())
def test_matches_per_head_reference_with_norm(c):
    g = torch.Generator().manual_seed(c["seed"])
    attn = MultiHeadAttention(c["d_model"], c["n_heads"], n_kv_heads=c["n_kv"], head_dim=c["head_dim"],
                              bias=c["bias"], qk_norm_eps=c["eps"]).double()
    _randomise_norms(attn, g)
    B, T = c["batch"], c["tgt"]
    S = c["src"] if c["cross"] else T
    x = torch.randn(B, T, c["d_model"], generator=g, dtype=torch.float64)
    context = torch.randn(B, S, c["d_model"], generator=g, dtype=torch.float64) if c["cross"] else None
    kw = {"is_causal": c["causal"]}
    if c["mask"] == "bool":
        kw["attn_mask"] = torch.rand(T, S, generator=g) > 0.3
    elif c["mask"] == "float":
        kw["attn_mask"] = torch.randn(B, T, S, generator=g, dtype=torch.float64)
    if c["padding"]:
        kw["key_padding_mask"] = torch.rand(B, S, generator=g) > 0.3
    if c["gates"]:
        kw["head_gates"] = torch.rand(B, c["n_heads"], generator=g, dtype=torch.float64)
    want, want_w = multi_head(x, per_head(attn), context, **kw)
    torch.testing.assert_close(attn(x, context, **kw).output, want, atol=1e-10, rtol=1e-10)
    eager = attn(x, context, need_weights=True, **kw)
    torch.testing.assert_close(eager.output, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(eager.weights, want_w, atol=1e-12, rtol=1e-12)


def test_gradcheck_through_the_norms():
    attn = MultiHeadAttention(6, 3, n_kv_heads=1, head_dim=4, qk_norm_eps=1e-3).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    wq = (0.5 + torch.rand(4, dtype=torch.float64)).requires_grad_()
    wk = (0.5 + torch.rand(4, dtype=torch.float64)).requires_grad_()
    kpm = torch.tensor([[True, True, False, True], [True, False, True, True]])
    for need_weights in (False, True):
        def f(x, wq, wk):
            kw = {"key_padding_mask": kpm, "is_causal": True, "need_weights": need_weights}
            return torch.func.functional_call(attn, {"q_norm.weight": wq, "k_norm.weight": wk}, (x,), kw).output
        assert torch.autograd.gradcheck(f, (x, wq, wk))


# ----------------------------------------------------------------------------------------- surgery
def test_prune_heads_keeps_norms_and_matches_reference():
    g = torch.Generator().manual_seed(3)
    attn = MultiHeadAttention(16, 6, n_kv_heads=3, head_dim=5, qk_norm_eps=1e-6).double()
    _randomise_norms(attn, g)
    q_w, k_w = attn.q_norm.weight.detach().clone(), attn.k_norm.weight.detach().clone()
    attn.prune_heads([0, 3, 4])
    assert torch.equal(attn.q_norm.weight, q_w) and torch.equal(attn.k_norm.weight, k_w)
    assert set(attn.state_dict()) >= {"q_norm.weight", "k_norm.weight"}
    x = torch.randn(2, 5, 16, generator=g, dtype=torch.float64)
    want, _ = multi_head(x, per_head(attn), is_causal=True)
    torch.testing.assert_close(attn(x, is_causal=True).output, want, atol=1e-10, rtol=1e-10)


def test_merge_kv_heads_with_a_key_norm():
    attn = MultiHeadAttention(16, 4, n_kv_heads=4, head_dim=4, qk_norm_eps=1e-6).double()
    with torch.no_grad():  # K/V heads 0 == 1 and 2 == 3: merging to 2 is exact, with the norm too
        w = attn.qkv_proj.weight
        k = w[16:32].view(4, 4, 16)
        k[1], k[3] = k[0], k[2]
        v = w[32:48].view(4, 4, 16)
        v[1], v[3] = v[0], v[2]
        b = attn.qkv_proj.bias
        b[20:24], b[28:32], b[36:40], b[44:48] = b[16:20], b[24:28], b[32:36], b[40:44]
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    before = attn(x, is_causal=True).output
    attn.merge_kv_heads(2)
    assert attn.n_kv_heads == 2 and attn.k_norm.weight.shape == (4,)
    torch.testing.assert_close(attn(x, is_causal=True).output, before, atol=1e-10, rtol=1e-10)
    attn.merge_kv_heads(1)  # unequal heads: runs, an approximation
    assert attn(x, is_causal=True).output.isfinite().all()


# ------------------------------------------------------------------------------------ vs transformers
def _copy_hf_attention(hf, ours, *, gemma: bool):
    nq, nkv = hf.q_proj.out_features, hf.k_proj.out_features
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        if hf.q_proj.bias is not None:
            ours.qkv_proj.bias.copy_(torch.cat([hf.q_proj.bias, hf.k_proj.bias, hf.v_proj.bias]))
        ours.o_proj.weight.copy_(hf.o_proj.weight)
        for mine, theirs in ((ours.q_norm, hf.q_norm), (ours.k_norm, hf.k_norm)):
            mine.weight.copy_(theirs.weight + 1 if gemma else theirs.weight)
    assert ours.qkv_proj.weight.shape[0] == nq + 2 * nkv


def test_qwen3_attention_equals_transformers():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding, apply_rotary_pos_emb

    cfg = Qwen3Config(vocab_size=32, hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=10, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = Qwen3Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        hf.q_norm.weight.uniform_(0.5, 1.5)
        hf.k_norm.weight.uniform_(0.5, 1.5)
    ours = MultiHeadAttention(24, 4, n_kv_heads=2, head_dim=10, bias=False, qk_norm_eps=1e-6)
    ours.q_norm.cast_before_weight = ours.k_norm.cast_before_weight = True  # Qwen3's order
    _copy_hf_attention(hf, ours, gemma=False)
    x = torch.randn(2, 7, 24)
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, torch.arange(7)[None])
    want, _ = hf(x, position_embeddings=(cos, sin), attention_mask=None)
    got = ours(x, is_causal=True, qk_transform=lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)).output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
