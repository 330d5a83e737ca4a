"""MultiHeadAttention against the chapter's per-head reference, over random configurations."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headcount import MultiHeadAttention
from headcount.reference import multi_head, per_head


@st.composite
def configs(draw):
    n_kv = draw(st.sampled_from([1, 2, 3]))
    group = draw(st.sampled_from([1, 2, 3]))
    n_heads = n_kv * group  # MHA when group == 1, MQA when n_kv == 1, GQA otherwise
    decoupled = draw(st.booleans())
    head_dim = draw(st.integers(1, 6)) if decoupled else draw(st.integers(1, 4))
    d_model = draw(st.integers(2, 12)) if decoupled else n_heads * head_dim
    return dict(
        d_model=d_model, n_heads=n_heads, n_kv=n_kv, head_dim=head_dim if decoupled else None,
        batch=draw(st.integers(1, 3)), tgt=draw(st.integers(1, 6)),
        cross=draw(st.booleans()), src=draw(st.integers(1, 6)),
        causal=draw(st.booleans()), padding=draw(st.booleans()),
        mask=draw(st.sampled_from([None, "bool", "float", "bool_per_head"])),
        gates=draw(st.sampled_from([None, "shared", "per_batch"])),
        bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


def _inputs(c, dtype=torch.float64):
    g = torch.Generator().manual_seed(c["seed"])
    attn = MultiHeadAttention(c["d_model"], c["n_heads"], n_kv_heads=c["n_kv"], head_dim=c["head_dim"],
                              bias=c["bias"]).to(dtype)
    B, T = c["batch"], c["tgt"]
    S = c["src"] if c["cross"] else T
    x = torch.randn(B, T, c["d_model"], generator=g, dtype=dtype)
    context = torch.randn(B, S, c["d_model"], generator=g, dtype=dtype) if c["cross"] else None
    kw = {"is_causal": c["causal"]}
    if c["mask"] == "bool":
        kw["attn_mask"] = torch.rand(T, S, generator=g) > 0.3
    elif c["mask"] == "bool_per_head":
        kw["attn_mask"] = torch.rand(B, c["n_heads"], T, S, generator=g) > 0.3
    elif c["mask"] == "float":
        kw["attn_mask"] = torch.randn(B, T, S, generator=g, dtype=dtype)
    if c["padding"]:
        kw["key_padding_mask"] = torch.rand(B, S, generator=g) > 0.3
    if c["gates"] == "shared":
        kw["head_gates"] = torch.rand(c["n_heads"], generator=g, dtype=dtype)
    elif c["gates"] == "per_batch":
        kw["head_gates"] = torch.rand(B, c["n_heads"], generator=g, dtype=dtype)
    return attn, x, context, kw


@given(configs())
def test_matches_per_head_reference(c):
    attn, x, context, kw = _inputs(c)
    want, want_w = multi_head(x, per_head(attn), context, **kw)
    fused = attn(x, context, **kw)
    eager = attn(x, context, need_weights=True, **kw)
    assert fused.weights is None
    torch.testing.assert_close(fused.output, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(eager.output, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(eager.weights, want_w, atol=1e-12, rtol=1e-12)
    assert eager.weights.shape == (c["batch"], c["n_heads"], c["tgt"], context.shape[1] if c["cross"] else c["tgt"])


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_uses_same_weight_no_copy(need_weights):
    attn = MultiHeadAttention(8, 4, n_kv_heads=2).double()
    x, ctx = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 7, 8, dtype=torch.float64)
    out = attn(x, ctx, need_weights=need_weights)
    want, _ = multi_head(x, per_head(attn), ctx)
    torch.testing.assert_close(out.output, want)
    assert len(list(attn.parameters())) == 4  # qkv_proj + o_proj, weight and bias: no extra copies


def test_gradcheck_fp64_tiny():
    attn = MultiHeadAttention(6, 3, n_kv_heads=1, head_dim=2).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    gates = torch.rand(3, dtype=torch.float64, requires_grad=True)
    kpm = torch.tensor([[True, True, False, True], [True, False, True, True]])
    for need_weights in (False, True):
        def f(x, gates):
            return attn(x, key_padding_mask=kpm, is_causal=True, head_gates=gates, need_weights=need_weights).output
        assert torch.autograd.gradcheck(f, (x, gates))


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["bool", "float", "padding"])
def test_fully_masked_rows_are_zero_not_nan(need_weights, dtype, kind):
    attn = MultiHeadAttention(8, 2, n_kv_heads=1, bias=False).to(dtype)
    x = torch.randn(2, 3, 8, dtype=dtype, requires_grad=True)
    kw = {}
    if kind == "bool":
        mask = torch.ones(3, 3, dtype=torch.bool)
        mask[1] = False  # query row 1 may attend nothing
        kw["attn_mask"] = mask
    elif kind == "float":
        mask = torch.zeros(3, 3, dtype=dtype)
        mask[1] = float("-inf")
        kw["attn_mask"] = mask
    else:
        kw["key_padding_mask"] = torch.tensor([[True, True, True], [False, False, False]])
    out = attn(x, need_weights=need_weights, **kw).output
    # o_proj has no bias, so a row with no key must come out exactly 0.
    dead = out[:, 1] if kind != "padding" else out[1]
    assert torch.equal(dead, torch.zeros_like(dead))
    assert not out.isnan().any()
    out.float().square().sum().backward()
    assert not x.grad.isnan().any()
    assert all(not p.grad.isnan().any() for p in attn.parameters())


def test_head_gates_reach_gradients_and_zero_gate_removes_head():
    attn = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    gates = torch.ones(4, dtype=torch.float64, requires_grad=True)
    attn(x, head_gates=gates).output.sum().backward()
    assert gates.grad.shape == (4,) and gates.grad.abs().min() > 0
    # gate 0 on head 2 == zeroing head 2's columns of W_O (the input of W_O)
    zero = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    gated = attn(x, head_gates=zero).output
    with torch.no_grad():
        attn.o_proj.weight[:, 8:12] = 0
    torch.testing.assert_close(gated, attn(x).output)


# FlashAttention's rule: |path - fp64 reference| <= 2 x |plain PyTorch in the same precision - reference|.
def _plain_torch(x, attn, mask):
    """A plain PyTorch attention in x's precision (no fp32 upcast, repeat_interleave for GQA)."""
    B, T, _ = x.shape
    nh, nkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    qkv = attn.qkv_proj(x)
    q, k, v = qkv.split([nh * dh, nkv * dh, nkv * dh], dim=-1)
    q = q.view(B, T, nh, dh).transpose(1, 2)
    k = k.view(B, T, nkv, dh).transpose(1, 2).repeat_interleave(nh // nkv, 1)
    v = v.view(B, T, nkv, dh).transpose(1, 2).repeat_interleave(nh // nkv, 1)
    s = (q @ k.transpose(-1, -2)) / dh ** 0.5
    s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ v
    return attn.o_proj(o.transpose(1, 2).reshape(B, T, nh * dh))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_kv", [8, 2, 1])
def test_precision_flashattention_rule(dtype, n_kv):
    ref = MultiHeadAttention(256, 8, n_kv_heads=n_kv).double()
    x64 = torch.randn(2, 128, 256, dtype=torch.float64)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    want = ref(x64, is_causal=True).output
    low = MultiHeadAttention(256, 8, n_kv_heads=n_kv).to(dtype)
    low.load_state_dict(ref.state_dict())
    x = x64.to(dtype)
    with torch.no_grad():
        base_err = (_plain_torch(x, low, mask).double() - want).abs().max().item()
        for need_weights in (False, True):
            err = (low(x, is_causal=True, need_weights=need_weights).output.double() - want).abs().max().item()
            assert err <= 2 * base_err, (need_weights, err, base_err)


@given(configs(), st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_low_precision_paths_within_flashattention_rule(c, dtype):
    """Over random shapes, masks and GQA layouts: each path's error against the fp64 reference is at most
    2x that of the same per-head formula evaluated in `dtype` (floored at one unit of `dtype`'s epsilon,
    since tiny shapes can make the plain error exactly 0)."""
    attn64, x64, ctx64, kw64 = _inputs(c)
    want, _ = multi_head(x64, per_head(attn64), ctx64, **kw64)
    low = attn64.to(dtype)
    cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    x, ctx = cast(x64), cast(ctx64)
    kw = {k: cast(v) for k, v in kw64.items()}
    with torch.no_grad():
        plain, _ = multi_head(x, per_head(low), ctx, **kw)
        base = (plain.double() - want).abs().max().item()
        floor = torch.finfo(dtype).eps * max(1.0, want.abs().max().item())
        for need_weights in (False, True):
            got = low(x, ctx, need_weights=need_weights, **kw).output
            assert not got.isnan().any()
            err = (got.double() - want).abs().max().item()
            assert err <= 2 * max(base, floor), (need_weights, err, base)


@given(st.lists(st.integers(0, 2), min_size=1, max_size=7), st.integers(1, 4), st.integers(1, 5),
       st.sampled_from([None, "bool_per_head", "bool"]), st.booleans(), st.integers(0, 2**16))
def test_uneven_groups_attend_each_query_heads_kv_head_without_copying_it(heads, tgt, extra, mask, causal, seed):
    """Query head i reads KV head kv_index[i] (any order, some KV heads unread): the fused path without a
    gradient (decoding a pruned or merged layer) equals softmax(q k^T / sqrt(d) + mask) v written per head, never
    gathers K/V per query head, and equals the gathered path that training takes."""
    from unittest import mock

    from headcount import kernels

    g = torch.Generator().manual_seed(seed)
    B, nh, nkv, d, S = 2, len(heads), 3, 4, tgt + extra
    q = torch.randn(B, nh, tgt, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, nkv, S, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, nkv, S, d, generator=g, dtype=torch.float64)
    m = None
    if mask == "bool_per_head":
        m = torch.rand(B, nh, tgt, S, generator=g) > 0.3
    elif mask == "bool":
        m = torch.rand(B, 1, tgt, S, generator=g) > 0.3
    own = torch.zeros(tgt, S, dtype=torch.bool)
    own[torch.arange(tgt), S - tgt + torch.arange(tgt)] = True  # query t sits at position S - T + t
    m = None if m is None else m | own  # every row sees its own key
    index = torch.tensor(heads)
    with torch.no_grad(), mock.patch.object(kernels, "_expand_kv", side_effect=AssertionError("K/V copied")):
        got = kernels.attend(q, k, v, mask=m, is_causal=causal, kv_index=index)[0]
    want = torch.empty_like(got)
    allowed = torch.ones(B, nh, tgt, S, dtype=torch.bool) if m is None else m.expand(B, nh, tgt, S)
    if causal:
        allowed = allowed & torch.ones(tgt, S, dtype=torch.bool).tril(S - tgt)
    for h, kv in enumerate(heads):
        scores = q[:, h] @ k[:, kv].transpose(-1, -2) / d ** 0.5  # (B, T, S)
        want[:, h] = torch.softmax(scores.masked_fill(~allowed[:, h], float("-inf")), dim=-1) @ v[:, kv]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    trained = kernels.attend(q.requires_grad_(), k, v, mask=m, is_causal=causal, kv_index=index)[0]
    torch.testing.assert_close(trained.detach(), got, atol=1e-12, rtol=1e-12)
