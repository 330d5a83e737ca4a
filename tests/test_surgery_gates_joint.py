"""train_gates(joint=True) / `headcount prune --method l0 --joint`: gates trained WITH the model's weights (Voita's
setup). Against independent truths: the distillation KL computed here from the two models' logits, the gated
forward of the trained model, the untouched tensors bit for bit. Tiny random models only."""

import copy

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from headcount.cli import app
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery import apply_gates, prune_l0, train_gates
from headcount.surgery.pruning.gates_joint import teacher_copy, trained_parameters

runner = CliRunner()


@pytest.fixture(autouse=True)
def _one_thread(one_thread_for_tiny_models):
    yield


def sharp(n_layers=3, n_heads=6, n_kv=2):
    """A tiny random decoder whose matrices are doubled, so that its next-token distributions are far from
    uniform and removing heads costs a measurable KL."""
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8,
                        d_ff=48, max_position=64)
    model = Decoder(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.0)
    return model


def windows(n=4, t=32, seed=1):
    return torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed))


def kl(teacher, student, ids) -> float:
    """Mean over positions of KL(teacher || student) of the next-token distributions, written out."""
    with torch.no_grad():
        p = F.log_softmax(teacher(ids).logits, -1)
        q = F.log_softmax(student(ids).logits, -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_joint_training_beats_frozen_gates_at_the_same_head_count():
    base, cal = sharp(), windows()
    results = {}
    for joint in (False, True):
        model = copy.deepcopy(base)
        kw = {"joint": True, "weight_lr": 1e-2, "params": "attention"} if joint else {}
        gates = train_gates(model, heads_to_keep=8, steps=80, lr=0.3, calibration=cal, progress=False, **kw)
        assert gates.joint is joint and gates.to_json()["joint"] is joint
        apply_gates(model, gates, compensate="none", force=True, progress=False)
        assert sum(layer.attn.n_heads for layer in model.layers) == 8
        results[joint] = kl(base, model, cal)
    # the distillation loss the training minimised, measured here on the pruned models: joint far below frozen
    assert results[True] < 0.5 * results[False], results


def test_closed_heads_removed_structurally_equal_the_gated_trained_model():
    base, cal = sharp(), windows()
    model = copy.deepcopy(base)
    gates = train_gates(model, heads_to_keep=8, steps=40, lr=0.3, calibration=cal, progress=False, joint=True,
                        params="attention", weight_lr=1e-2)
    # the attention weights moved; everything outside attention and its norms is bit for bit the unedited model's
    moved = {id(p) for p in trained_parameters(model, "attention")}
    for (name, p), q in zip(model.named_parameters(), base.parameters()):
        assert torch.equal(p, q) == (id(p) not in moved) or "norm" in name, name
    assert all(p.requires_grad for p in model.parameters())  # the flags as they were before training
    # the gated forward of the trained model: kept heads at their deterministic gates, removed heads at 0
    hg = []
    for l, layer in enumerate(model.layers):
        g = torch.tensor(gates.gates[l], dtype=torch.float64)
        for j, h in enumerate(layer.attn.kept_heads):
            if h in gates.removed.get(l, []):
                g[j] = 0.0
        hg.append(g)
    ids = windows(2, 24, seed=5)
    with torch.no_grad():
        gated = model(ids, head_gates=hg).logits
    result = apply_gates(model, gates, force=True, progress=False)  # joint: compensate "none" by default
    assert result.compensate == "none" and result.heads_after == 8
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, gated, rtol=1e-10, atol=1e-10)


def test_teacher_shares_every_untrained_tensor_and_is_frozen():
    model = sharp()
    trained = trained_parameters(model, "attention")
    teacher = teacher_copy(model, trained)
    own = {id(p) for p in trained}
    pairs = list(zip(model.parameters(), teacher.parameters()))
    assert all((s is t) != (id(s) in own) for s, t in pairs)
    assert all(not t.requires_grad for s, t in pairs if id(s) in own)
    assert len(trained_parameters(model, "all")) == len(pairs)


def test_all_params_and_bad_arguments():
    model, cal = sharp(n_layers=2, n_heads=4), windows()
    before = copy.deepcopy(model)
    result = prune_l0(model, heads_to_keep=4, steps=30, lr=0.3, calibration=cal, progress=False, joint=True,
                      params="all", force=True)
    assert result.gates.params == "all" and result.gates.trained_params == sum(p.numel() for p in before.parameters())
    assert not torch.equal(model.embed.weight, before.embed.weight)  # "all" moves the embeddings too
    with pytest.raises(ValueError, match="params: only with joint=True"):
        train_gates(sharp(), heads_to_keep=8, steps=2, calibration=cal, params="all", progress=False)
    with pytest.raises(ValueError, match="params: expected one of"):
        train_gates(sharp(), heads_to_keep=8, steps=2, calibration=cal, joint=True, params="mlp", progress=False)
    with pytest.raises(ValueError, match="compensate"):
        prune_l0(sharp(), heads_to_keep=8, steps=2, calibration=cal, joint=True, compensate="lstsq", progress=False)


def test_hard_phase_fixes_the_kept_heads_and_only_the_weights_train_then():
    """The last `hard` share of the steps: the gates are exactly 0 / 1 (the heads kept), log_alpha stops, the
    weights still train; the removal is then exactly the model trained last (no stochastic-to-deterministic jump)."""
    base, cal = sharp(), windows(n=16)
    model = copy.deepcopy(base)
    gates = train_gates(model, heads_to_keep=8, steps=40, lr=0.3, calibration=cal, progress=False, joint=True,
                        weight_lr=1e-2, hard=0.25, history_every=1)
    assert gates.hard_steps == 10 and gates.to_json()["hard_steps"] == 10
    flat = [v for row in gates.gates for v in row]
    assert sorted(set(flat)) == [0.0, 1.0] and flat.count(1.0) == 8  # the fixed gates: the kept heads, exactly
    assert gates.history[29]["gates"] == gates.history[-1]["gates"]  # log_alpha frozen over the hard steps
    assert gates.expected_l0[29] == gates.expected_l0[-1]
    # distinct windows: 16 windows of 32 tokens, each once (the frozen variant cycles n_windows = 8 of them)
    assert gates.calibration_tokens == 16 * 32
    with pytest.raises(ValueError, match="hard: only with joint=True"):
        train_gates(sharp(), heads_to_keep=8, steps=2, calibration=cal, hard=0.5, progress=False)
    with pytest.raises(ValueError, match=r"hard: expected a share of the steps in \[0, 1\)"):
        train_gates(sharp(), heads_to_keep=8, steps=2, calibration=cal, joint=True, hard=1.0, progress=False)


@pytest.mark.parametrize("args,match", [
    (["--fraction", "0.5", "--joint"], "--joint"),
    (["--fraction", "0.5", "--method", "retraining-free", "--joint"], "--joint"),
    (["--fraction", "0.5", "--method", "l0", "--joint-params", "all"], "--joint-params"),
    (["--fraction", "0.5", "--method", "l0", "--joint", "--joint-params", "mlp"], "--joint-params"),
    (["--fraction", "0.5", "--method", "l0", "--joint", "--compensate", "lstsq"], "--compensate"),
])
def test_bad_joint_options_write_nothing(tmp_path, args, match):
    out = tmp_path / "o"
    result = runner.invoke(app, ["prune", "--model", "no-such-model", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and match in lines[0], result.output
    assert not out.exists()


def test_prune_joint_json(tmp_path, minilm):
    """`headcount prune --method l0 --joint` end to end on a tiny saved decoder carrying minilm's tokenizer: the
    JSON says joint and which weights trained, the heads are gone, the model is saved."""
    import json
    import random

    from headcount.surgery import save

    model = Decoder(DecoderConfig(vocab_size=minilm.tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=4,
                                  n_kv_heads=2, head_dim=8, d_ff=48, max_position=512)).eval()
    model.tokenizer = minilm.tokenizer
    save(model, tmp_path / "m")
    rng = random.Random(0)
    words = "attention head query key value layer model weight gate prune keep remove train loss token".split()
    (tmp_path / "t.txt").write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(100)) for _ in range(60)))
    result = runner.invoke(app, ["prune", "--model", str(tmp_path / "m"), "--fraction", "0.5", "--method", "l0",
                                 "--joint", "--steps", "3", "--force", "--out", str(tmp_path / "o"), "--json",
                                 "--calibration-windows", "1", "--eval-windows", "1", "--text", str(tmp_path / "t.txt")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    g = data["prune"]["gates"]
    assert data["method"] == "l0" and g["joint"] is True and g["params"] == "attention" and g["trained_params"] > 0
    assert data["prune"]["compensate"] == "none" and data["heads_after"] == 4
    assert (tmp_path / "o" / "headcount.json").exists()


def test_report_c12_reads_the_joint_points_for_these_weights_only(tmp_path):
    import json

    from headcount.report.claims import c12_gates
    from headcount.report.trained import saved_gates

    def point(method, ppl, **extra):
        return {"fraction": 0.5, "method": method, "heads_kept": 4, "steps": 7, "ppl_by_text": {"prose": ppl}, **extra}
    section = {"model": "tiny", "heads": 8, "steps": 300, "weights_sha256": "abc", "base": {"ppl_by_text": {"prose": 10.0}},
               "points": [point("l0 + lstsq", 15.0), point("l0 joint", 11.5, params="attention")]}
    (tmp_path / "surgery_gates.json").write_text(json.dumps({"gates": {"tiny": section}}))
    saved = saved_gates(tmp_path, "tiny", weights=lambda: "abc")
    assert saved["joint"] and [p["ppl"] for p in saved["points"]] == [11.5]
    c12 = c12_gates(saved, "tiny")
    assert c12["status"] == "held" and abs(c12["number"] - 0.15) < 1e-9 and "trained with the model" in c12["finding"]
    assert saved_gates(tmp_path, "tiny", weights="other") is None  # measured on other weights: not this model's
    section["points"] = section["points"][:1]  # no joint points: the frozen gates' lstsq points, as before
    (tmp_path / "surgery_gates.json").write_text(json.dumps({"gates": {"tiny": section}}))
    saved = saved_gates(tmp_path, "tiny", weights="abc")
    assert not saved["joint"] and c12_gates(saved, "tiny")["status"] == "did not hold"


@pytest.mark.parametrize("args,match", [
    (["--part", "gates", "--methods", "l0 jointly"], "--methods"),
    (["--part", "gates", "--models", "gpt2"], "--models"),
    (["--part", "prune", "--methods", "l0 joint"], "--methods"),
])
def test_bench_gates_bad_methods_and_models(args, match):
    result = runner.invoke(app, ["bench", "surgery", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and match in lines[0], result.output
