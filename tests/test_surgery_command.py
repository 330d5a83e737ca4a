"""The edit commands' skeleton (surgery/command.py): every registered edit command, run on a tiny model, prints the
one JSON schema (EditReport.to_json: the same top-level keys, its older keys beside them), whose accounts are the
saved model's own; errors that carry their argument reach the user under the command's flag; the training
settings are frozen objects whose keyword form builds the same object (and runs the same training)."""

import dataclasses
import json

import pytest
import torch
from conftest import tiny_byte_decoder
from typer.testing import CliRunner

from headcount.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """conftest's tiny byte-level decoder (512 positions: the windows' length), saved, and a --text of 160 short
    paragraphs (about 14k bytes, so heal's ten windows of 512 byte tokens fit in its calibration part)."""
    import random

    from headcount.surgery import save

    root = tmp_path_factory.mktemp("command")
    save(tiny_byte_decoder(max_position=512), root / "tiny")
    rng = random.Random(0)
    words = "attention head query key value layer model weight prune keep merge heal token window cache".split()
    text = "\n\n".join(" ".join(rng.choice(words) for _ in range(14)) + "." for _ in range(160))
    (root / "text.txt").write_text(text, encoding="utf-8")
    return root


def test_every_edit_command_prints_the_one_schema(saved, monkeypatch, one_thread_for_tiny_models):
    """Each command of the registry (drop-attention, frontier's edits and any edit to come join it by
    register_edit) runs its smallest example; the top-level keys are SCHEMA_KEYS and the command's declared older
    keys, the same set for all once those are set aside; the after-accounts are the saved model's (loaded back
    and counted: an independent truth), and the KV-cache bytes per token are there before and after. (heal
    always measures the code and source domains beside --text's: here a few of the text's paragraphs stand in
    for them, as a byte-level tokenizer takes seconds over the 600k characters of standard-library source.)"""
    from headcount import data
    from headcount.models import load
    from headcount.surgery.command import EDITS
    from headcount.surgery.editing import SCHEMA_KEYS, accounts
    from headcount.surgery.healing import loop

    paragraphs = (saved / "text.txt").read_text(encoding="utf-8").split("\n\n")
    small = {"prose": data.held_out_domains()["prose"][:2], "code": paragraphs[:30], "source": paragraphs[30:60]}
    monkeypatch.setattr(data, "held_out_domains", lambda: small)
    monkeypatch.setattr(loop, "_domains", lambda: tuple(small.items()))

    assert {"prune", "merge-kv", "heal"} <= set(EDITS)
    schemas = {}
    for name, edit in sorted(EDITS.items()):
        out = saved / f"out-{name}"
        example = [a.replace("{model}", str(saved / "tiny")) for a in edit.example]
        result = runner.invoke(app, [name, "--model", str(saved / "tiny"), *example, "--text", str(saved / "text.txt"),
                                     "--eval-windows", "1", "--out", str(out), "--json"])
        assert result.exit_code == 0, (name, result.output)
        data = json.loads(result.stdout[result.stdout.index("{"):])
        assert not set(edit.legacy_keys) & set(SCHEMA_KEYS), name  # older keys beside the schema, never over it
        schemas[name] = set(data) - set(edit.legacy_keys)
        assert schemas[name] == set(SCHEMA_KEYS), (name, schemas[name] ^ set(SCHEMA_KEYS))
        after = accounts(load(out))
        heads = after["kv_heads"] if edit.heads_counted == "kv" else after["heads"]
        assert (data["heads_after"], data["kv_bytes_per_token_after"], data["params_after"]) == \
            (heads, after["kv_bytes_per_token"], after["params"]), name
        assert data["kv_bytes_per_token_before"] > 0 and data["out"] == str(out)
        assert data["command"].startswith(f"headcount {name} --model ")
    assert len({frozenset(s) for s in schemas.values()}) == 1


def test_an_argument_error_is_shown_under_the_commands_flag(saved):
    """The library names its argument (ArgumentError: `fraction`, the heal's `tokens`); the command's Edit.flags
    maps it to the flag; no message is parsed. An ArgumentError keeps its parts through pickling (a spawned
    worker's error reaches the parent whole)."""
    import pickle

    from headcount.arguments import ArgumentError, positive_int
    from headcount.cli_errors import renamed

    with pytest.raises(ArgumentError) as err:
        positive_int("tokens", 0)
    assert (err.value.name, err.value.message, str(err.value)) == ("tokens", "expected a positive int, got 0",
                                                                   "tokens: expected a positive int, got 0")
    again = pickle.loads(pickle.dumps(err.value))
    assert (again.name, again.message) == ("tokens", err.value.message)
    with pytest.raises(ArgumentError, match="^--tokens: expected a positive int, got 0$"):
        with renamed({"tokens": "--tokens"}):
            positive_int("tokens", 0)
    with pytest.raises(ArgumentError, match="^steps: "):  # a name the map does not hold stays as it is
        with renamed({"tokens": "--tokens"}):
            positive_int("steps", 0)
    # heal's budget of 2 windows of 512 cannot hold its 8 validation windows: the library says `tokens`
    result = runner.invoke(app, ["heal", "--model", str(saved / "tiny"), "--teacher", str(saved / "tiny"), "--steps",
                                 "1", "--tokens", "1024", "--text", str(saved / "text.txt"), "--eval-windows", "1",
                                 "--out", str(saved / "never")])
    assert result.exit_code == 2 and "headcount heal: --tokens: 1024 tokens is 2 windows of 512" in result.output  # before measuring
    assert not (saved / "never").exists()


@pytest.mark.parametrize("config,constants", [
    ("headcount.surgery.healing.config:HealConfig", {"steps": "DEFAULT_STEPS", "tokens": "DEFAULT_TOKENS",
                                                     "params": "DEFAULT_PARAMS", "window": "WINDOW",
                                                     "patience": "PATIENCE", "eval_windows": "EVAL_WINDOWS"}),
    ("headcount.surgery.pruning.gates_config:GateConfig", {"steps": "L0_STEPS", "lr": "L0_LR",
                                                           "n_windows": "N_WINDOWS", "window": "WINDOW",
                                                           "warmup": "WARMUP", "init": "INIT_LOG_ALPHA"}),
])
def test_configs_are_frozen_default_to_the_constants_and_check_themselves(config, constants):
    import importlib

    from headcount.arguments import ArgumentError

    module_name, cls_name = config.split(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, cls_name)
    made = cls()
    for field, constant in constants.items():
        assert getattr(made, field) == getattr(module, constant), field
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.steps = 3
    with pytest.raises(ArgumentError, match="^steps: expected an int >= 1, got 0"):
        cls(steps=0)
    assert json.loads(json.dumps(made.to_json())) == made.to_json()  # recorded whole, as JSON
    with pytest.raises(ValueError, match="config: give"):
        cls.from_keywords(made, {"steps": 2})


def test_gate_config_resolves_the_joint_defaults_and_refuses_weights_without_joint():
    from headcount.surgery.pruning.gates_config import JOINT_HARD, JOINT_STEPS, JOINT_WARMUP, GateConfig

    joint = GateConfig(joint=True)
    assert (joint.steps, joint.warmup, joint.hard, joint.params) == (JOINT_STEPS, JOINT_WARMUP, JOINT_HARD, "attention")
    assert GateConfig(steps=40).history_every == 2  # steps // 20
    with pytest.raises(ValueError, match="^params: only with joint=True"):
        GateConfig(params="all")
    with pytest.raises(ValueError, match="^hard: only with joint=True"):
        GateConfig(hard=0.5)


def test_the_keyword_form_trains_exactly_what_the_config_trains(one_thread_for_tiny_models):
    """train_gates(model, GateConfig(...)) and train_gates(model, **the same settings): the same gates, step for
    step; the config is recorded whole in the result. The uptrain the same: the same weights after."""
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.surgery import train_gates, uptrain
    from headcount.surgery.merging.defaults import UptrainConfig
    from headcount.surgery.pruning.gates_config import GateConfig

    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=6, d_ff=32,
                        max_position=32)
    model = Decoder(cfg).double().eval()
    ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))
    settings = {"steps": 6, "lr": 0.3, "batch_size": 2}
    a = train_gates(model, GateConfig(**settings), fraction=0.5, calibration=ids, progress=False)
    b = train_gates(model, fraction=0.5, calibration=ids, progress=False, **settings)
    assert a.log_alpha == b.log_alpha and a.expected_l0 == b.expected_l0
    assert a.config == GateConfig(**settings).to_json() and a.to_json()["config"]["lr"] == 0.3
    first, second = (Decoder(cfg).double().eval() for _ in range(2))
    second.load_state_dict(first.state_dict())
    up = uptrain(first, UptrainConfig(steps=3, lr=1e-3, window=16), calibration=ids, progress=False)
    uptrain(second, 3, lr=1e-3, window=16, calibration=ids, progress=False)
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))
    assert up.config["steps"] == 3 and up.to_json()["config"]["window"] == 16
