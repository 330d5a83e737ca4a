"""`headcount merge-kv`: bad input exits 2 with one line and writes nothing; a real run's JSON keys; the
merged model saved, reloaded, and giving the same logits; the default uptrain's accounts (a tiny saved decoder:
they are counts of windows and tokens, the same for any decoder)."""

import json

import pytest
import torch
from conftest import tiny_byte_decoder
from typer.testing import CliRunner

from headcount.cli import app

runner = CliRunner()

KEYS = {"heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
        "kv_bytes_per_token_after", "ppl_before", "ppl_after"}


def _bad(args, match):
    result = runner.invoke(app, ["merge-kv", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and match in lines[0], result.output


@pytest.mark.parametrize("args,match", [
    (["--kv-heads", "0"], "--kv-heads"),
    (["--kv-heads", "1", "--method", "median"], "--method"),
    (["--kv-heads", "1", "--layers", "0,0"], "duplicate"),
    (["--kv-heads", "1", "--layers", "a"], "--layers"),
    (["--kv-heads", "1", "--local-steps", "-1"], "--local-steps"),
])
def test_bad_input_before_loading(args, match):
    _bad(args, match)


def test_existing_out_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _bad(["--kv-heads", "1", "--out", str(out)], "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("args,match", [
    (["--kv-heads", "2", "--method", "mean"], "divisor"),
    (["--kv-heads", "1", "--layers", "30"], "layers"),
])
def test_bad_input_against_the_model(args, match, tmp_path):
    _bad([*args, "--out", str(tmp_path / "never")], match)
    assert not (tmp_path / "never").exists()


def test_merge_one_layer_json_save_and_reload(tmp_path):
    out = tmp_path / "merged"
    result = runner.invoke(app, ["merge-kv", "--kv-heads", "2", "--layers", "1", "--calibration-windows", "2",
                                 "--local-steps", "10", "--eval-windows", "1", "--uptrain-steps", "2", "--out", str(out),
                                 "--json"])
    assert result.exit_code == 0, result.output
    # the JSON object, then the uptrain's one-line summary (stderr, mixed into the runner's output)
    data = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])[0]
    # the edit commands' one schema (EditReport.to_json: the accounts, the quality per stage, the cost, the hashes,
    # the merge's own result under "edit") and merge-kv's older keys beside it
    from headcount.surgery.editing import SCHEMA_KEYS
    assert KEYS <= set(SCHEMA_KEYS)
    assert set(data) == set(SCHEMA_KEYS) | {"method", "merge_options", "uptrain"}
    assert data["uptrain"]["steps"] == data["edit"]["uptrain"]["steps"] == 2 and data["out"] == str(out)
    assert data["held_out"] == {"before_edit": data["ppl_by_domain_before"], "after_edit": data["ppl_by_domain_after"]}
    assert data["quality"]["after_edit"]["perplexity"] == data["ppl_by_domain_after"]
    assert data["kv_heads_before"] == data["heads_before"]
    assert data["command"] == ("headcount merge-kv --kv-heads 2 --layers 1 --uptrain-steps 2 --out " + str(out)
                               + " --local-steps 10 --calibration-windows 2 --eval-windows 1 --json")
    assert len(data["weights_sha256"]) == 64
    assert set(data["ppl_by_domain_before"]) == {"prose", "code", "source"}
    assert data["ppl_by_domain_before"]["prose"] == data["ppl_before"]
    assert data["forward_equivalents"] > 0 and data["seconds"] > 0
    assert data["heads_before"] == 90 and data["heads_after"] == 89
    assert data["kv_bytes_per_token_after"] * 90 == data["kv_bytes_per_token_before"] * 89
    assert data["params_before"] - data["params_after"] == 2 * 64 * 576  # one K and one V head fewer
    assert data["ppl_after"] < data["ppl_before"] * 1.03  # one layer 3 -> 2: nearly free

    from headcount.models import load
    model = load(out)
    attn = model.layers[1].attn
    assert attn.n_kv_heads == 2 and not attn.is_uniform
    ids = torch.arange(1, 33)[None]
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()


def test_uptrain_windows_cuts_the_calibration_windows_in_order():
    from headcount.surgery.merging.cli import uptrain_windows

    windows = torch.arange(2 * 512).view(2, 512)
    pieces = uptrain_windows(windows, 256)
    assert pieces.shape == (4, 256)
    assert torch.equal(pieces[1], windows[0, 256:]) and torch.equal(pieces[2], windows[1, :256])
    assert uptrain_windows(windows[:, :300], 256).shape == (2, 300)  # not a multiple: left whole
    assert uptrain_windows(windows[:, :256], 256).shape == (2, 256)


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """conftest's 2-layer random GQA decoder (2 KV heads) with a byte-level tokenizer, saved: what `headcount
    merge-kv --model DIR` loads; 512 positions, the calibration and held-out windows' length."""
    from headcount.surgery import save

    path = tmp_path_factory.mktemp("merge_cli") / "tiny"
    save(tiny_byte_decoder(max_position=512), path)
    return str(path)


def test_default_uptrain_runs_on_the_merge_windows_and_is_counted(monkeypatch, saved_tiny, one_thread_for_tiny_models):
    from headcount.surgery.command import EditOptions, run_edit_command
    from headcount.surgery.merging import cli, defaults
    from headcount.surgery.merging.uptraining import PROBE_WINDOWS

    def run_merge(**settings):
        return run_edit_command(cli.MergeKV(cli.MergeSettings(1, layers="1", **settings)),
                                EditOptions(model=saved_tiny, eval_windows=1))[0]

    monkeypatch.setattr(defaults, "UPTRAIN_STEPS", 2)  # the default's path (merge_kv's), with a test's step count
    data = run_merge(calibration_windows=2, local_steps=0)
    up = data["edit"]["uptrain"]
    assert up["steps"] == 2 and up["objective"] == "kl_to_teacher"
    assert up["tokens"] == 2 * cli.UPTRAIN_WINDOW  # one piece of a calibration window per step
    # forward-equivalents over the merge's 2 x 512 calibration tokens: the student's forward and backward (3)
    # and the teacher's forward (1) on every uptrain token, and both models' forward on the probe's tokens
    # before and after (PROBE_WINDOWS of the 4 pieces of the 2 windows), added to the merge's own count
    merge = data["edit"]
    assert merge["calibration_tokens"] == 2 * 512
    assert up["probe_tokens"] == PROBE_WINDOWS * cli.UPTRAIN_WINDOW
    assert up["token_forwards"] == 4 * 2 * cli.UPTRAIN_WINDOW + 2 * 2 * up["probe_tokens"]
    assert abs(data["forward_equivalents"] - merge["forward_equivalents"]) < 0.01
    assert data["forward_equivalents"] > 4 * 2 * cli.UPTRAIN_WINDOW / (2 * 512)
    assert data["seconds"] >= round(up["seconds"], 1)
    # the mean-pooling merge gets no uptrain unless asked for
    mean = run_merge(method="mean")
    assert mean["edit"]["uptrain"] is None and mean["uptrain"] is None
