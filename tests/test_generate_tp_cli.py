"""`headcount generate --tp`: the switchboard hands parallel's setup to models' register (no module patched from
outside). In a world of one (no torchrun) the sharded run prints what the unsharded run prints."""

import pytest
import typer
from typer.testing import CliRunner

from headcount import distributed as runtime
from headcount.cli import app
from headcount.models import cli as models_cli
from headcount.models import save
from headcount.parallel import cli as parallel_cli

from conftest import tiny_byte_decoder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return str(save(tiny_byte_decoder(), tmp_path_factory.mktemp("tiny") / "model"))


def test_models_keep_no_hook_of_another_room():
    assert not hasattr(models_cli, "TP_SETUP")


def test_generate_tp_in_a_world_of_one_prints_the_unsharded_tokens(saved, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runner = CliRunner()
    plain = runner.invoke(app, ["generate", "the", "--model", saved, "-n", "6", "--no-stop"])
    assert plain.exit_code == 0, plain.output
    try:
        sharded = runner.invoke(app, ["generate", "the", "--model", saved, "-n", "6", "--no-stop", "--tp"])
    finally:
        runtime.shutdown()
    assert sharded.exit_code == 0, sharded.output
    assert sharded.stdout == plain.stdout and plain.stdout.strip()
    assert "world size of 1" in sharded.stderr


def test_generate_tp_without_the_hook_says_it_is_not_available(saved):
    bare, bench = typer.Typer(), typer.Typer()
    models_cli.register(bare, bench)
    result = CliRunner().invoke(bare, ["generate", "the", "--model", saved, "-n", "2", "--tp"])
    assert result.exit_code == 2 and "--tp: tensor parallelism is not available" in result.output


def test_register_calls_the_setup_it_is_given(saved, monkeypatch):
    calls = []

    def fake_setup(model, *, seed, sample, log):
        calls.append((seed, sample))
        return True, seed

    monkeypatch.setattr(parallel_cli, "tp_setup", fake_setup)
    bare, bench = typer.Typer(), typer.Typer()
    models_cli.register(bare, bench, tp_setup=parallel_cli.tp_setup)
    result = CliRunner().invoke(bare, ["generate", "the", "--model", saved, "-n", "2", "--tp", "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert calls == [(5, False)]
