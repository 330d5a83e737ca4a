"""`headcount experiment`: bad input is one line on stderr and exit 2, before any training; a small
good run prints the JSON keys the contract fixes and writes the PNG."""

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app

runner = CliRunner()


def _bad(args, fragment):
    result = runner.invoke(app, ["experiment", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_unknown_experiment_lists_the_known_ones():
    line = _bad(["multi-relations"], "unknown experiment 'multi-relations'")
    for name in ("multi-relation", "heads-sweep", "low-rank", "write-address"):
        assert name in line


@pytest.mark.parametrize("name,heads", [("multi-relation", "1,3"), ("heads-sweep", "5"), ("low-rank", "3"),
                                        ("write-address", "6")])
def test_head_counts_that_do_not_divide_d_model(name, heads):
    _bad([name, "--quick", "--heads", heads], "do not divide d_model")


def test_heads_not_numbers():
    _bad(["heads-sweep", "--heads", "two,four"], "--heads")


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_steps_must_be_positive(steps):
    _bad(["low-rank", "--quick", "--steps", steps], "--steps")


def test_seeds_must_be_positive():
    _bad(["low-rank", "--quick", "--seeds", "0"], "--seeds")


def test_unwritable_png(tmp_path):
    _bad(["low-rank", "--quick", "--png", str(tmp_path / "no" / "such" / "dir" / "plot.png")], "--png")
    _bad(["low-rank", "--quick", "--png", str(tmp_path)], "is a directory")


def test_json_and_png(tmp_path):
    png = tmp_path / "low.png"
    result = runner.invoke(app, ["experiment", "low-rank", "--quick", "--steps", "40", "--json", "--png", str(png),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["experiment"] == "low-rank" and data["quick"] is True
    assert data["results"] and all({"head_dim", "n", "error"} <= set(r) for r in data["results"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_output_has_a_table():
    result = runner.invoke(app, ["experiment", "multi-relation", "--quick", "--steps", "5", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "n_heads" in result.stdout and "accuracy" in result.stdout and "attn params (cost)" in result.stdout
