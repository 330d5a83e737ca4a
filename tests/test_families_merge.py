"""merge-kv's aware fit on the layouts the newer families add: partial rotary (Phi-4-mini, GPT-NeoX / Pythia: pairs
(f, f + rotary_dim/2) turn, dims rotary_dim..head_dim do not) and SmolLM3's NoPE layers (no rotary at all)."""

import copy

import pytest
import torch

from headcount.models import Decoder, DecoderConfig
from headcount.surgery import merge_kv
from headcount.surgery.merging.fit import install, merged_weights
from headcount.surgery.merging.stats import layer_stats, rotary_dim_of
from headcount.surgery.merging.stream import Stream, calibration_batches


def _tiny(*, rotary_dim=None, nope_layers=(), n_layers=2, n_heads=6, n_kv=3, head_dim=8, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=61, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                        head_dim=head_dim, d_ff=64, max_position=128, rotary_dim=rotary_dim,
                        nope_layers=nope_layers, qkv_bias=True)
    model = Decoder(cfg).double().eval()
    with torch.no_grad():  # larger attention weights: sharper attention than the default init gives
        for layer in model.layers:
            layer.attn.qkv_proj.weight.mul_(3.0)
            layer.attn.qkv_proj.bias.normal_(0, 0.3)
    return model


def _ids(n=4, t=24, seed=1):
    return torch.randint(0, 61, (n, t), generator=torch.Generator().manual_seed(seed))


def _captures(model, ids, layer):
    stream = Stream(model, calibration_batches(model, ids, n_windows=ids.shape[0], window=ids.shape[1]))
    for i in range(layer):
        stream.advance(i)
    return stream.layer_io(layer)


def _kv_rows(attn, which, g):
    nh, nkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    base = nh * d if which == "k" else (nh + nkv) * d
    return slice(base + g * d, base + (g + 1) * d)


def test_rotary_dim_is_read_off_the_layers_own_hook():
    for r in (2, 4, 8):
        hook = _tiny(rotary_dim=r).rotary.hook(0, 16, dtype=torch.float64)
        assert rotary_dim_of(hook, 8, 16, torch.float64, "cpu") == r


def test_an_identity_grouping_through_the_partial_rotary_fit_keeps_the_logits():
    """Every old KV head its own group: the per-pair, unturned-dims and value fits are each exact, so the
    rewritten weights (queries rescaled per pair and mapped on dims 4..8, keys and o_proj mapped back) give
    the original model."""
    model = _tiny(rotary_dim=4)
    ids = _ids()
    want = model(ids).logits
    for i in range(len(model.layers)):
        attn = model.layers[i].attn
        stats = layer_stats(attn, _captures(model, ids, i))
        assert stats.rotary and stats.rotary_dim == 4 and stats.k_pass.shape == (3 * 4, 3 * 4)
        before = attn.qkv_proj.weight.detach().clone()
        install(attn, merged_weights(attn, stats, [[0], [1], [2]]))
        assert not torch.allclose(attn.qkv_proj.weight, before)  # rescaled, not copied
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-9, atol=1e-9)


def test_identical_kv_heads_merge_exactly_with_partial_rotary():
    model = _tiny(rotary_dim=4, n_layers=1)
    attn = model.layers[0].attn
    with torch.no_grad():
        for which in ("k", "v"):
            attn.qkv_proj.weight[_kv_rows(attn, which, 1)] = attn.qkv_proj.weight[_kv_rows(attn, which, 0)]
            attn.qkv_proj.bias[_kv_rows(attn, which, 1)] = attn.qkv_proj.bias[_kv_rows(attn, which, 0)]
    ids = _ids()
    want = model(ids).logits
    result = merge_kv(model, 2, calibration=ids, refit=False, local_steps=0, uptrain_steps=0,
                      progress=False)  # method "aware", the default; the closed form
    assert result.method == "aware" and result.layers[0].groups == [[0, 1], [2]]
    assert result.layers[0].k_kept == pytest.approx(1.0)
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-8, atol=1e-8)


def test_partial_rotary_aware_merge_beats_mean_pooling_on_held_out_tokens():
    """MHA -> MQA on a model turning 4 of 8 dims: the aware fit's logits stay nearer the original's than mean
    pooling's (the GQA paper's conversion), on calibration text (measured 7.9 vs 19.0) and on held-out text
    (12.5 vs 19.8; full rotary on the same model: 13.5 vs 20.1)."""
    model = _tiny(rotary_dim=4, n_heads=6, n_kv=3)
    calibration, held_out = _ids(8, 32), _ids(4, 32, seed=9)
    mean_model, aware_model = copy.deepcopy(model), copy.deepcopy(model)
    merge_kv(mean_model, 1, method="mean", progress=False)
    merge_kv(aware_model, 1, calibration=calibration, local_steps=0, uptrain_steps=0, progress=False)  # closed form
    with torch.no_grad():
        for ids, factor in ((calibration, 0.5), (held_out, 0.7)):
            want = model(ids).logits
            err_mean = float((mean_model(ids).logits - want).pow(2).mean())
            err_aware = float((aware_model(ids).logits - want).pow(2).mean())
            assert err_aware < factor * err_mean, (err_aware, err_mean)


def _all_pairs_logit_error(attn, mw, x):
    """sum over query heads i and ALL token pairs (t, s) of (q_i(t).k_g(s) - q'_i(t).z(s))^2: with no rotary
    between them this is exactly the key fit's objective (sum_g tr(G_g E[(k_g - P_g z)(k_g - P_g z)^T]))."""
    nh, nkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w, b = attn.qkv_proj.weight.detach(), attn.qkv_proj.bias.detach()
    x = x.reshape(-1, x.shape[-1])
    qkv = (x @ w.T + b).view(-1, nh + 2 * nkv, d)
    q_new = (x @ mw.q_w.T + mw.q_b).view(-1, nh, d)
    z = (x @ mw.k_w.T + mw.k_b).view(-1, max(mw.kv_head_of) + 1, d)
    total = 0.0
    for i in range(nh):
        old = qkv[:, i] @ qkv[:, nh + attn.kv_head_of[i]].T
        new = q_new[:, i] @ z[:, mw.kv_head_of[i]].T
        total += float((old - new).pow(2).sum())
    return total


def test_a_nope_layer_is_fitted_without_the_rotary_constraint():
    """SmolLM3's NoPE layer 0 gets no rotary hook: merge_kv fits its keys with an unconstrained map, which
    differs from the per-pair (rotary) fit of the same layer and is at least as good on the objective."""
    model = _tiny(nope_layers=(0,), n_heads=6, n_kv=3)
    ids = _ids()
    caps = _captures(model, ids, 0)
    assert caps[0]["kwargs"].get("qk_transform") is None
    attn = model.layers[0].attn
    plain = merged_weights(attn, layer_stats(attn, caps), [[0, 1, 2]])
    hook = model.rotary.hook(0, ids.shape[1], dtype=torch.float64)  # the same layer as if it turned
    as_rotary = [{**c, "kwargs": {**c["kwargs"], "qk_transform": hook}} for c in caps]
    rotary_stats = layer_stats(attn, as_rotary)
    assert rotary_stats.rotary
    constrained = merged_weights(attn, rotary_stats, [[0, 1, 2]])
    assert not torch.allclose(plain.k_w, constrained.k_w, atol=1e-3)
    x = torch.cat([c["x"] for c in caps])
    err_plain, err_rotary = _all_pairs_logit_error(attn, plain, x), _all_pairs_logit_error(attn, constrained, x)
    assert err_plain <= err_rotary * (1 + 1e-9), (err_plain, err_rotary)
    # merge_kv itself takes the plain fit for that layer (and the rotary one for layer 1)
    merged = copy.deepcopy(model)
    merge_kv(merged, 1, layers=[0], calibration=ids, refit=False, local_steps=0, uptrain_steps=0, progress=False,
             grouping="contiguous")
    got = merged.layers[0].attn.qkv_proj.weight.detach()
    torch.testing.assert_close(got, torch.cat([plain.q_w, plain.k_w, plain.v_w]), rtol=1e-10, atol=1e-10)


def test_refine_steps_with_partial_rotary_is_refused_before_any_change():
    model = _tiny(rotary_dim=4)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="refine_steps"):
        merge_kv(model, 1, calibration=_ids(), refine_steps=5, progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
