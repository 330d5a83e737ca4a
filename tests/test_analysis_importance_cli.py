"""`headcount importance`: JSON = HeadScores.to_json(), a heatmap PNG, and one-line errors (exit 2)."""

import json

import pytest
import torch
from typer.testing import CliRunner

from headcount.analysis.importance_cli import METHOD_NAMES, heatmap
from headcount.analysis.scores import HeadScores
from headcount.cli import app

runner = CliRunner()


def test_method_names_match_the_library():
    from headcount.analysis.head_importance import METHODS
    assert METHOD_NAMES == METHODS


def test_json_and_png_on_minilm(tmp_path):
    png = tmp_path / "heads.png"
    result = runner.invoke(app, ["importance", "--model", "minilm", "--method", "confidence", "--windows", "1",
                                 "--json", "--png", str(png)])
    assert result.exit_code == 0, result.output
    scores = HeadScores.from_json(json.loads(result.stdout))
    assert scores.method == "confidence" and scores.scores.shape == (6, 12)
    assert scores.source == "default corpus: calibration" and scores.n_tokens > 100
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heatmap_of_a_padded_model(tmp_path):
    s = HeadScores(torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("nan")]]), "ablation",
                   heads_per_layer=(3, 1))
    heatmap(s, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["--method", "magic"], "--method: expected one of"),
    (["--png", "/nonexistent-dir/x.png"], "does not exist"),
    (["--png", "heads.jpg"], "--png: expected a file name ending in .png"),
    (["--windows", "0"], "--windows"),
    (["--text", "EMPTY"], "the file is empty"),
    (["--text", "BINARY"], "not UTF-8"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    (tmp_path / "EMPTY").write_text("  \n")
    (tmp_path / "BINARY").write_bytes(b"\xff\xfe\x00abc")
    args = [str(tmp_path / a) if a in ("EMPTY", "BINARY") else a for a in args]
    result = runner.invoke(app, ["importance", *args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output
