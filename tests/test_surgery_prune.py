"""headcount.surgery.prune / prune_to: structure, compensation against independent truths, bad input."""

import copy

import pytest
import torch

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery import prune, prune_to
from headcount.surgery.pruning.plan import plan_fraction, random_scores
from headcount.surgery.pruning.removal import kv_bytes_per_token, n_params


def tiny(n_layers=3, n_heads=6, n_kv=2, o_bias=False, d_model=32):
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8,
                        d_ff=48, max_position=64, o_bias=o_bias)
    return Decoder(cfg).double().eval()


def windows(n=6, t=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (n, t), generator=g)


def gates_off(model, heads):
    g = torch.ones(len(model.layers), model.config.n_heads, dtype=torch.float64)
    for layer, hs in heads.items():
        g[layer, hs] = 0.0
    return g


def capture_o_proj(model, layer, ids):
    box = {}
    h1 = model.layers[layer].attn.o_proj.register_forward_pre_hook(lambda m, a: box.__setitem__("z", a[0]))
    h2 = model.layers[layer].attn.o_proj.register_forward_hook(lambda m, a, o: box.__setitem__("y", o))
    with torch.no_grad():
        model(ids)
    h1.remove()
    h2.remove()
    return box["z"].reshape(-1, box["z"].shape[-1]), box["y"].reshape(-1, box["y"].shape[-1])


def test_structural_prune_equals_zero_gates():
    model = tiny()
    heads = {0: [1, 4], 2: [0, 1, 2]}  # layer 2 loses a whole group -> its KV head goes
    ids = windows(2, 16)
    with torch.no_grad():
        want = model(ids, head_gates=gates_off(model, heads)).logits
    result = prune(model, heads, compensate="none")
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert result.heads_before == 18 and result.heads_after == 13
    assert result.kv_heads_before == 6 and result.kv_heads_after == 5
    assert model.layers[0].attn.kept_heads == (0, 2, 3, 5)
    assert result.params_after == n_params(model) < result.params_before


def test_original_indices_after_an_earlier_prune():
    model = tiny()
    prune(model, {0: [0]}, compensate="none")
    ref = tiny()
    ids = windows(2, 16)
    with torch.no_grad():
        want = ref(ids, head_gates=gates_off(ref, {0: [0, 3]})).logits
    prune(model, [(0, 3)], compensate="none")  # original index 3 is current index 2
    assert model.layers[0].attn.kept_heads == (1, 2, 4, 5)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, atol=1e-10, rtol=0)


def test_lstsq_equals_brute_force_and_beats_none():
    model = tiny()
    cal = windows(6, 24)
    z, y = capture_o_proj(model, 0, cal)
    keep = [h for h in range(6) if h not in (1, 4)]
    cols = [h * 8 + j for h in keep for j in range(8)]
    x1 = torch.cat([z[:, cols], torch.ones(z.shape[0], 1, dtype=z.dtype)], dim=1)
    sol = torch.linalg.lstsq(x1, y).solution  # [K+1, d_model]
    none = model.layers[0].attn.o_proj.weight[:, cols]
    err_none = ((z[:, cols] @ none.T - y) ** 2).sum()
    err_lstsq = ((x1 @ sol - y) ** 2).sum()
    assert err_lstsq < 0.9 * err_none

    result = prune(model, {0: [1, 4]}, compensate="lstsq", calibration=cal, ridge=0.0)
    o = model.layers[0].attn.o_proj
    torch.testing.assert_close(o.weight, sol[:-1].T, atol=1e-8, rtol=1e-6)
    torch.testing.assert_close(o.bias, sol[-1], atol=1e-8, rtol=1e-6)
    fit = result.layer_fits[0]
    assert fit.error_after < fit.error_none
    assert fit.error_after == pytest.approx(float(err_lstsq / (y ** 2).sum()), rel=1e-6)


def test_mean_compensation_is_the_flap_formula():
    model = tiny()
    cal = windows(4, 24)
    z, _ = capture_o_proj(model, 1, cal)
    w = model.layers[1].attn.o_proj.weight.detach().clone()
    drop = [h * 8 + j for h in (2, 3) for j in range(8)]
    want = w[:, drop] @ z[:, drop].mean(0)
    prune(model, {1: [2, 3]}, compensate="mean", calibration=cal)
    torch.testing.assert_close(model.layers[1].attn.o_proj.bias, want, atol=1e-10, rtol=1e-8)


def test_sequential_refit_sees_the_pruned_layers_below():
    """Layer 1's refit targets the unpruned model's output; its inputs come from the pruned layer 0."""
    ref, model = tiny(), tiny()
    cal = windows(6, 24)
    prune(model, {0: [0, 1], 1: [3]}, compensate="lstsq", calibration=cal, ridge=0.0)
    _, y_ref = capture_o_proj(ref, 1, cal)  # target: the original stream
    z, y_now = capture_o_proj(model, 1, cal)
    x1 = torch.cat([z, torch.ones(z.shape[0], 1, dtype=z.dtype)], dim=1)
    best = torch.linalg.lstsq(x1, y_ref).solution
    torch.testing.assert_close(y_now, x1 @ best, atol=1e-7, rtol=1e-6)


def test_group_mode_shrinks_the_kv_cache():
    model = tiny()
    before = kv_bytes_per_token(model)
    result = prune(model, {0: [3, 4, 5], 1: [0, 1, 2]}, mode="group", compensate="none")
    assert result.kv_bytes_per_token_after == before - 2 * (2 * 8 * 8)  # two KV heads of 8 fp64 numbers, K and V
    assert model.layers[0].attn.new_cache(1, 10).nbytes == 2 * 1 * 10 * 8 * 8
    with pytest.raises(ValueError, match="whole GQA groups"):
        prune(tiny(), {0: [3, 4]}, mode="group", compensate="none")


def test_query_mode_frees_a_kv_head_only_when_unread():
    model = tiny()
    prune(model, {0: [0, 1]}, compensate="none")
    assert model.layers[0].attn.n_kv_heads == 2 and model.layers[0].attn.kv_head_of == (0, 1, 1, 1)
    prune(model, {0: [2]}, compensate="none")
    assert model.layers[0].attn.n_kv_heads == 1


@pytest.mark.parametrize("heads,match", [
    ({0: list(range(6))}, "all 6 remaining heads of layer 0"),
    ({3: [0]}, "layer 3 is out of range"),
    ({0: [6]}, "head 6 of layer 0 is out of range"),
    ([(0, 1), (0, 1)], "listed twice"),
    ({0: [-1]}, "out of range"),
])
def test_bad_heads_are_refused_and_change_nothing(heads, match):
    model = tiny()
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=match):
        prune(model, heads, compensate="lstsq", calibration=windows(2, 16))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_bad_arguments():
    model = tiny()
    with pytest.raises(ValueError, match="compensate"):
        prune(model, {0: [1]}, compensate="median")
    with pytest.raises(ValueError, match="mode"):
        prune(model, {0: [1]}, mode="kv")
    with pytest.raises(TypeError, match="heads"):
        prune(model, 3)
    prune(model, {0: [1]}, compensate="none")
    with pytest.raises(ValueError, match="already removed"):
        prune(model, {0: [1]}, compensate="none")
    with pytest.raises(ValueError, match="fraction"):
        prune_to(model, 1.5, order="random")


def test_plans():
    model = tiny(n_heads=6, n_kv=2)
    scores = random_scores(model, 0)
    plan = plan_fraction(model, 0.34, scores, mode="query", uniform=True)  # 1 of each group of 3
    assert all(len(v) == 2 for v in plan.values()) and len(plan) == 3
    for layer, hs in plan.items():
        assert len({h // 3 for h in hs}) == 2  # one from each group
    plan = plan_fraction(model, 0.5, scores, mode="group", uniform=True)
    assert all(sorted(v) in ([0, 1, 2], [3, 4, 5]) for v in plan.values())
    # global: never a layer's last head, even when its scores are the lowest
    low = {(l, h): (0.0 if l == 0 else 1.0 + h) for l in range(3) for h in range(6)}
    plan = plan_fraction(model, 0.5, low, mode="query")
    assert len(plan[0]) == 5 and sum(len(v) for v in plan.values()) == 9
    with pytest.raises(ValueError, match="rounds to 0"):
        plan_fraction(model, 0.1, scores, mode="query", uniform=True)


def test_prune_to_random_reports_the_plan():
    model = tiny()
    result = prune_to(model, 0.34, order="random", uniform=True, compensate="mean", calibration=windows(2, 16),
                      seed=3)
    assert result.heads_removed == 6 and result.order == "random(seed=3)"
    assert [layer.attn.n_heads for layer in model.layers] == [4, 4, 4]
    data = result.to_json()
    assert data["heads_before"] == 18 and data["heads_after"] == 12 and data["fraction"] == 0.34


def test_real_model_prune_equals_gates(smollm2):
    model = copy.deepcopy(smollm2)
    heads = {0: [1, 4], 12: [0, 1, 2], 29: [8]}
    ids = torch.arange(100, 116)[None]
    g = torch.ones(30, 9)
    for layer, hs in heads.items():
        g[layer, hs] = 0.0
    with torch.no_grad():
        want = model(ids, head_gates=g).logits
    result = prune(model, heads, mode="query", compensate="none")
    with torch.no_grad():
        got = model(ids).logits
    assert (got - want).abs().max().item() < 1e-4
    assert result.kv_bytes_per_token_after == result.kv_bytes_per_token_before - 2 * 64 * 4  # layer 12 lost a group


def test_group_mode_on_a_multi_query_model_is_refused():
    """Gemma 3's layers have one KV head: a whole group is the layer's attention, so group mode says so."""
    from headcount.models import Decoder, DecoderConfig

    model = Decoder(DecoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=8,
                                  d_ff=32, max_position=64))
    with pytest.raises(ValueError, match="ONE KV head"):
        prune_to(model, 0.3, mode="group", order="random", compensate="none")
    assert all(layer.attn.n_heads == 4 for layer in model.layers)


def test_prune_to_seconds_cover_the_ordering_as_forward_equivalents_do(monkeypatch):
    """seconds and forward_equivalents describe the same work: a prune_to that orders the heads itself counts
    the ordering's seconds as well as its passes (a fake clock: the importance call takes 100 s of it)."""
    import headcount.analysis as analysis
    from headcount.surgery.pruning import removal

    clock = {"now": 0.0}
    monkeypatch.setattr(removal.time, "perf_counter", lambda: clock["now"])
    real_importance = analysis.importance

    def slow_importance(*args, **kwargs):
        clock["now"] += 100.0
        return real_importance(*args, **kwargs)

    monkeypatch.setattr(analysis, "importance", slow_importance)
    result = prune_to(tiny(), 0.34, order="gradient", calibration=windows(2, 16))
    assert result.forward_equivalents > removal.REFIT_PASSES["output"]  # the ordering's passes are counted
    assert result.seconds == pytest.approx(100.0)  # and so are its seconds (the refit took none of the clock)
