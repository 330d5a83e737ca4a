"""headcount.analysis.importance on tiny random models (exact truths) and, briefly, on the real models."""

import math

import pytest
import torch
from scipy.stats import spearmanr

from headcount.analysis import objectives
from headcount.analysis.head_importance import METHODS, importance
from headcount.analysis.scores import HeadScores
from headcount.models import Decoder, DecoderConfig, Encoder, EncoderConfig


pytestmark = pytest.mark.usefixtures("one_thread_for_tiny_models")


def tiny_decoder(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=40, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=32, max_position=32)
    cfg.update(kw)
    return Decoder(DecoderConfig(**cfg), dtype=dtype).eval()


def tiny_encoder(seed=0, dtype=torch.float64, d_model=24):
    torch.manual_seed(seed)
    cfg = EncoderConfig(vocab_size=40, d_model=d_model, n_layers=2, n_heads=3, d_ff=32, max_position=32)
    return Encoder(cfg, dtype=dtype).eval()


def total_loss(model, ids, hook_layer=None, hook=None):
    handle = model.layers[hook_layer].attn.o_proj.register_forward_pre_hook(hook) if hook else None
    try:
        with torch.no_grad():
            return float(objectives.lm_nll(model, ids).sum())
    finally:
        if handle:
            handle.remove()


def test_gradient_equals_finite_differences_of_per_position_gates():
    model = tiny_decoder()
    ids = torch.randint(0, 40, (2, 6))
    scores = importance(model, method="gradient", windows=ids, progress=False)
    dh, eps = model.config.head_dim, 3e-3  # RMSNorm computes in float32: eps small enough, not tiny
    for layer, head in ((0, 1), (1, 3), (2, 0)):
        if True:
            total = 0.0
            for b in range(2):
                for t in range(5):  # the last position's output is not scored
                    def scale(factor):
                        def hook(module, args):
                            x = args[0].clone()
                            x[b, t, head * dh:(head + 1) * dh] *= factor
                            return (x,)
                        return hook
                    d = (total_loss(model, ids, layer, scale(1 + eps)) -
                         total_loss(model, ids, layer, scale(1 - eps))) / (2 * eps)
                    total += abs(d)
            assert scores.scores[layer, head].item() == pytest.approx(total / 10, rel=2e-3)
    assert scores.n_tokens == 10 and scores.method == "gradient"
    # the per-position gradients sum to the gradient w.r.t. the public head_gates (signed)
    gates = torch.ones(3, 4, dtype=torch.float64, requires_grad=True)
    objectives.lm_nll(model, ids, gates).sum().backward()
    assert gates.grad.abs().le(scores.scores * 10 + 1e-9).all()


def test_gradient_normalize_divides_each_layer_by_its_l2_norm():
    model = tiny_decoder(1)
    ids = torch.randint(0, 40, (1, 8))
    raw = importance(model, method="gradient", windows=ids, progress=False)
    norm = importance(model, method="gradient", windows=ids, progress=False, normalize=True)
    torch.testing.assert_close(norm.scores, raw.scores / raw.scores.norm(dim=1, keepdim=True))
    assert norm.normalized and not raw.normalized


def test_ablation_equals_two_explicit_forwards():
    model = tiny_decoder(2)
    ids = torch.randint(0, 40, (3, 7))
    scores = importance(model, method="ablation", windows=ids, progress=False, heads_per_forward=5, batch_size=2)
    base = total_loss(model, ids)
    for layer in range(3):
        for head in range(4):
            gates = torch.ones(3, 4, dtype=torch.float64)
            gates[layer, head] = 0
            with torch.no_grad():
                off = float(objectives.lm_nll(model, ids, gates).sum())
            assert scores.scores[layer, head].item() == pytest.approx((off - base) / 18, rel=1e-6, abs=1e-9)


def test_ablation_and_order_on_a_pruned_model_are_padded():
    model = tiny_decoder(3, n_kv_heads=4)
    model.layers[1].attn.prune_heads([0, 2])  # layer 1 keeps original heads 1, 3
    ids = torch.randint(0, 40, (2, 6))
    scores = importance(model, method="ablation", windows=ids, progress=False)
    assert scores.heads_per_layer == (4, 2, 4)
    assert scores.kept_heads[1] == (1, 3)
    assert torch.isnan(scores.scores[1, 2:]).all() and not torch.isnan(scores.scores[1, :2]).any()
    order = scores.order()
    assert len(order) == 10 and all(h < 2 for l, h in order if l == 1)
    assert {(l, h) for l, h in scores.order(original=True) if l == 1} == {(1, 1), (1, 3)}
    base = total_loss(model, ids)
    gates = [torch.ones(4, dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64),
             torch.ones(4, dtype=torch.float64)]
    with torch.no_grad():
        off = float(objectives.lm_nll(model, ids, gates).sum())
    assert scores.scores[1, 1].item() == pytest.approx((off - base) / 10, rel=1e-6)
    for method in ("gradient", "confidence", "reconstruction"):
        s = importance(model, method=method, windows=ids, progress=False)
        assert torch.isnan(s.scores[1, 2:]).all() and torch.isfinite(s.values()).all(), method


def test_confidence_equals_a_hand_computation():
    model = tiny_decoder(4)
    ids = torch.randint(0, 40, (2, 9))
    scores = importance(model, method="confidence", windows=ids, progress=False)
    with torch.no_grad():
        weights = model(ids, need_weights=True).weights
    for layer in range(3):
        for head in range(4):
            values = [float(weights[layer][b, head, t, 1:].max()) for b in range(2) for t in range(1, 9)]
            assert scores.scores[layer, head].item() == pytest.approx(sum(values) / len(values), rel=1e-12)


def test_encoder_confidence_and_ablation_skip_padding():
    model = tiny_encoder()
    ids = torch.randint(1, 40, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    conf = importance(model, method="confidence", windows=[(ids, mask)], progress=False)
    with torch.no_grad():
        w0 = model(ids[:1], mask[:1], need_weights=True).weights
        w1 = model(ids[1:, :4], mask[1:, :4], need_weights=True).weights
    values = [float(w0[0][0, 2, t, 1:].max()) for t in range(1, 7)] + [float(w1[0][0, 2, t, 1:].max())
                                                                       for t in range(1, 4)]
    assert conf.scores[0, 2].item() == pytest.approx(sum(values) / len(values), rel=1e-9)
    abl = importance(model, method="ablation", windows=[(ids, mask)], progress=False)
    with torch.no_grad():
        ref = objectives.pooled(model, ids, mask)
        gates = torch.ones(2, 3, dtype=torch.float64)
        gates[1, 0] = 0
        off = objectives.pooled(model, ids, mask, gates)
    assert abl.scores[1, 0].item() == pytest.approx(float(objectives.fidelity(off, ref).mean()), rel=1e-9)


def test_encoder_gradient_is_the_gauss_newton_term_of_fidelity():
    """The encoder 'gradient' score is 1/2 E ||d e / d xi_h||^2 (exact with probes=None, estimated with random
    probes), checked against a Jacobian per sentence; for a small gate change it predicts the fidelity loss."""
    model = tiny_encoder(1, d_model=12)
    ids = torch.randint(1, 40, (2, 6))
    mask = torch.ones_like(ids)
    exact_scores = importance(model, method="gradient", windows=[(ids, mask)], probes=None, progress=False)
    est = importance(model, method="gradient", windows=[(ids, mask)], probes=64, progress=False)
    exact = torch.zeros(2, 3, dtype=torch.float64)
    for b in range(2):
        def emb(g):
            gates = torch.ones(2, 1, 3, dtype=torch.float64) + g.view(2, 1, 3)
            return objectives.pooled(model, ids[b:b + 1], mask[b:b + 1], gates)[0]
        jac = torch.autograd.functional.jacobian(emb, torch.zeros(6, dtype=torch.float64))  # [d, 6]
        exact += 0.5 * (jac ** 2).sum(0).view(2, 3) / 2
    torch.testing.assert_close(exact_scores.scores, exact, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(est.scores, exact, rtol=0.7, atol=1e-6)  # 64 random probes: ~18% spread
    assert spearmanr(est.values(), exact_scores.values()).statistic > 0.9
    # second-order: 1 - cos for a small gate change delta ~ 1/2 delta^2 ||J||^2
    delta = 1e-3
    gates = torch.ones(2, 3, dtype=torch.float64)
    gates[0, 1] -= delta
    with torch.no_grad():
        loss = objectives.fidelity(objectives.pooled(model, ids, mask, gates), objectives.pooled(model, ids, mask))
    assert float(loss.mean()) == pytest.approx(float(exact[0, 1]) * delta ** 2, rel=0.02)


def test_reconstruction_finds_a_duplicated_head_free_to_remove():
    """Head 1 of layer 1 is an exact copy of head 0: ablation says it matters, but an o_proj refit can absorb
    it (its context equals head 0's), so reconstruction scores it (or head 0) the cheapest of all."""
    model = tiny_decoder(5, n_kv_heads=4, n_layers=2)
    attn = model.layers[1].attn
    dh, nh = attn.head_dim, attn.n_heads
    with torch.no_grad():
        for off in (0, nh * dh, 2 * nh * dh):  # Q, K, V blocks
            attn.qkv_proj.weight[off + dh:off + 2 * dh] = attn.qkv_proj.weight[off:off + dh]
    ids = torch.randint(0, 40, (4, 12))
    rec = importance(model, method="reconstruction", windows=ids, progress=False, ridge=1e-6)
    abl = importance(model, method="ablation", windows=ids, progress=False)
    first = rec.order()[0]
    assert first in ((1, 0), (1, 1))
    assert rec.scores[first].item() < 1e-6  # the refit absorbs it exactly ...
    assert sorted(rec.values().tolist())[1] > 1e-4  # ... and no other head is free
    assert abl.scores[first].abs().item() > 1e-4  # while gating it off changes the loss
    other = (1, 1 - first[1])
    assert rec.scores[other].item() > 1e-4  # greedy: once the copy is gone, the original is not free
    one_step = importance(model, method="reconstruction", windows=ids, progress=False, ridge=1e-6, greedy=False)
    assert one_step.scores[1, 0].item() < 1e-6 and one_step.scores[1, 1].item() < 1e-6  # alone, either is
    # scores are non-decreasing along each layer's greedy sequence, so order() keeps it
    for layer in range(2):
        seq = [h for l, h in rec.order() if l == layer]
        vals = [rec.scores[layer, h].item() for h in seq]
        assert vals == sorted(vals)


def test_reconstruction_output_moments_equal_the_sums_over_captured_outputs():
    """X1^T Y and Y^T Y are derived from X1^T X1 and o_proj's weights (not summed per layer during the backward):
    they equal the sums over o_proj's captured outputs, bias included."""
    from headcount.analysis.head_importance import _own_output_moments

    model = tiny_decoder(6, n_kv_heads=4, n_layers=2)
    attn = model.layers[1].attn
    attn.o_proj.bias = torch.nn.Parameter(torch.randn(attn.o_proj.out_features, dtype=torch.float64))
    ids = torch.randint(0, 40, (3, 10))
    seen = {}
    hook = attn.o_proj.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model(ids)
    hook.remove()
    x = seen["x"].reshape(-1, seen["x"].shape[-1]).double()
    y = seen["y"].reshape(-1, seen["y"].shape[-1]).double()
    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)
    xty, yty = _own_output_moments(attn, x1.T @ x1)
    torch.testing.assert_close(xty, x1.T @ y, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(yty, (y * y).sum(0), rtol=1e-9, atol=1e-9)


def test_headscores_json_order_and_spearman():
    s = torch.tensor([[0.5, 0.1, 0.1], [0.2, float("nan"), float("nan")]])
    hs = HeadScores(s, "gradient", "a text", 12, (3, 1), ((0, 1, 2), (2,)), info={"x": 1})
    assert hs.order() == [(0, 1), (0, 2), (1, 0), (0, 0)]
    assert hs.order(original=True) == [(0, 1), (0, 2), (1, 2), (0, 0)]
    back = HeadScores.from_json(hs.to_json())
    assert torch.equal(back.scores.isnan(), hs.scores.isnan())
    assert torch.equal(back.scores.nan_to_num(-1), hs.scores.nan_to_num(-1))
    assert (back.method, back.source, back.n_tokens, back.heads_per_layer, back.kept_heads, back.info) == \
        ("gradient", "a text", 12, (3, 1), ((0, 1, 2), (2,)), {"x": 1})
    import json
    assert HeadScores.from_json(json.dumps(hs.to_json())).to_json() == hs.to_json()
    other = HeadScores(torch.tensor([[3.0, 1.0, 2.0], [0.0, math.nan, math.nan]]), "ablation",
                       heads_per_layer=(3, 1))
    assert hs.spearman(other) == pytest.approx(spearmanr([0.5, 0.1, 0.1, 0.2], [3, 1, 2, 0]).statistic)
    with pytest.raises(ValueError, match="heads_per_layer"):
        HeadScores(s, "gradient", heads_per_layer=(3, 4))


def test_bad_input():
    model = tiny_decoder()
    ids = torch.randint(0, 40, (1, 6))
    with pytest.raises(ValueError, match="method"):
        importance(model, method="magic", windows=ids)
    with pytest.raises(ValueError, match="group"):
        importance(model, windows=ids, group="everyone", progress=False)
    with pytest.raises(ValueError, match="estimator"):
        importance(tiny_encoder(), method="reconstruction", windows=[(ids, torch.ones_like(ids))],
                   estimator="first", progress=False)
    assert METHODS == ("gradient", "ablation", "confidence", "reconstruction")


def test_real_models_small(smollm2, minilm):
    g = importance(smollm2, method="gradient", window=64, max_windows=1, progress=False)
    assert g.scores.shape == (30, 9) and torch.isfinite(g.scores).all() and (g.scores > 0).all()
    assert g.source == "default corpus: calibration" and g.n_tokens == 63 and g.model == "smollm2"
    kw = dict(max_sentences=6, progress=False)
    grad, abl = importance(minilm, method="gradient", **kw), importance(minilm, method="ablation",
                                                                        heads_per_forward=12, **kw)
    assert grad.scores.shape == (6, 12)
    assert grad.spearman(abl) > 0.6  # the Gauss-Newton proxy tracks ablation on the real encoder


def test_package_exports_the_function_even_after_its_module_is_imported():
    import headcount.analysis as analysis
    import headcount.analysis.head_importance as module  # importing the module must not shadow the export
    model = tiny_decoder()
    ids = torch.randint(0, 40, (1, 6))
    a = analysis.importance(model, method="confidence", windows=ids, progress=False)
    b = importance(model, method="confidence", windows=ids, progress=False)
    assert torch.equal(a.scores, b.scores)
    assert analysis.importance is module.importance and callable(module.cost_ratio)
    assert analysis.METHODS == METHODS and analysis.HeadScores is HeadScores


def test_cost_ratio_and_agreement_report_their_numbers():
    from headcount.analysis.head_importance import agreement, cost_ratio
    model = tiny_decoder(6)
    ids = torch.randint(0, 40, (2, 10))
    cost = cost_ratio(model, windows=ids, methods=("gradient", "ablation"))
    assert cost["tokens"] == 20 and cost["n_heads"] == 12
    assert cost["forward_s"] > 0 and cost["ablation_ratio"] > 0 and cost["gradient_ratio"] > 0
    agree = agreement(model, windows=ids, progress=False)
    assert set(agree["spearman"]) == {"gradient", "gradient_normalized", "confidence", "reconstruction"}
    truth = HeadScores.from_json(agree["scores"]["ablation"])
    grad = HeadScores.from_json(agree["scores"]["gradient"])
    assert agree["spearman"]["gradient"] == pytest.approx(grad.spearman(truth))
    assert agree["n_heads"] == 12 and agree["n_tokens"] == 18


def test_agreement_reuses_given_scores_and_refuses_ones_from_other_text():
    from headcount.analysis.head_importance import agreement
    model = tiny_decoder(6)
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(3))
    fresh = agreement(model, windows=ids, progress=False)
    given = {m: HeadScores.from_json(fresh["scores"][m]) for m in ("ablation", "confidence")}
    given["confidence"].scores[0, 0] += 100.0  # a marker: reused scores change the result, recomputed would not
    reused = agreement(model, windows=ids, progress=False, given=given)
    assert reused["spearman"]["gradient"] == pytest.approx(fresh["spearman"]["gradient"])
    assert reused["spearman"]["confidence"] == pytest.approx(given["confidence"].spearman(given["ablation"]))
    assert reused["spearman"]["confidence"] != pytest.approx(fresh["spearman"]["confidence"])
    other = importance(model, method="confidence", windows=ids[:1], progress=False)
    with pytest.raises(ValueError, match="given"):
        agreement(model, windows=ids, progress=False, given={"confidence": other})
