"""Faithfulness: Kendall tau against a hand count and scipy, JSD / TV against their formulas, the
adversarial search staying within epsilon on a tiny model, the importance measures against direct
recomputation."""

import math

import pytest
import torch
import torch.nn.functional as F

from headcount.analysis.faithful import (adversarial_search, default_layers, gradient_x_input,
                                             js_divergence, kendall_tau, leave_one_out, total_variation)
from headcount.models.decoder import Decoder, DecoderConfig


def tiny_decoder():
    torch.manual_seed(0)
    return Decoder(DecoderConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48,
                                 max_position=64)).eval()


def hand_tau(x, y):
    """Kendall tau-a by counting pairs (no ties in the inputs used)."""
    n, s = len(x), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += math.copysign(1, (x[i] - x[j]) * (y[i] - y[j]))
    return s / (n * (n - 1) / 2)


def test_kendall_tau_known_pairs():
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(12, generator=g), torch.rand(12, generator=g)
    assert kendall_tau(x, y) == pytest.approx(hand_tau(x.tolist(), y.tolist()))
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))  # uniform attention has no ranking


def test_jsd_and_tv_formulas():
    p = torch.tensor([1.0, 0.0])
    q = torch.tensor([0.0, 1.0])
    assert float(js_divergence(p, q)) == pytest.approx(1.0)  # disjoint supports: 1 bit
    assert float(js_divergence(p, p)) == 0
    a, b = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    m = (a + b) / 2
    want = 0.5 * float((a * (a / m).log2()).sum()) + 0.5 * float((b * (b / m).log2()).sum())
    assert float(js_divergence(a, b)) == pytest.approx(want)
    assert float(total_variation(a, b)) == pytest.approx(0.3)


def test_default_layers_spread():
    assert default_layers(30) == [0, 14, 29] or default_layers(30) == [0, 15, 29]
    assert default_layers(2) == [0, 1]


def test_importance_measures_by_direct_recomputation():
    model = tiny_decoder().double()  # float64 so the finite difference below is exact enough
    ids = torch.randint(0, 40, (8,))
    target = 7
    loo = leave_one_out(model, ids, target)
    with torch.no_grad():
        def loss(x):
            return float(F.cross_entropy(model(x[None]).logits[0, -1], torch.tensor(target)))
        base = loss(ids)
        for i in (0, 3, 6):
            assert float(loo[i]) == pytest.approx(abs(loss(torch.cat([ids[:i], ids[i + 1:]])) - base), abs=1e-5)
    assert float(loo[-1]) == 0
    # gradient x input: the first-order change of the loss when token i's embedding is scaled by (1 - h)
    gxi = gradient_x_input(model, ids, target)
    h = 1e-2  # RMSNorm computes in float32 even for a float64 model: a larger step
    for i in (1, 5):
        def scaled(s):
            def hook(m, a, out):
                out = out.clone()
                out[0, i] *= s
                return out
            handle = model.embed.register_forward_hook(hook)
            try:
                with torch.no_grad():
                    return float(F.cross_entropy(model(ids[None]).logits[0, -1].double(), torch.tensor(target)))
            finally:
                handle.remove()
        fd = (scaled(1 + h) - scaled(1 - h)) / (2 * h)
        assert float(gxi[i]) == pytest.approx(abs(fd), rel=1e-2, abs=1e-6)
    assert all(p.grad is None for p in model.parameters())  # no weight touched, not even .grad


@pytest.mark.parametrize("epsilon", [0.01, 0.05])
def test_adversarial_search_stays_within_epsilon(epsilon):
    model = tiny_decoder()
    ids = torch.randint(0, 40, (10,))
    found, rows = adversarial_search(model, ids, [0, 2], epsilon=epsilon, steps=12, lr=0.5, penalty=10.0, seed=0)
    assert rows == [(l, h) for l in (0, 2) for h in range(4)]
    assert torch.all(found["tv"] <= epsilon)
    assert torch.all(found["jsd"] >= 0) and torch.all(found["jsd"] <= 1)
    assert float(found["jsd"].max()) > 0.05  # it found attention that differs
    torch.testing.assert_close(found["attention"].sum(-1), torch.ones(len(rows), dtype=torch.float64))
    # the original rows are the model's own last-row attention
    with torch.no_grad():
        w = model(ids[None], need_weights=True).weights
    torch.testing.assert_close(found["original"][:4], w[0][0, :, -1].double(), atol=1e-5, rtol=1e-4)
    # and re-running with the best attention's logits reproduces a TV within epsilon
    assert torch.all(js_divergence(found["attention"], found["original"]) >= found["jsd"] - 1e-6)


def test_adversarial_search_runs_on_a_bf16_model():
    """The free vector is float32; the additive mask it becomes is the model's dtype (a bf16 model's attention
    refuses a float32 mask): the search runs, stays within a bf16-sized epsilon and finds other attention."""
    model = tiny_decoder().to(torch.bfloat16)
    ids = torch.randint(0, 40, (10,))
    found, rows = adversarial_search(model, ids, [1], epsilon=0.05, steps=8, lr=0.5, penalty=10.0, seed=0)
    assert rows == [(1, h) for h in range(4)]
    assert torch.isfinite(found["jsd"]).all() and torch.all(found["tv"] <= 0.05 + 1e-3)
    assert float(found["jsd"].max()) > 0.0


def test_faithfulness_on_smollm2_small(smollm2):
    from headcount.analysis import faithfulness
    text = ("The cat sat on the mat because it was warm. The dog slept by the door while the rain fell. "
            "Later the children came home from school and ate their dinner in the kitchen together.")
    r = faithfulness(smollm2, text, layers=[16], n_examples=1, length=8, steps=2, progress=False)
    j = r.to_json()
    assert set(j) == {"epsilon", "layers", "n_examples", "heads", "summary"}
    assert j["layers"] == [16] and len(j["heads"]) == 9
    assert set(j["heads"][0]) == {"layer", "head", "tau_gradient", "tau_loo", "tau_uniform", "jsd", "tv"}
    assert all(h["tv"] <= 0.01 for h in j["heads"])
    with pytest.raises(ValueError, match="out of range"):
        faithfulness(smollm2, text, layers=[30], n_examples=1, length=12, steps=1, progress=False)
