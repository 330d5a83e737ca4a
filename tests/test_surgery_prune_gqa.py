"""Retraining-free pruning that holds on GQA models, on tiny random decoders:
- plan_fraction's per-layer limits: `protect` layers lose nothing, `max_share` caps a layer, the count asked
  is still removed (the limits lifted when they cannot give it);
- analysis.outliers finds the layer where a massive activation forms (checked against transformers'
  hidden states);
- the lstsq refit with no bias (Gemma 3's default) adds no bias, solves the least-squares problem numpy solves,
  and beats no refit on the calibration objective;
- a Gemma 3 pruned unevenly exports to llama.cpp's gemma3 as exact zero heads and reloads with equal logits."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from headcount.analysis.refit import GramStats
from headcount.models import load
from headcount.surgery import prune, prune_to
from headcount.surgery.pruning import plan as _plan
from headcount.surgery.pruning.compensate import solve_toward

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from llamacpp_archs import tiny, tokenizer_gguf  # noqa: E402


@pytest.fixture(scope="module")
def gemma_vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "gemma3.gguf"
    return path, tokenizer_gguf(path, "gemma3")


def calib(vocab, n=4, t=24, seed=3):
    return torch.randint(4, vocab - 1, (n, t), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- plans
def _scores(model, cheap_layer=0):
    """Every head of `cheap_layer` scores below every other head: an unlimited plan takes it first."""
    return {(l, h): (0.01 * h if l == cheap_layer else 1.0 + 0.1 * l + 0.01 * h)
            for l, layer in enumerate(model.layers) for h in layer.attn.kept_heads}


def test_per_layer_cap_and_protection_hold():
    model = tiny("qwen2", 300)  # 3 layers x 4 query heads
    scores = _scores(model)
    free = _plan.plan_fraction(model, 0.25, scores)
    assert free == {0: [0, 1, 2]}  # the unlimited order empties layer 0 down to its last head
    capped = _plan.plan_fraction(model, 0.25, scores, max_share=0.5)
    assert len(capped[0]) == 2 and sum(map(len, capped.values())) == 3  # floor(0.5 x 4) = 2, the third elsewhere
    guarded = _plan.plan_fraction(model, 0.25, scores, protect=[0])
    assert 0 not in guarded and sum(map(len, guarded.values())) == 3
    for plan in (capped, guarded):  # the lowest scores outside the limit are the ones taken
        rest = sorted((s, lh) for lh, s in scores.items() if lh[0] != 0)
        taken = {(l, h) for l, hs in plan.items() for h in hs if l != 0}
        assert taken == {lh for _, lh in rest[:len(taken)]}


def test_limits_are_lifted_when_they_cannot_give_the_fraction():
    model = tiny("qwen2", 300)
    plan = _plan.plan_fraction(model, 0.5, _scores(model), protect=[0, 1], max_share=0.25)
    assert sum(map(len, plan.values())) == 6  # 0.5 x 12 heads, whatever the limits allow
    with pytest.raises(ValueError, match="max_share"):
        _plan.plan_fraction(model, 0.2, _scores(model), max_share=1.5)
    with pytest.raises(ValueError, match="protect"):
        prune_to(model, 0.2, protect=[7], compensate="none", order="random")


# ------------------------------------------------------------------------------------------- outliers
def test_residual_outliers_find_the_layer_a_massive_activation_forms_in():
    """By construction: layer 2's MLP writes one channel 20,000 times larger, so the residual stream's outlier
    forms in layer 2 (and stays: the residual carries it); layers 0 and 1 are left as they were."""
    from headcount.analysis.outliers import residual_outliers

    model = tiny("qwen2", 300)
    ids = calib(300, n=2, t=16)
    before = residual_outliers(model, ids)
    assert before.formed_at is None and before.protected == []
    with torch.no_grad():
        model.layers[2].mlp.down_proj.weight[5].mul_(2e4)
    after = residual_outliers(model, ids)
    assert after.formed_at == 2 and after.protected == [0, 1, 2]
    assert after.max_abs[:2] == before.max_abs[:2] and after.max_abs[2] > 500 * after.median_abs[2]
    with pytest.raises(ValueError, match="threshold"):
        residual_outliers(model, ids, threshold=1)


def test_prune_to_protects_the_layers_up_to_the_massive_activation_by_default():
    """A massive activation built into layer 1: layers 0 and 1 keep every head, the 3 heads asked come from
    layer 2 (all it can give); protect=() turns it off."""
    model = tiny("qwen2", 300)
    with torch.no_grad():
        model.layers[1].mlp.down_proj.weight[5].mul_(2e4)
    result = prune_to(model, 0.25, order="random", seed=1, compensate="mean", calibration=calib(300, n=2, t=16))
    assert result.protected == [0, 1] and set(result.removed) == {2} and result.heads_removed == 3
    assert prune_to(tiny("qwen2", 300), 0.25, order="random", compensate="mean", protect=(),
                    calibration=calib(300, n=2, t=16)).protected == []


# ------------------------------------------------------------------------------------------- no-bias refit
def test_fixed_bias_solve_is_numpy_least_squares():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64)
    y = x @ torch.randn(6, 3, generator=g, dtype=torch.float64) + 0.5 + 0.1 * torch.randn(200, 3, generator=g,
                                                                                           dtype=torch.float64)
    b0 = torch.tensor([0.2, -0.1, 0.3], dtype=torch.float64)
    x1 = torch.cat([x, torch.ones(200, 1, dtype=torch.float64)], 1)
    stats = GramStats(x1.T @ x1, x1.T @ y, (y * y).sum(0), 200)
    w, b = solve_toward(stats, torch.zeros(3, 6, dtype=torch.float64), ridge=0.0, b0=b0)
    want = np.linalg.lstsq(x.numpy(), (y - b0).numpy(), rcond=None)[0].T
    np.testing.assert_allclose(w.numpy(), want, atol=1e-10)
    assert torch.equal(b, b0)


def test_gemma3_refit_adds_no_bias_and_beats_no_refit():
    model = tiny("gemma3", 300)
    heads = {1: [1], 3: [0, 2], 5: [3]}
    result = prune(model, heads, compensate="lstsq", calibration=calib(300), progress=False)
    assert all(layer.attn.o_proj.bias is None for layer in model.layers) and result.to_json()["refit_bias"] is False
    assert [f.layer for f in result.layer_fits] == [1, 3, 5]
    for fit in result.layer_fits:  # the relative squared error against the target, on the calibration tokens
        assert fit.error_after < fit.error_none
    with_bias = prune(tiny("gemma3", 300), heads, compensate="lstsq", calibration=calib(300), progress=False,
                      bias=True)
    assert all(a.error_after <= b.error_after + 1e-9 for a, b in zip(with_bias.layer_fits, result.layer_fits))


# ------------------------------------------------------------------------------------------- gemma3 to GGUF
def test_unevenly_pruned_gemma3_exports_with_zero_heads_and_equal_logits(tmp_path, gemma_vocab):
    gguf = pytest.importorskip("gguf")
    from headcount.models.formats.gguf_deci import export_gguf, plan_gguf_export

    tok, vocab = gemma_vocab
    model = tiny("gemma3", vocab)
    prune(model, {1: [1], 3: [0, 2]}, compensate="lstsq", calibration=calib(vocab), progress=False)
    plan = plan_gguf_export(model)
    assert plan["architecture"] == "gemma3" and "saves no compute" in plan["reason"]
    assert plan["query_heads"] == [4, 3, 4, 2, 4, 4] and plan["query_heads_written"] == [4] * 6
    assert plan["zero_query_heads"] == 3 and plan["kv_heads_written"] == [1] * 6
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=tok)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["gemma3.attention.head_count"].contents() == 4
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    out = tensors["blk.3.attn_output.weight"].reshape(64, 4, 32)  # [d_model, heads, head_dim]
    assert (np.abs(out).sum((0, 2)) == 0).sum() == 2  # two zero heads in layer 3
    back = load(path, cache_dir=tmp_path / "cache")
    x = calib(vocab, n=2, t=24, seed=9)
    with torch.no_grad():
        assert (back(x).logits - model(x).logits).abs().max().item() <= 1e-5
