"""bench scale: each step's own peak RSS (a child allocating a known amount), its JSON read, the slope fit."""

import sys

import pytest

from headcount.bench import scale


def fake(monkeypatch, code: str):
    monkeypatch.setattr(scale, "command", lambda step, model, dtype, out, windows=None: [sys.executable, "-c", code])


def test_peak_rss_is_the_childs_own_and_json_is_read(monkeypatch):
    fake(monkeypatch, "import json; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); "
                      "print('progress line'); print(json.dumps({'params_before': 1234, 'forward_equivalents': 4.5}))")
    s = scale.run_step("prune", "m")
    assert s.returncode == 0 and s.error is None
    assert 300 << 20 <= s.peak_rss_bytes < 1 << 30
    assert s.params == 1234 and s.forward_equivalents == 4.5
    small = (fake(monkeypatch, "print('{}')"), scale.run_step("prune", "m"))[1]
    assert small.peak_rss_bytes < 200 << 20  # not the previous child's peak


def test_failure_and_timeout_are_reported(monkeypatch):
    fake(monkeypatch, "import sys; print('Traceback...', file=sys.stderr); print('bad input: --x', file=sys.stderr); "
                      "sys.exit(2)")
    s = scale.run_step("importance", "m")
    assert s.returncode == 2 and s.error == "bad input: --x"
    fake(monkeypatch, "import time; time.sleep(30)")
    s = scale.run_step("importance", "m", timeout=0.5)
    assert s.returncode != 0 and s.seconds < 10


def test_slope_recovers_the_exponent_and_run_fills_params(monkeypatch):
    assert scale.slope([(1e8, 2.0), (4e8, 16.0), (1.6e9, 128.0)]) == pytest.approx(1.5)
    assert scale.slope([(1e8, 2.0)]) is None
    fake(monkeypatch, "import json; print(json.dumps({'params': 10}))")
    r = scale.run(["a"], ["perplexity", "prune"])
    assert [s.step for s in r.steps] == ["perplexity", "prune"] and all(s.params == 10 for s in r.steps)
    with pytest.raises(ValueError, match="steps"):
        scale.run(["a"], ["nope"])


def test_every_step_is_a_command_line_the_cli_accepts(tmp_path):
    """The steps are real `headcount` command lines (click rejects an unknown flag before it reaches an eager
    --help), and the report runs from an empty cache: a cached report would time a read of its files."""
    from typer.testing import CliRunner

    from headcount.cli import app

    for step in scale.STEPS:
        argv = scale.command(step, "smollm2", "bf16", tmp_path, windows=4)
        assert argv[:3] == [sys.executable, "-m", "headcount"]
        result = CliRunner().invoke(app, argv[3:] + ["--help"])
        assert result.exit_code == 0, (step, result.output)
    assert "--no-cache" in scale.command("report", "smollm2", "fp32", tmp_path)
    with pytest.raises(ValueError, match="step"):
        scale.command("nope", "smollm2", "fp32", tmp_path)
