"""`headcount drop-attention`: the edit commands' JSON (kv_bytes_per_token_before / _after among the keys), the
saved model reloaded with its layers dropped, and bad input: one line, exit 2, nothing written."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.models import load
from headcount.models.formats.native import save

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tiny_byte_decoder  # noqa: E402

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("drop") / "tiny"
    save(tiny_byte_decoder(max_position=512), path)  # 2 layers of 2 K/V heads x 8, fp32: 128 KV bytes per token each
    return path


def drop(*args):
    return runner.invoke(app, ["drop-attention", *args])


def test_json_saved_model_the_kv_accounts_and_healing(saved, tmp_path):
    result = drop("--model", str(saved), "--layers", "1", "--eval-windows", "1", "--out", str(tmp_path / "out"),
                  "--heal-steps", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert (data["kv_bytes_per_token_before"], data["kv_bytes_per_token_after"]) == (256, 128)
    assert data["dropped"] == data["edit"]["dropped"] == [1] and data["edit"]["by"] is None
    assert (data["heads_before"], data["heads_after"], data["kv_heads_after"]) == (8, 4, 2)
    assert set(data["ppl_by_domain_after"]) == {"prose", "code", "source"}
    back = load(str(tmp_path / "out"))
    assert back.dropped_layers == (1,) and sum(c.nbytes for c in back.new_cache(1, 1)) == 128
    # healing moves what is left of the edited layer: its MLP and the norm before it
    layer = back.layers[1]
    assert data["heal"]["steps"] == 1 and data["heal"]["layers"] == [1]
    assert data["heal"]["trainable_params"] == sum(p.numel() for m in (layer.mlp, layer.mlp_norm)
                                                   for p in m.parameters())


def test_fraction_by_loss_measures_the_order(saved):
    result = drop("--model", str(saved), "--fraction", "0.5", "--by", "loss", "--calibration-windows", "2",
                  "--eval-windows", "1", "--json")
    assert result.exit_code == 0, result.output
    edit = json.loads(result.stdout[result.stdout.index("{"):])["edit"]
    assert edit["by"] == "loss" and len(edit["dropped"]) == 1 and sorted(edit["order"]) == [0, 1]
    cheapest = min(edit["scores"], key=lambda k: edit["scores"][k])
    assert edit["dropped"] == [int(cheapest)]


@pytest.mark.parametrize("args,message", [
    (["--fraction", "1.5"], r"--fraction: expected a share of the layers in \(0, 1\), got 1.5"),
    (["--fraction", "0"], "--fraction: expected"),
    (["--layers", "7"], r"--layers: expected layer indices in 0\.\.1 \(the model has 2 layers\), got 7"),
    (["--layers", "0,1"], "--layers: that would drop the attention of all 2 layers"),
    (["--fraction", "0.5", "--layers", "1"], "--fraction, --layers: expected exactly one of them .* got both"),
    ([], "--fraction, --layers: expected exactly one of them .* got neither"),
    (["--layers", "1", "--by", "cosine"], "--by: expected one of similarity, loss, got 'cosine'"),
    (["--layers", "x"], "--layers: expected comma-separated layer indices"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(saved, tmp_path, args, message):
    import re

    result = drop("--model", str(saved), *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and line.startswith("headcount drop-attention: ") and re.search(message, line), line
    assert not (tmp_path / "out").exists()


def test_the_commands_defaults_are_the_librarys():
    from headcount.surgery.dropping import choose, cli

    assert cli.BY == choose.BY and cli.N_WINDOWS == choose.N_WINDOWS
