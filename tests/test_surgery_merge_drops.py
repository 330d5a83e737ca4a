"""merge_plan(drops=True): a KV budget met by K/V merges and whole attention sublayers dropped together. The drop's
cost against a full forward of the model with that layer's attention dropped, the knapsack against every choice
enumerated, the applied plan's KV cache against the plan's bytes, `merge-kv --budget --allow-drop` and the
frontier's kv:B point."""

import copy
import itertools
import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import tiny_byte_decoder
from headcount.cli import app
from headcount.frontier.run import run_frontier
from headcount.frontier.spec import parse_point, parse_points
from headcount.surgery.merging import planner
from headcount.surgery.merging.planner import MergePlan, apply_plan, check_budget, merge_plan, sensitivity
from test_surgery_merge_budget import FAST as CLI_FAST, _ids, _saved, _tiny  # the same tiny models and flags

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {"local_steps": 0, "uptrain_steps": 0}


def _kv_bytes(model) -> int:
    return sum(cache.nbytes for cache in model.new_cache(1, 1))


def test_a_drops_cost_is_the_whole_models_kl_and_loss_with_that_layers_attention_dropped():
    model, ids = _tiny(), _ids()
    options = {"calibration": ids, "method": "mean", "n_windows": 2, "n_eval_windows": 2, "progress": False,
               "drops": True}
    _, kl = sensitivity(model, by="kl", **options)
    base, loss = sensitivity(model, by="loss", **options)
    assert all(set(costs) == {0, 1} for costs in (*kl.values(), *loss.values()))
    held = ids[2:]
    with torch.no_grad():
        p = F.log_softmax(model(held).logits.double(), -1)
        nll = F.cross_entropy(model(held).logits[:, :-1].reshape(-1, 61).double(), held[:, 1:].reshape(-1))
    assert base == pytest.approx(float(nll), rel=1e-6)
    for layer in range(3):
        dropped = copy.deepcopy(model)
        dropped.layers[layer].drop_attention()
        with torch.no_grad():
            logits = dropped(held).logits.double()
        q = F.log_softmax(logits, -1)
        assert kl[layer][0] == pytest.approx(float((p.exp() * (p - q)).sum(-1).mean()), rel=1e-6)
        after = F.cross_entropy(logits[:, :-1].reshape(-1, 61), held[:, 1:].reshape(-1))
        assert loss[layer][0] == pytest.approx(float(after - nll), rel=1e-6, abs=1e-12)
    without = sensitivity(model, by="kl", **{**options, "drops": False})[1]
    assert without == {i: {1: costs[1]} for i, costs in kl.items()}  # the merges' costs do not move


def _brute(model, table, limit, drops):
    best = None
    choices = [[2, 1, 0] if drops else [2, 1] for _ in model.layers]
    for picks in itertools.product(*choices):
        total = sum(planner._layer_bytes(layer.attn, n) for layer, n in zip(model.layers, picks))
        if total > limit or total == 0:
            continue
        cost = sum(table[i][n] if n != 2 else 0.0 for i, n in enumerate(picks))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, total)
    return best


costs = st.floats(0, 5, allow_nan=False, allow_infinity=False)


MODEL = _tiny()  # 3 layers x 2 K/V heads x 8 dims x (K, V) x 8 bytes: 256 bytes per layer, 128 with one head


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(costs, costs), min_size=3, max_size=3), st.integers(1, 768), st.booleans())
def test_the_plan_is_the_cheapest_choice_of_merges_and_drops_within_the_budget(pairs, limit, drops):
    model = MODEL
    table = {i: {1: merge, 0: drop} for i, (merge, drop) in enumerate(pairs)}
    truth = _brute(model, table, limit, drops)
    if truth is None:
        with pytest.raises(ValueError, match="no plan reaches"):
            planner._solve(model, table, limit, drops)
        return
    picks, cost, total = planner._solve(model, table, limit, drops)
    assert cost == pytest.approx(truth[0], abs=1e-9) and total <= limit
    assert drops or 0 not in picks.values()
    assert total == sum(planner._layer_bytes(layer.attn, picks.get(i, 2)) for i, layer in enumerate(model.layers))


def test_a_budget_below_every_layer_mqa_is_reachable_only_by_dropping():
    model = _tiny()
    assert check_budget(model, 128, drops=True) == 128  # one K/V head in one layer, the others dropped
    with pytest.raises(ValueError, match="below what every-layer MQA reaches"):
        check_budget(model, 128)
    with pytest.raises(ValueError, match="^budget: 127 KV bytes per token is below what one K/V head in one layer"):
        check_budget(model, 127, drops=True)


def test_an_applied_plan_drops_then_merges_and_holds_the_kv_it_planned():
    model, ids = _tiny(), _ids()
    plan = merge_plan(model, 0.3, calibration=ids, method="mean", by="kl", n_windows=2, n_eval_windows=2,
                      progress=False, drops=True)
    assert plan.drops and plan.kv_bytes_per_token_after <= 0.3 * 768 and plan.dropped  # MQA alone holds 384
    assert plan.kv_heads == {**{i: 0 for i in plan.dropped}, **plan.merged}
    edited = copy.deepcopy(model)
    dropped, merged = apply_plan(edited, plan, method="mean", calibration=ids, n_windows=2, progress=False, **FAST)
    assert dropped.dropped == plan.dropped and _kv_bytes(edited) == plan.kv_bytes_per_token_after
    for i, layer in enumerate(edited.layers):
        assert layer.attn.n_kv_heads == plan.kv_heads.get(i, 2)
    assert merged.kv_heads_after == [layer.attn.n_kv_heads for layer in edited.layers]
    from headcount.surgery import merge_kv

    with pytest.raises(ValueError, match="^n_kv_heads: this plan drops the attention of layers .*apply_plan"):
        merge_kv(copy.deepcopy(model), plan, method="mean", calibration=ids, progress=False)
    again = MergePlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    with pytest.raises(ValueError, match="^sensitivity_from: that table was measured without drops"):
        merge_plan(model, 0.3, drops=True, sensitivity_from=merge_plan(model, 1.0, calibration=ids, method="mean",
                                                                       n_windows=2, n_eval_windows=2, progress=False))


def test_a_table_with_drops_is_cached_apart_from_one_without(tmp_path, monkeypatch):
    model, ids = _tiny(), _ids()
    calls, real = [], planner.sensitivity
    monkeypatch.setattr(planner, "sensitivity", lambda *a, **k: calls.append(k["drops"]) or real(*a, **k))
    options = {"calibration": ids, "method": "mean", "n_windows": 2, "n_eval_windows": 2, "progress": False,
               "cache": tmp_path}
    plain = merge_plan(model, 0.75, **options)
    with_drops = merge_plan(model, 0.75, drops=True, **options)
    assert calls == [False, True]
    assert merge_plan(model, 0.5, **options).sensitivity == plain.sensitivity
    assert merge_plan(model, 0.5, drops=True, **options).sensitivity == with_drops.sensitivity and len(calls) == 2
    assert all(0 not in c for c in plain.sensitivity.values()) and all(0 in c for c in with_drops.sensitivity.values())


# ------------------------------------------------------------------------------------------ the commands
def test_merge_kv_budget_allow_drop_reaches_below_mqa_by_dropping_and_saves_it(tmp_path):
    from headcount.models.formats.native import read

    model = _saved(tmp_path)
    # 2 layers x 2 K/V heads x (K, V) x 8 dims x fp32 = 256 bytes; a quarter is one head in one layer
    result = CliRunner().invoke(app, ["merge-kv", *model, "--budget", "0.25", "--allow-drop", *CLI_FAST, "--out",
                                      str(tmp_path / "m"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kv_bytes_per_token_before"] == 256 and data["kv_bytes_per_token_after"] == 64
    assert sorted(data["plan"].values()) == [0, 1] and data["dropped"] == [int(k) for k, v in data["plan"].items()
                                                                            if v == 0]
    saved = read(tmp_path / "m")
    assert _kv_bytes(saved) == 64
    assert [layer.attn.n_kv_heads for layer in saved.layers] == [data["plan"][str(i)] for i in range(2)]


@pytest.mark.parametrize("args,match", [
    (["--kv-heads", "1", "--allow-drop"], "^headcount merge-kv: --allow-drop: .*give --budget"),
    (["--budget", "0.25"], "^headcount merge-kv: --budget: .*below what every-layer MQA reaches"),
    (["--budget", "0.2", "--allow-drop"], "^headcount merge-kv: --budget: .*below what one K/V head in one layer"),
])
def test_merge_kv_allow_drop_bad_input_exits_2_writing_nothing(tmp_path, args, match):
    import re

    result = CliRunner().invoke(app, ["merge-kv", *_saved(tmp_path), *args, *CLI_FAST, "--out", str(tmp_path / "m")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), result.output
    assert not (tmp_path / "m").exists()


def test_the_frontiers_kv_point_meets_its_budget_with_merges_and_drops():
    assert parse_point("kv:0.75").steps[0].edit == "kv" and parse_point("kv:12KiB").steps[0].amount == 12 * 1024
    with pytest.raises(ValueError, match="^--point: expected kv:B"):
        parse_point("kv:1.0")
    calibration = torch.randint(1, 260, (6, 64), generator=torch.Generator().manual_seed(3))
    held = ["The quick brown fox jumps over the lazy dog. " * 40]
    frontier = run_frontier("tiny", parse_points(["kv:0.25"]), model=tiny_byte_decoder(), eval_windows=1,
                            calibration_windows=2, merge_options=FAST, held_out=held, calibration=calibration,
                            progress=False)
    base, point = frontier.rows
    assert point.kv_bytes_per_token == base.kv_bytes_per_token // 4
    edit = point.edit["kv:0.25"]
    assert len(edit["dropped"]) == 1 and sorted(edit["plan"].values()) == [0, 1]
    with pytest.raises(ValueError, match="^--point kv:1B: .*below what one K/V head in one layer"):
        run_frontier("tiny", parse_points(["kv:1B"]), model=tiny_byte_decoder(), progress=False)


def test_a_merge_after_a_drop_uptrains_the_attention_that_is_left():
    from headcount.surgery import merge_kv, uptrain

    model, ids = _tiny(), _ids()
    model.layers[1].drop_attention()
    result = merge_kv(model, 1, method="mean", calibration=ids, n_windows=2, uptrain_steps=2, progress=False)
    assert [layer.attn.n_kv_heads for layer in model.layers] == [1, 0, 1]
    left = [p for i in (0, 2) for p in model.layers[i].attn.parameters()]
    assert result.uptrain["trainable_params"] == sum(p.numel() for p in left)
    with pytest.raises(ValueError, match="^trainable: the layers asked for \\(1\\) have no attention weights"):
        uptrain(model, 2, calibration=ids, trainable=[1], progress=False)
