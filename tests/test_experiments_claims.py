"""The --quick runs of the four experiments, each checked for the direction its claim predicts on a
fixed seed (so a broken model, trainer or fit fails here). The full runs are benchmarks."""

import math

import pytest
import torch

from headcount.experiments import EXPERIMENTS, run_experiment


@pytest.fixture(scope="module")
def quick():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = run_experiment(name, quick=True, seed=0, progress=False)
        return cache[name]
    return get


def test_registry_names():
    assert list(EXPERIMENTS) == ["multi-relation", "heads-sweep", "low-rank", "write-address"]
    with pytest.raises(ValueError, match="known: multi-relation, heads-sweep, low-rank, write-address"):
        run_experiment("nope")
    with pytest.raises(ValueError, match="steps"):
        run_experiment("low-rank", quick=True, steps=0)
    with pytest.raises(ValueError, match="unknown option"):
        run_experiment("low-rank", quick=True, widht=3)


def test_multi_relation_one_head_below_several(quick):
    result = quick("multi-relation")
    rows = {r["n_heads"]: r for r in result.to_json()["results"]}
    assert set(rows) == {1, 2}
    assert rows[2]["accuracy"] >= 0.95
    assert rows[1]["accuracy"] < rows[2]["accuracy"] - 0.3
    # same parameters for every head count, by headcount.cost and by counting
    assert {r["attention_params"] for r in rows.values()} == {r["attention_params_measured"] for r in rows.values()}
    assert len({r["attention_params"] for r in rows.values()}) == 1
    # the one head splits its attention between the two marked positions and returns near their average
    one = result.details["one_head"]
    assert min(one["mass_on_marked"]) > 0.15 and sum(one["mass_on_marked"]) > 0.6
    assert one["distance_to_average"] < one["distance_to_nearest_value"]
    # with two heads, each head takes one position
    heads = result.details["per_model"]["2"]["heads"]
    assert sorted(max(range(2), key=lambda i: h["mass_on_marked"][i]) for h in heads) == [0, 1]


def test_head_contexts_reproduce_the_module():
    from headcount.experiments.multi_relation import head_contexts
    from headcount.attention import MultiHeadAttention
    attn = MultiHeadAttention(24, 6, n_kv_heads=2)
    q, ctx_in = torch.randn(3, 2, 24), torch.randn(3, 7, 24)
    ctx, weights, _ = head_contexts(attn, q, ctx_in)
    expected = attn(q, ctx_in).output
    got = attn.o_proj(ctx.transpose(1, 2).reshape(3, 2, 24))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 6, 2))


def test_low_rank_error_vanishes_once_head_dim_reaches_n(quick):
    result = quick("low-rank")
    rows = result.to_json()["results"]
    one = {r["head_dim"]: r for r in rows if r["setting"] == "one head"}
    n = result.config["n"]
    assert all(r["n"] == n for r in rows)
    for hd, r in one.items():
        if hd >= n:
            assert r["error"] < 1e-3, (hd, r)
        elif hd <= n // 4:
            assert r["error"] > 0.1, (hd, r)
    errors = [one[hd]["error"] for hd in sorted(one)]
    assert all(a >= b - 1e-3 for a, b in zip(errors, errors[1:]))  # wider heads never fit worse
    narrow, decoupled = [r for r in rows if r["setting"] != "one head"]
    assert narrow["head_dim"] < n <= decoupled["head_dim"] and narrow["n_heads"] == decoupled["n_heads"]
    assert decoupled["error"] < 1e-3 < 0.01 < narrow["error"]


def test_svd_reference_is_exact_from_rank_n_minus_1():
    from headcount.experiments.low_rank import svd_fit, targets, tv_error
    p = targets(6, 2, 2.0, seed=3)
    assert float(tv_error(svd_fit(p, 5), p).max()) < 1e-5  # row-centred logits have rank n - 1
    assert float(tv_error(svd_fit(p, 2), p).min()) > 0.02


def test_heads_sweep_trains(quick):
    result = quick("heads-sweep")
    rows = result.to_json()["results"]
    assert [r["n_heads"] for r in rows] == [1, 4, 32]
    d = result.details
    assert 150 < d["untrained_ppl"] < 400  # GPT-2 init: near uniform over 256 bytes
    for r in rows:
        assert {"n_heads", "head_dim", "ppl_mean", "ppl_std"} <= set(r)
        assert r["head_dim"] * r["n_heads"] == result.config["d_model"]
        assert math.isfinite(r["ppl_mean"]) and r["ppl_std"] >= 0
        assert r["ppl_mean"] < d["unigram_ppl"] < d["untrained_ppl"]
    assert len({r["params"] for r in rows}) == 1  # the same parameters at every head count


def test_principal_angles_hand_built():
    from scipy.linalg import subspace_angles
    from headcount.experiments.write_address import principal_angles
    theta = 0.3
    e = torch.eye(4, dtype=torch.float64)
    a = torch.stack([e[0], e[1]], dim=1)
    b = torch.stack([e[0], math.cos(theta) * e[1] + math.sin(theta) * e[2]], dim=1) * 3.0  # scale is irrelevant
    torch.testing.assert_close(principal_angles(a, b), torch.tensor([0.0, theta], dtype=torch.float64))
    c = torch.stack([e[2], e[3]], dim=1)
    torch.testing.assert_close(principal_angles(a, c), torch.full((2,), math.pi / 2, dtype=torch.float64))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 3, generator=gen, dtype=torch.float64), torch.randn(10, 4, generator=gen,
                                                                               dtype=torch.float64)
    expected = sorted(subspace_angles(x.numpy(), y.numpy()))
    torch.testing.assert_close(principal_angles(x, y), torch.tensor(expected, dtype=torch.float64))


def test_layer_geometry_of_disjoint_slices():
    from headcount.experiments.write_address import layer_geometry
    g = layer_geometry(torch.eye(12), n_heads=3)  # no o_proj: head h writes exactly slice h
    assert g["own_slice_energy"] == pytest.approx(1.0)
    assert g["mean_overlap"] == pytest.approx(0.0, abs=1e-12)
    assert g["mean_pairwise_angle_deg"] == pytest.approx(90.0)
    assert g["reach"] == pytest.approx(4 / 12)
    assert g["head_rank"] == 4 and g["union_rank"] == 12


def test_write_address(quick):
    result = quick("write-address")
    g = result.details["real_models"]["minilm"]
    assert (g["n_heads"], g["head_dim"], g["d_model"]) == (12, 32, 384)
    # real heads are not confined to their own slice of the residual stream
    assert g["own_slice_energy"] < 0.3 and g["reach"] > 3 * g["slice_share"]
    assert 0 < g["mean_overlap"] < 1 and g["mean_pairwise_angle_deg"] < 85
    rows = {r["variant"]: r for r in result.to_json()["results"]}
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and r["loss"] < math.log(256) for r in rows.values())
    with_o, without = rows["o_proj (trained)"], rows["no o_proj (identity, frozen)"]
    cfg = result.config
    assert with_o["trainable_params"] - without["trainable_params"] == cfg["n_layers"] * cfg["d_model"] ** 2
    trained = result.details["trained_small_model_geometry"]
    assert trained["no o_proj (identity, frozen)"]["own_slice_energy"] == pytest.approx(1.0)
