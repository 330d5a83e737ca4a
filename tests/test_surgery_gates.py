"""headcount.surgery.train_gates / prune_l0 / `headcount prune --method l0`: the hard-concrete sampler against
its closed forms, the exact head count, frozen weights, group gates, gate 0 == structural removal, the JSON
keys, and every bad input of the command (exit 2, one line, nothing written). Tiny random models only."""

import copy
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from headcount.cli import app
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery import apply_gates, prune_l0, prune_to, save, train_gates
from headcount.surgery.pruning.gates import deterministic_gates, expected_l0, sample_gates

runner = CliRunner()
PRUNE_KEYS = {"heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
              "kv_bytes_per_token_after", "ppl_before", "ppl_after", "method"}
GATE_KEYS = {"mode", "n_gates", "heads_to_keep", "fraction", "steps", "lr", "gates", "log_alpha", "layout", "kept",
             "removed", "n_closed", "n_removed_closed", "n_removed_ranked", "n_kept_closed", "n_forced", "expected_l0",
             "target_l0", "final_expected_l0", "reached", "loss", "final_loss", "history", "lambdas",
             "calibration_tokens", "forward_equivalents", "seconds", "objective"}


@pytest.fixture(autouse=True)
def _one_thread(one_thread_for_tiny_models):
    yield


def tiny(n_layers=3, n_heads=6, n_kv=2, vocab=64, max_position=64, dtype=torch.float64):
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=vocab, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8,
                        d_ff=48, max_position=max_position)
    return Decoder(cfg).to(dtype).eval()


def windows(n=4, t=32, seed=1):
    return torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ sampler
def test_sampler_statistics_match_the_closed_forms():
    """P(z != 0) = sigmoid(log_alpha - beta log(0.1 / 1.1)) (the expected L0 per gate, Louizos et al. eq. 12)
    and P(z == 1) = sigmoid(log_alpha - beta log(1.1 / 0.1)... written out here from u's distribution)."""
    beta = 2 / 3
    log_alpha = torch.tensor([-4.0, -1.5, 0.0, 0.7, 3.0], dtype=torch.float64)
    n = 200_000
    z = sample_gates(log_alpha.expand(n, -1), generator=torch.Generator().manual_seed(0))
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    for j, la in enumerate(log_alpha.tolist()):
        p_open = sig(la - beta * math.log(0.1 / 1.1))
        # z = 1 iff the stretched sigmoid >= 1 iff sigmoid((logit u + la) / beta) >= 1.1 / 1.2 iff
        # logit u >= beta * logit(11 / 12) - la, and logit u is standard logistic
        p_one = 1 - sig(beta * math.log(11) - la)
        tol = 5 * math.sqrt(p_open * (1 - p_open) / n) + 1e-4
        assert abs(float((z[:, j] > 0).double().mean()) - p_open) < tol
        assert abs(float((z[:, j] == 1).double().mean()) - p_one) < 5 * math.sqrt(p_one * (1 - p_one) / n) + 1e-4
    assert z.min() == 0 and z.max() == 1
    # the summed closed form is expected_l0; the sample mean of the count of open gates matches it
    assert abs(float((z > 0).sum(1).double().mean()) - float(expected_l0(log_alpha))) < 0.01
    assert deterministic_gates(torch.tensor([-10.0, 10.0])).tolist() == [0.0, 1.0]


# -------------------------------------------------------------------------------------------- train
def test_exact_head_count_frozen_weights_and_json():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.layers[0].attn.o_proj.weight.requires_grad_(True)  # whatever the flags were, they come back
    flags = [p.requires_grad for p in model.parameters()]
    model.train()
    result = train_gates(model, heads_to_keep=7, steps=20, lr=0.2, calibration=windows(), progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # bit for bit
    assert [p.requires_grad for p in model.parameters()] == flags and model.training
    assert sum(map(len, result.kept.values())) == 7 and sum(map(len, result.removed.values())) == 18 - 7
    assert all(result.kept.get(l) for l in range(3))  # at least one head per layer
    assert result.n_removed_closed + result.n_removed_ranked == 11
    assert len(result.expected_l0) == len(result.loss) == 20 and result.history[-1]["step"] == 20
    assert [len(row) for row in result.gates] == [6, 6, 6]
    # forward equivalents: 20 steps x 4 passes x 2 windows of 32 tokens over 4 windows of 32 calibration tokens
    assert result.calibration_tokens == 128 and result.forward_equivalents == pytest.approx(40.0)
    data = json.loads(json.dumps(result.to_json()))
    assert GATE_KEYS <= set(data)
    pruned = apply_gates(model, result, compensate="none", force=True, progress=False)
    assert pruned.heads_after == 7 and pruned.method == "l0"
    out = pruned.to_json()
    assert out["method"] == "l0" and out["gates"]["heads_to_keep"] == 7


def test_fraction_is_the_share_removed_and_the_target_is_reached():
    model = tiny()
    result = prune_l0(model, fraction=0.5, steps=40, lr=0.2, calibration=windows(), compensate="lstsq",
                      progress=False, calibration_windows=2)
    assert result.heads_before == 18 and result.heads_after == 9
    assert result.gates.reached and abs(result.gates.final_expected_l0 - 9) <= 1.8
    assert result.to_json()["method"] == "l0"


def test_group_mode_shares_one_gate_per_kv_head():
    model = tiny()
    result = train_gates(model, fraction=0.5, steps=15, lr=0.2, calibration=windows(), mode="group", progress=False)
    assert result.n_gates == 6 and result.heads_to_keep == 3
    for rows in [result.gates] + [h["gates"] for h in result.history]:
        for row in rows:
            assert row[:3] == [row[0]] * 3 and row[3:] == [row[3]] * 3  # heads 0-2 read KV head 0, 3-5 KV head 1
    for hs in list(result.kept.values()) + list(result.removed.values()):
        assert hs in ([0, 1, 2], [3, 4, 5], [0, 1, 2, 3, 4, 5])
    pruned = apply_gates(copy.deepcopy(model), result, compensate="none", force=True, progress=False)
    assert pruned.kv_heads_after == 3 and pruned.heads_after == 9


def test_a_zero_gate_equals_structural_removal():
    """The pruned model (compensate none) == the model run with its deterministic gates, removed heads at 0."""
    model = tiny()
    result = train_gates(model, fraction=0.4, steps=15, lr=0.2, calibration=windows(), progress=False)
    gates = torch.tensor(result.gates, dtype=torch.float64)
    for layer, heads in result.removed.items():
        gates[layer, heads] = 0.0
    ids = windows(2, 24, seed=5)
    with torch.no_grad():
        want = model(ids, head_gates=gates).logits
    pruned = copy.deepcopy(model)
    apply_gates(pruned, result, compensate="none", force=True, progress=False)
    with torch.no_grad():
        got = pruned(ids).logits
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert sum(l.attn.n_heads for l in pruned.layers) == result.heads_to_keep


@pytest.mark.parametrize("kwargs,match", [
    ({"heads_to_keep": 0}, "heads_to_keep: a gate target of 0"),
    ({"heads_to_keep": 18}, "every head"),
    ({"fraction": 0.01}, "fraction: a gate target of every head"),
    ({"fraction": 1.0}, "fraction"),
    ({"heads_to_keep": 2}, "at least one per layer"),
    ({"heads_to_keep": 5, "fraction": 0.5}, "exactly one"),
    ({"heads_to_keep": 5, "steps": 0}, "steps"),
    ({"heads_to_keep": 5, "mode": "kv"}, "mode"),
])
def test_bad_targets(kwargs, match):
    model = tiny()
    kwargs = {"steps": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        train_gates(model, calibration=windows(), progress=False, **kwargs)


def test_unreached_target_is_refused_without_force():
    model = tiny()
    result = train_gates(model, fraction=0.5, steps=1, calibration=windows(), progress=False)
    assert not result.reached
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="steps: the L0 target is unreachable"):
        apply_gates(model, result, compensate="none")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# ---------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory, minilm):
    """A tiny decoder carrying minilm's tokenizer (so the command can tokenize the default corpus), saved."""
    model = tiny(n_layers=2, n_heads=4, n_kv=2, vocab=minilm.tokenizer.vocab_size, max_position=512,
                 dtype=torch.float32)
    model.tokenizer = minilm.tokenizer
    path = tmp_path_factory.mktemp("tiny") / "m"
    save(model, path)
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """A small --text (60 paragraphs, ~6k tokens): calibration and held-out without tokenizing the default
    corpus or measuring its three held-out domains (the commands' defaults), which a tiny model does not need."""
    import random

    rng = random.Random(0)
    words = ("attention head query key value layer model weight gate prune keep remove train loss token window "
             "sentence average output input matrix vector rank sparse dense").split()
    paragraphs = [" ".join(rng.choice(words) for _ in range(80)).capitalize() + "." for _ in range(60)]
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_text("\n\n".join(paragraphs))
    return path


def bad(args, match):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and match in lines[0], result.output


L0_FAST = ["--calibration-windows", "1", "--eval-windows", "1"]


@pytest.fixture
def fast(text_file):
    return L0_FAST + ["--text", str(text_file)]


def test_prune_l0_json_contract(tmp_path, saved_tiny, fast):
    out = tmp_path / "out"
    result = runner.invoke(app, ["prune", "--model", str(saved_tiny), "--fraction", "0.5", "--method", "l0",
                                 "--steps", "15", "--lr", "0.6", "--out", str(out), "--json", *fast])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert PRUNE_KEYS <= set(data) and data["method"] == "l0" and data["prune"]["method"] == "l0"
    assert data["heads_before"] == 8 and data["heads_after"] == 4
    assert GATE_KEYS <= set(data["prune"]["gates"])
    assert (out / "headcount.json").exists()
    plain = prune_to(tiny(), 0.5, order="random", compensate="none", progress=False)  # what --method's default runs
    assert plain.method == "retraining-free" and plain.to_json()["method"] == "retraining-free"


@pytest.mark.parametrize("args,match", [
    (["--fraction", "0.5", "--method", "l0", "--steps", "0"], "--steps"),
    (["--fraction", "1.5", "--method", "l0"], "--fraction"),
    (["--fraction", "0", "--method", "l0"], "--fraction"),
    (["--fraction", "0.01", "--method", "l0", "--steps", "2"], "--fraction: a gate target of every head"),
    (["--fraction", "0.9", "--method", "l0", "--steps", "2"], "--fraction"),
    (["--fraction", "0.5", "--method", "l0", "--steps", "1"], "--steps: the L0 target is unreachable"),
    (["--fraction", "0.5", "--steps", "5"], "--steps: only with --method l0"),
    (["--fraction", "0.5", "--method", "lottery"], "--method"),
    (["--fraction", "0.5", "--method", "l0", "--lr", "0"], "--lr"),
])
def test_bad_l0_options_write_nothing(tmp_path, saved_tiny, fast, args, match):
    bad(["prune", "--model", str(saved_tiny), *args, "--out", str(tmp_path / "o"), *fast], match)
    assert not (tmp_path / "o").exists()


def test_force_prunes_by_rank_when_the_target_was_missed(tmp_path, saved_tiny, fast):
    out = tmp_path / "o"
    result = runner.invoke(app, ["prune", "--model", str(saved_tiny), "--fraction", "0.5", "--method", "l0",
                                 "--steps", "1", "--force", "--out", str(out), "--json", *fast])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["heads_after"] == 4 and not data["prune"]["gates"]["reached"]


# -------------------------------------------------------------------------------------------- bench
def test_agreement_counts_shared_kept_heads():
    from headcount.surgery.pruning.gates_bench import agreement

    a = agreement({0: [0, 1], 1: [2]}, {"0": [1], "1": [2, 3]})
    assert a["shared_kept"] == 2 and a["jaccard"] == 0.5 and a["only_l0"] == [(0, 0)]
    assert a["only_retraining_free"] == [(1, 3)] and a["per_layer_kept"] == {"l0": [2, 1], "retraining-free": [1, 2]}


def test_bench_gates_from_prints_one_table_and_plots(tmp_path):
    from headcount.surgery.pruning.gates_bench import agreement

    def pts(base, f):
        return [{"fraction": f, "method": m, "heads_kept": 4, "seconds": 1.0,
                 "ppl_by_text": {"prose": base * k, "code": 2 * base * k}} for m, k in
                (("retraining-free", 1.5), ("l0 + lstsq", 1.2), ("l0 (no refit)", 1.3))]
    gates = {"final_expected_l0": 4.2, "heads_to_keep": 4, "n_removed_closed": 3, "n_removed_ranked": 1}
    section = {"quick": True, "settings": {"smollm2_steps": 3, "minilm_steps": 3, "lr": 0.5},
               "smollm2": {"model": "smollm2", "heads": 8, "steps": 3, "base": {"ppl_by_text": {"prose": 10.0,
                                                                                               "code": 20.0}},
                           "points": pts(10.0, 0.5),
                           "agreement": [{"fraction": 0.5, **agreement({0: [0, 1], 1: [0, 1]}, {0: [0, 2], 1: [0, 1]}),
                                          "gates": gates}]},
               "minilm": {"error": "RuntimeError: not run"}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"gates": section}))
    png = tmp_path / "gates.png"
    result = runner.invoke(app, ["bench", "surgery", "--from", str(path), "--png", str(png)], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "12.000 (+20%)" in result.output and "15.000 (+50%)" in result.output  # l0 + lstsq, retraining-free
    assert "3 / 4" in result.output and "minilm: not measured" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad(["bench", "surgery", "--part", "prune", "--png", str(tmp_path / "x.png")], "--png")
