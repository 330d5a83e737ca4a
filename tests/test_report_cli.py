"""`headcount report`, `headcount demo`, `headcount tour` on the command line: bad input is one line and
exit status 2, checked before any model is loaded; the commands are registered."""

import pytest
from typer.testing import CliRunner

from headcount.cli import app

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, list(args))


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_existing_out_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    r = _run("report", "--model", "minilm", "--out", str(out))
    _one_line_error(r, "headcount report:", "exists", "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_unknown_model(tmp_path):
    r = _run("report", "--model", "no-such-model", "--out", str(tmp_path / "rep"))
    _one_line_error(r, "unknown model", "minilm")
    assert not (tmp_path / "rep").exists()


def test_missing_text_file(tmp_path):
    r = _run("report", "--text", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "rep"))
    _one_line_error(r, "no such file")


def test_negative_seed(tmp_path):
    _one_line_error(_run("report", "--seed", "-1", "--out", str(tmp_path / "rep")), "--seed")


def test_out_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    _one_line_error(_run("report", "--out", str(f), "--force"), "is a file")


@pytest.mark.parametrize("command,words", [("report", "--quick"), ("demo", "smollm2"), ("tour", "tour")])
def test_commands_are_registered(command, words):
    r = _run(command, "--help")
    assert r.exit_code == 0 and words in r.output


@pytest.mark.parametrize("flag,value,needle", [("--dtype", "fp8", "fp32, bf16, fp16"), ("--device", "tpu", "--device")])
def test_bad_dtype_or_device_is_one_line_before_any_work(tmp_path, flag, value, needle):
    r = _run("report", "--model", "smollm2", flag, value, "--out", str(tmp_path / "rep"))
    _one_line_error(r, "headcount report:", flag, needle)
    assert not (tmp_path / "rep").exists()
