"""K/V-head merging on whole models (headcount.surgery.merge_kv, merge_plan): exact cases, the rotary
commutation the aware merge stands on, mean == head_surgery, uneven groups, bad input."""

import copy
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headcount.models import Decoder, DecoderConfig
from headcount.models.rotary import RotaryEmbedding
from headcount.surgery import MergeResult, merge_kv, merge_plan
from headcount.surgery.merging.fit import pair_scale, reduce
from headcount.surgery.merging.planner import MergePlan, _solve


def _tiny(n_layers=2, n_heads=6, n_kv=3, head_dim=8, seed=0, position="rotary"):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=61, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                        head_dim=head_dim, d_ff=64, max_position=128, position=position)
    model = Decoder(cfg).double().eval()
    with torch.no_grad():  # larger attention weights: sharper attention than the default init gives
        for layer in model.layers:
            layer.attn.qkv_proj.weight.mul_(3.0)
    return model


def _ids(n=4, t=24, seed=1):
    return torch.randint(0, 61, (n, t), generator=torch.Generator().manual_seed(seed))


def _kv_rows(attn, which, g):
    nh, nkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    base = nh * d if which == "k" else (nh + nkv) * d
    return slice(base + g * d, base + (g + 1) * d)


# ------------------------------------------------------------------------------ the math it stands on
@given(start=st.integers(0, 60), c_re=st.floats(-2, 2), c_im=st.floats(-2, 2), seed=st.integers(0, 50))
def test_pair_scale_commutes_with_rotary(start, c_re, c_im, seed):
    """Keys scaled per frequency pair by c, queries by 1/conj(c): q.k logits unchanged at any positions."""
    d, t = 8, 5
    gen = torch.Generator().manual_seed(seed)
    wq, wk = torch.randn(d, 12, generator=gen, dtype=torch.float64), torch.randn(d, 12, generator=gen,
                                                                                   dtype=torch.float64)
    x = torch.randn(1, 1, t, 12, generator=gen, dtype=torch.float64)
    c = torch.complex(torch.randn(d // 2, generator=gen, dtype=torch.float64) + c_re,
                      torch.randn(d // 2, generator=gen, dtype=torch.float64) + c_im)
    c = torch.where(c.abs() < 1e-3, torch.ones_like(c), c)
    rope = RotaryEmbedding(d, 256).double()
    hook = rope.hook(start, t, dtype=torch.float64)

    def logits(wq_, wk_):
        q, k = hook(x @ wq_.T, x @ wk_.T)
        return q @ k.transpose(-1, -2)

    want = logits(wq, wk)
    got = logits(pair_scale(wq, 1 / c.conj()), pair_scale(wk, c))
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    # a 2x2 map that is not a rotation-scaling (row f scaled, row f + d/2 not) does not commute
    skew = wk.clone()
    skew[0] *= c.abs()[0]
    assert not torch.allclose(logits(pair_scale(wq, 1 / c.abs().to(c.dtype)), skew), want, atol=1e-6) or \
        float(c.abs()[0]) == pytest.approx(1.0)


def test_reduce_is_exact_on_rank_deficient_data_and_matches_weighted_pca():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(200, 3, generator=gen, dtype=torch.float64)
    mix = torch.randn(3, 9, generator=gen, dtype=torch.float64)
    x = base @ mix  # rank 3 in 9 dims
    sigma = x.T @ x
    g = torch.diag(torch.rand(9, generator=gen, dtype=torch.float64) + 0.5)
    b, p, kept = reduce(sigma, g, 3)
    recon = (x @ b) @ p.T
    torch.testing.assert_close(recon, x, rtol=1e-8, atol=1e-8)
    assert kept == pytest.approx(1.0)
    # rank 1 of full-rank data: the residual equals the G-weighted PCA tail (eigenvalues of G^1/2 S G^1/2)
    x = torch.randn(300, 4, generator=gen, dtype=torch.float64)
    sigma = x.T @ x
    g = torch.diag(torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64))
    b, p, kept = reduce(sigma, g, 1)
    err = (x - (x @ b) @ p.T)
    resid = float(((err @ g) * err).sum())
    w = torch.linalg.eigvalsh(g.sqrt() @ sigma @ g.sqrt())
    assert resid == pytest.approx(float(w[:-1].sum()), rel=1e-8)


# ------------------------------------------------------------------------------ exact cases
def test_identical_kv_heads_merge_exactly_through_the_aware_path():
    model = _tiny()
    attn = model.layers[0].attn
    with torch.no_grad():
        for which in ("k", "v"):
            attn.qkv_proj.weight[_kv_rows(attn, which, 1)] = attn.qkv_proj.weight[_kv_rows(attn, which, 0)]
    ids = _ids()
    want = model(ids).logits
    result = merge_kv(model, 2, local_steps=0, uptrain_steps=0, layers=[0], calibration=ids, refit=False, progress=False)
    info = result.layers[0]
    assert info.groups == [[0, 1], [2]]  # chosen from calibration: the identical pair
    assert attn.n_kv_heads == 2 and attn.kv_head_of == (0, 0, 0, 0, 1, 1)
    assert info.k_kept == pytest.approx(1.0) and info.v_kept == pytest.approx(1.0)
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-9, atol=1e-9)


def test_keys_differing_by_pair_scales_and_values_by_a_linear_map_merge_exactly():
    """K_1 = per-pair complex scale of K_0 and V_1 = M V_0: the group spans one head, so MQA is exact
    (the V mix is undone in o_proj's columns, the K scale in W_Q)."""
    model = _tiny(n_layers=1, n_heads=4, n_kv=2)
    attn = model.layers[0].attn
    gen = torch.Generator().manual_seed(3)
    c = torch.complex(torch.randn(4, generator=gen, dtype=torch.float64),
                      torch.randn(4, generator=gen, dtype=torch.float64))
    m = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        w = attn.qkv_proj.weight
        w[_kv_rows(attn, "k", 1)] = pair_scale(w[_kv_rows(attn, "k", 0)].clone(), c)
        w[_kv_rows(attn, "v", 1)] = m @ w[_kv_rows(attn, "v", 0)]
    ids = _ids()
    want = model(ids).logits
    merge_kv(model, 1, local_steps=0, uptrain_steps=0, calibration=ids, refit=False, progress=False)
    assert attn.n_kv_heads == 1
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-7, atol=1e-7)


def test_mean_method_equals_head_surgery():
    model = _tiny(n_heads=6, n_kv=6)
    expected = copy.deepcopy(model)
    for layer in expected.layers:
        layer.attn.merge_kv_heads(2)
    result = merge_kv(model, 2, method="mean", progress=False)
    for a, b in zip(model.layers, expected.layers):
        assert torch.equal(a.attn.qkv_proj.weight, b.attn.qkv_proj.weight)
        assert a.attn.kv_head_of == b.attn.kv_head_of
    assert result.kv_heads_before == [6, 6] and result.kv_heads_after == [2, 2]
    assert result.kv_bytes_per_token_after * 3 == result.kv_bytes_per_token_before


def test_uneven_three_to_two_decodes_like_prefill():
    model = _tiny()
    ids = _ids()
    result = merge_kv(model, 2, local_steps=0, uptrain_steps=0, calibration=ids, progress=False)
    for layer, info in zip(model.layers, result.layers):
        attn = layer.attn
        assert attn.n_kv_heads == 2 and not attn.is_uniform
        assert sorted(len(g) for g in info.groups) == [1, 2]
        assert attn.new_cache(1, 4).k.shape[1] == 2
    full = model(ids[:1]).logits
    cache = model.new_cache(1, ids.shape[1])
    steps = torch.cat([model(ids[:1, t:t + 1], cache=cache).logits for t in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-9, atol=1e-9)
    assert result.kv_bytes_per_token_after * 3 == result.kv_bytes_per_token_before * 2
    assert MergeResult.from_json(result.to_json()) == result


def test_aware_has_smaller_layer_error_than_mean_on_a_tiny_model():
    model = _tiny(n_heads=6, n_kv=3)
    ids = _ids(8, 32)
    mean_model = copy.deepcopy(model)
    merge_kv(mean_model, 1, method="mean", progress=False)
    want = model(ids).logits
    err_mean = (mean_model(ids).logits - want).pow(2).mean()
    aware_model = copy.deepcopy(model)
    result = merge_kv(aware_model, 1, local_steps=0, uptrain_steps=0, calibration=ids, progress=False,
                      ridge=1e-2)  # in-sample: a light ridge
    for info in result.layers:
        assert info.error_after_refit <= info.error_before_refit + 1e-12  # the refit never makes it worse
    err_aware = (aware_model(ids).logits - want).pow(2).mean()
    assert err_aware < 0.5 * err_mean


def test_local_refinement_lowers_the_error_on_windows_it_never_saw():
    model = _tiny(n_heads=6, n_kv=3)
    fit, unseen = _ids(32, 64), _ids(8, 64, seed=7)  # enough tokens that the layer's weights generalise
    want = model(unseen).logits
    closed = copy.deepcopy(model)
    merge_kv(closed, 1, local_steps=0, uptrain_steps=0, calibration=fit, progress=False)
    refined = copy.deepcopy(model)
    result = merge_kv(refined, 1, uptrain_steps=0, calibration=fit, local_steps=120, local_lr=5e-3, progress=False)
    assert all(info.error_after_local is not None for info in result.layers)
    err_closed = (closed(unseen).logits - want).pow(2).mean()
    err_refined = (refined(unseen).logits - want).pow(2).mean()
    assert err_refined < 0.97 * err_closed
    # only the merged layers' attention moved; nothing is left trainable-by-accident or holding gradients
    for a, b in zip(refined.parameters(), model.parameters()):
        assert a.requires_grad == b.requires_grad and a.grad is None and a.dtype == b.dtype
    for name in ("embed.weight", "layers.0.mlp.up.weight"):
        if name in dict(model.named_parameters()):
            assert torch.equal(dict(refined.named_parameters())[name], dict(model.named_parameters())[name])


@pytest.mark.parametrize("position", ["rotary", "learned"])
def test_causal_prefix_is_the_windows_own_first_tokens(position):
    """A step on a prefix is exact: the layer run on the first n tokens (with the rotary hook built for the
    whole window, padded and cut) gives the first n positions of the whole window's output."""
    from headcount.surgery.merging.refine import causal_prefix
    from headcount.surgery.merging.stream import Stream, calibration_batches

    model = _tiny(n_heads=6, n_kv=3, position=position)
    stream = Stream(model, calibration_batches(model, _ids(2, 40), n_windows=2, window=40, batch_size=1))
    for cap in stream.layer_io(0):
        attn = model.layers[0].attn
        x, kwargs, y = causal_prefix(cap, cap["y"], 17)
        assert x.shape[1] == 17 and y.shape[1] == 17
        torch.testing.assert_close(attn(x, **kwargs).output, cap["y"][:, :17], rtol=1e-10, atol=1e-12)
        whole = causal_prefix(cap, cap["y"], None)
        assert whole[0] is cap["x"] and whole[1] is cap["kwargs"]
        padded = dict(cap, mask=torch.ones(cap["x"].shape[0] * cap["x"].shape[1], dtype=torch.bool))
        assert causal_prefix(padded, cap["y"], 17)[0] is cap["x"]  # a padding mask: the batch unchanged


def test_refit_reports_the_error_before_it_from_its_own_gram_sums():
    """refit_o_proj_errors' "before" (read off the Gram sums) equals the error measured by running the layer."""
    from headcount.surgery.merging.fit import output_error, refit_o_proj_errors
    from headcount.surgery.merging.stream import Stream, calibration_batches

    model = _tiny(n_heads=6, n_kv=3)
    caps = Stream(model, calibration_batches(model, _ids(3, 24), n_windows=3, window=24, batch_size=1)).layer_io(0)
    attn = model.layers[0].attn
    targets = [c["y"] + 0.1 * torch.randn_like(c["y"]) for c in caps]  # a target the layer does not meet
    measured = output_error(attn, caps, targets)
    before, after = refit_o_proj_errors(attn, caps, targets, ridge=1e-3)
    assert before == pytest.approx(measured, rel=1e-9)
    assert after < before and after == pytest.approx(output_error(attn, caps, targets), rel=1e-9)


def test_local_steps_on_prefixes_lower_the_error_on_unseen_windows():
    model = _tiny(n_heads=6, n_kv=3)
    fit, unseen = _ids(32, 64), _ids(8, 64, seed=7)
    want = model(unseen).logits
    closed = copy.deepcopy(model)
    merge_kv(closed, 1, local_steps=0, uptrain_steps=0, calibration=fit, progress=False)
    refined = copy.deepcopy(model)
    result = merge_kv(refined, 1, uptrain_steps=0, calibration=fit, local_steps=120, local_lr=5e-3, local_tokens=32,
                      progress=False)
    assert result.options["local_tokens"] == 32
    err_closed = (closed(unseen).logits - want).pow(2).mean()
    assert (refined(unseen).logits - want).pow(2).mean() < 0.97 * err_closed
    with pytest.raises(ValueError, match="local_tokens"):
        merge_kv(copy.deepcopy(model), 1, uptrain_steps=0, calibration=fit, local_steps=2, local_tokens=0, progress=False)


def test_local_refinement_touches_only_the_layers_it_merges():
    model = _tiny(n_layers=2, n_heads=6, n_kv=3)
    merged = copy.deepcopy(model)
    merge_kv(merged, 1, uptrain_steps=0, layers=[0], calibration=_ids(8, 32), local_steps=20, progress=False)
    for (name, a), (_, b) in zip(merged.named_parameters(), model.named_parameters()):
        if not name.startswith("layers.0.attn."):
            assert torch.equal(a, b), name
    assert merged.layers[1].attn.n_kv_heads == 3 and merged.layers[0].attn.n_kv_heads == 1


def test_aware_beats_mean_on_smollm2_calibration_loss(smollm2):
    from headcount.analysis.batches import token_windows
    from headcount.surgery.merging.stream import calibration_batches, calibration_loss

    windows = token_windows(smollm2, window=96, max_windows=4)
    fit, evaluate = windows[:2], calibration_batches(smollm2, windows[2:])
    base = calibration_loss(smollm2, evaluate)
    losses = {}
    for method in ("mean", "aware"):
        model = copy.deepcopy(smollm2)
        merge_kv(model, 1, local_steps=0, uptrain_steps=0, layers=[3, 4], method=method, calibration=fit, progress=False)
        losses[method] = calibration_loss(model, evaluate)
    assert losses["aware"] - base < 0.5 * (losses["mean"] - base)


# ------------------------------------------------------------------------------ plans
def test_plan_solver_is_optimal_against_brute_force():
    model = _tiny(n_layers=4)
    gen = torch.Generator().manual_seed(5)
    table = {i: {2: float(torch.rand(1, generator=gen)), 1: float(torch.rand(1, generator=gen)) + 0.5}
             for i in range(4)}
    per_head = 2 * 8 * 8  # K and V, head_dim 8, float64
    for limit_heads in range(4, 13):
        picks, cost, total = _solve(model, table, limit_heads * per_head)
        best = min(
            (sum(table[i][n] for i, n in enumerate(choice) if n != 3), choice)
            for choice in itertools.product((3, 2, 1), repeat=4) if sum(choice) <= limit_heads)
        assert cost == pytest.approx(best[0])
        assert total <= limit_heads * per_head


def test_merge_plan_meets_the_budget_and_applies():
    model = _tiny(n_layers=3)
    ids = _ids(4, 24)
    plan = merge_plan(model, 0.67, calibration=ids, n_windows=2, n_eval_windows=2, candidates=[1],
                      progress=False)
    assert plan.kv_bytes_per_token_after <= 0.67 * plan.kv_bytes_per_token_before
    assert set(plan.sensitivity) == {0, 1, 2} and all(set(v) == {1} for v in plan.sensitivity.values())
    assert MergePlan.from_json(plan.to_json()) == plan
    result = merge_kv(model, plan, local_steps=0, uptrain_steps=0, calibration=ids, progress=False)
    assert result.kv_bytes_per_token_after == plan.kv_bytes_per_token_after
    again = merge_plan(_tiny(n_layers=3), 1.0, sensitivity_from=plan)
    assert again.kv_heads == {}


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs,match", [
    ({"n_kv_heads": 0}, "n_kv_heads"),
    ({"n_kv_heads": 4}, "n_kv_heads"),
    ({"n_kv_heads": 2, "method": "mean"}, "divisor"),
    ({"n_kv_heads": 1, "layers": [0, 5]}, "layers"),
    ({"n_kv_heads": 1, "layers": [1, 1]}, "duplicate"),
    ({"n_kv_heads": 1, "layers": []}, "layers"),
    ({"n_kv_heads": 1, "method": "median"}, "method"),
    ({"n_kv_heads": 1, "target": "x"}, "target"),
])
def test_bad_input_is_refused_before_any_weight_changes(kwargs, match):
    model = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n = kwargs.pop("n_kv_heads")
    with pytest.raises(ValueError, match=match):
        merge_kv(model, n, local_steps=0, uptrain_steps=0, calibration=_ids(), progress=False, **kwargs)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(layer.attn.n_kv_heads == 3 for layer in model.layers)


def test_bad_types_and_budgets():
    model = _tiny()
    with pytest.raises(TypeError, match="n_kv_heads"):
        merge_kv(model, 1.5, local_steps=0, uptrain_steps=0, progress=False)
    with pytest.raises(TypeError, match="n_kv_heads"):
        merge_kv(model, True, local_steps=0, uptrain_steps=0, progress=False)
    with pytest.raises(ValueError, match="budget"):
        merge_plan(model, 0.2, calibration=_ids())  # below every-layer MQA (1/3)
    with pytest.raises(ValueError, match="budget"):
        merge_plan(model, 1.5, calibration=_ids())


def test_mixed_calibration_interleaves_prose_and_code_windows(smollm2):
    from headcount.analysis.batches import token_windows
    from headcount.data import code_corpus
    from headcount.surgery.merging.stream import calibration_batches

    prose = token_windows(smollm2, None, window=64, max_windows=2)
    code = token_windows(smollm2, code_corpus().texts("calibration"), window=64, max_windows=2)
    batches = calibration_batches(smollm2, "mixed", n_windows=4, window=64, batch_size=4)
    assert len(batches) == 1
    assert torch.equal(batches[0].ids, torch.stack([prose[0], code[0], prose[1], code[1]]))
    from headcount.surgery.pruning.removal import calibration_batches as prune_batches
    (ids, mask), = prune_batches(smollm2, "mixed", calibration_windows=4, window=64)
    assert mask is None and torch.equal(ids, batches[0].ids)  # pruning and merging read the same windows
