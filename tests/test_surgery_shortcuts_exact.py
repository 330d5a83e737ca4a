"""The shortcuts the pruning and merging defaults take give what the long way gives:
- residual_outliers(stop_when_formed=True) ends the forward at the layer where the outliers form, and finds the same
  layer (and protected layers) as the whole forward;
- refit.RemovalSequence (the greedy reconstruction order's loop: one inverse, then downdates) gives every error a
  fresh refit gives;
- refine.expanded_kv (an explicit query -> KV map on a one-KV-head layer while gradients flow) gives the layer's
  output and weight gradients of the enable_gqa path, and leaves the layer as it was."""

import pytest
import torch

from headcount.analysis.outliers import residual_outliers
from headcount.analysis.refit import RemovalSequence, objective
from headcount.attention import MultiHeadAttention
from headcount.models import Decoder, DecoderConfig
from headcount.surgery.merging.refine import expanded_kv
from test_analysis_refit import _stats  # the Gram statistics of (x, y), bias column included

pytestmark = pytest.mark.usefixtures("one_thread")

def _data(n=200, d=12, m=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    y = x @ torch.randn(d, m, generator=g, dtype=torch.float64)
    y = y + 0.3 * torch.randn(n, m, generator=g, dtype=torch.float64)
    return x, y


@pytest.mark.parametrize("ridge", [1e-3, 0.1])
def test_removal_sequence_downdates_equal_fresh_refits(ridge):
    """Remove heads one by one (the greedy order's loop): after each downdate, every error and the objective
    equal brute-force refits on the columns left, down to the bias alone."""
    x, y = _data(d=12)
    stats = _stats(x, y)
    heads = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    weights = torch.rand(y.shape[1], generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
    seq = RemovalSequence(stats, heads, ridge=ridge, weights=weights)
    left = list(heads)
    for j in (2, 0, 1, 0):
        keep = [c for cols in left for c in cols]
        assert seq.objective() == pytest.approx(objective(stats, keep, ridge=ridge, weights=weights), rel=1e-9)
        errs = seq.errors()
        for h in range(len(left)):
            rest = [c for g, cols in enumerate(left) if g != h for c in cols]
            assert errs[h].item() == pytest.approx(objective(stats, rest, ridge=ridge, weights=weights), rel=1e-9)
        seq.remove(j)
        del left[j]
    assert seq.objective() == pytest.approx(objective(stats, [], ridge=ridge, weights=weights), rel=1e-9)


def _decoder(outlier_layer: int | None) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                                  max_position=64)).eval()
    if outlier_layer is not None:  # one channel of that layer's MLP output 20,000 times larger
        with torch.no_grad():
            model.layers[outlier_layer].mlp.down_proj.weight[5].mul_(2e4)
    return model


@pytest.mark.parametrize("outlier_layer", [None, 1, 3])
def test_outliers_stop_at_the_layer_they_form_in_and_find_the_same_layers(outlier_layer):
    model = _decoder(outlier_layer)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    seen = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: seen.append(i)) for i, layer in enumerate(model.layers)]
    try:
        short = residual_outliers(model, ids, stop_when_formed=True)
    finally:
        for handle in handles:
            handle.remove()
    whole = residual_outliers(model, ids)
    assert short.formed_at == whole.formed_at == outlier_layer
    assert short.protected == whole.protected
    ran = len(model.layers) if outlier_layer is None else outlier_layer + 1
    assert seen == list(range(ran))  # the layers after the one where they formed never ran
    assert short.max_abs == whole.max_abs[:ran] and short.median_abs == whole.median_abs[:ran]


def test_expanded_kv_gives_the_gqa_paths_output_and_gradients():
    torch.manual_seed(0)
    attn = MultiHeadAttention(48, 6, n_kv_heads=1, head_dim=8)
    x = torch.randn(2, 20, 48)

    def run():
        attn.zero_grad(set_to_none=True)
        out = attn(x, is_causal=True).output
        out.pow(2).sum().backward()
        return out.detach(), [p.grad.clone() for p in attn.parameters()]

    plain = run()
    with expanded_kv(attn):
        assert attn.kv_index is not None and attn.kv_index.tolist() == [0] * 6
        expanded = run()
    assert attn.kv_index is None and attn.is_uniform  # as it was
    torch.testing.assert_close(expanded[0], plain[0], rtol=1e-5, atol=1e-6)
    for got, want in zip(expanded[1], plain[1]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_expanded_kv_leaves_other_layers_alone():
    gqa = MultiHeadAttention(48, 6, n_kv_heads=2, head_dim=8)
    with expanded_kv(gqa):
        assert gqa.kv_index is None  # 2 KV heads: enable_gqa is the faster path there
