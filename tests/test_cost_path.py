"""`headcount cost PATH`: a path in place of a preset is read as a config (a file, or a directory's config.json)."""

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app

runner = CliRunner()
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
           "max_position_embeddings": 8192}


def cost(*args):
    return runner.invoke(app, ["cost", *args])


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


def test_config_file_as_model(checkpoint):
    result = cost(str(checkpoint / "config.json"), "--json")
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert rep["params"]["total"] == 134_515_008  # SmolLM2-135M
    assert rep["source"] == str(checkpoint / "config.json")


def test_checkpoint_directory_as_model(checkpoint):
    result = cost(str(checkpoint), "--json", "--tp", "3")
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert rep["params"]["total"] == 134_515_008
    assert [r["query_heads"] for r in rep["per_rank"]] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_a_bare_name_that_is_a_file_here(checkpoint, monkeypatch):
    monkeypatch.chdir(checkpoint)
    (checkpoint / "mymodel").mkdir()
    (checkpoint / "mymodel" / "config.json").write_text(json.dumps(SMOLLM2))
    result = cost("mymodel", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["params"]["total"] == 134_515_008
    (checkpoint / "smollm2").mkdir()  # a preset's name wins over a folder of that name
    result = cost("smollm2", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["model"] == "SmolLM2-135M"


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p / "missing" / "config.json", "no such file"),
    (lambda p: p, "no such file"),  # a directory without config.json
    (lambda p: (p / "bad.json").write_text("{oops") and p / "bad.json", "not valid JSON"),
])
def test_bad_paths_one_line_exit_2(tmp_path, make, fragment):
    path = make(tmp_path)
    result = cost(str(path))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "unknown preset" not in lines[0], result.stderr


def test_path_and_config_together(checkpoint):
    result = cost(str(checkpoint), "--config", str(checkpoint))
    assert result.exit_code == 2 and "not both" in result.stderr
