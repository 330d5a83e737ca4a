"""The report says what the commands do: C11, C15 and the healing section come from the commands' saved
--json results when they were measured on the report's weights (weights_sha256), otherwise from the commands'
defaults run here (prune_to(model, 0.2), merge_kv(model, 1): the functions the commands call, nothing
overridden) on the commands' held-out windows; healing without a saved result names the command to run.
And benchmarks/command_results.py saves what a command printed where the report reads it."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_byte_decoder

from headcount.models.fingerprint import weights_hash
from headcount.report.cache import ResultCache
from headcount.report.collect import collect
from headcount.report.commands import COMMANDS_DIR, command_text, file_name, saved_command

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("shape", "prune_command", "kv_merge", "healing")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: conftest's module-wide single thread


@pytest.fixture(scope="module")
def tiny():
    """conftest's 2-layer random GQA decoder with a byte-level tokenizer (vocabulary 260: a cheap lm_head)."""
    model = tiny_byte_decoder(max_position=128)
    model.name = "tiny"
    return model


BASE = {"prose": 16.5, "code": 24.4, "source": 9.1}


def _save(results: Path, kind: str, data: dict) -> Path:
    path = results / COMMANDS_DIR / file_name(kind, "tiny")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def fake_results(results: Path, weights: str) -> None:
    """What the three commands print with --json (the keys the report reads), as command_results.py saves them."""
    common = {"weights_sha256": weights, "heads_before": 8, "params_before": 1000, "kv_bytes_per_token_before": 256,
              "ppl_before": BASE["prose"], "ppl_by_domain_before": BASE}
    _save(results, "prune", common | {
        "command": "headcount prune --model tiny --fraction 0.2 --out /tmp/x --json", "heads_after": 6,
        "params_after": 900, "kv_bytes_per_token_after": 256, "ppl_after": 17.4,
        "ppl_by_domain_after": {"prose": 17.4, "code": 27.0, "source": 10.4}, "seconds": 61.2,
        "prune": {"order": "reconstruction", "compensate": "lstsq", "mode": "query", "calibration_tokens": 4096}})
    _save(results, "merge", common | {
        "command": "headcount merge-kv --model tiny --kv-heads 1 --json", "heads_before": 4, "heads_after": 2,
        "params_after": 950, "kv_bytes_per_token_after": 128, "ppl_after": 26.6, "method": "aware",
        "ppl_by_domain_after": {"prose": 26.6, "code": 45.8, "source": 25.0}, "seconds": 150.0,
        "merge_options": {"local_steps": 60}, "uptrain": {"steps": 20, "lr": 3e-4}})
    _save(results, "heal", common | {
        "command": "headcount prune --model tiny --fraction 0.5 --heal-steps 200 --out /tmp/y --json",
        "heads_after": 4, "ppl_after": 23.2, "ppl_by_domain_after": {"prose": 23.2, "code": 35.4, "source": 17.2},
        "ppl_by_domain_healed": {"prose": 19.3, "code": 28.2, "source": 13.5}, "seconds": 490.0,
        "heal": {"steps": 200, "planned_steps": 200, "tokens": 95744, "tokens_seen": 102400, "params": "attention",
                 "lr": 3e-4, "trainable_params": 1234, "seconds": 429.0, "forward_equivalents": 5.2,
                 "held_out": {"before_edit": BASE, "after_edit": {"prose": 23.2, "code": 35.4, "source": 17.2},
                              "after_heal": {"prose": 19.3, "code": 28.2, "source": 13.5}}}})


def test_saved_results_count_for_their_weights_only(tiny, tmp_path):
    results = tmp_path / "results"
    mine = weights_hash(tiny)
    fake_results(results, mine)
    assert saved_command(results, "tiny", "prune", mine) is not None
    assert saved_command(results, "tiny", "prune", "f" * 64) is None  # other weights
    assert saved_command(results, "other", "prune", mine) is None  # another model's file name
    _save(results, "merge", {"command": "x", "ppl_before": 1.0})  # no weights_sha256: never used
    assert saved_command(results, "tiny", "merge", mine) is None


def test_the_report_shows_the_commands_saved_results(tiny, tmp_path, monkeypatch):
    import headcount.report.commands as commands

    for name in ("prune_to", "merge_kv", "run_edit"):  # a saved result is read, never recomputed
        monkeypatch.setattr(commands, name, lambda *a, **k: pytest.fail("ran a command although it was saved"))
    results = tmp_path / "results"
    fake_results(results, weights_hash(tiny))
    tasks = {"humaneval:4": {"before_edit": 0.5, "after_edit": 0.25}}  # --eval's block, pass@1 per stage
    path = results / COMMANDS_DIR / file_name("prune", "tiny")
    path.write_text(json.dumps(json.loads(path.read_text()) | {"tasks": tasks}))
    r = collect(tiny, None, only=STEPS, progress=False, cache=ResultCache(tmp_path / "c", enabled=False),
                results_dir=results)
    p, m, h = r["prune_command"], r["kv_merge"], r["healing"]
    assert p["source"] == m["source"] == h["source"] == "saved"
    assert p["command"] == command_text("prune", "tiny") == "headcount prune --model tiny --fraction 0.2 --out DIR --json"
    assert p["path"] == "benchmarks/results/commands/tiny-prune-0.2.json"
    assert (p["ppl_before"], p["ppl_after"], p["heads_removed"], p["order"]) == (16.5, 17.4, 2, "reconstruction")
    assert p["domain_sizes"]["source"] == [4, 128]  # the commands' 4 windows of 512, clamped to the context
    assert p["command_seconds"] == 61.2 and "seconds" not in p
    assert (m["heads_before"], m["heads_after"], m["ppl_after"]) == (4, 2, 26.6)
    assert h["held_out"]["after_heal"] == {"prose": 19.3, "code": 28.2, "source": 13.5}
    assert (h["steps"], h["tokens"], h["heal_seconds"], h["command_seconds"]) == (200, 95744, 429.0, 490.0)
    by = {c["id"]: c for c in r["claims"]}
    assert by["C11"]["source"].startswith("saved result of `headcount prune --model tiny --fraction 0.2 --out DIR "
                                          "--json` (benchmarks/results/commands/tiny-prune-0.2.json), measured on "
                                          f"these weights (sha256 {weights_hash(tiny)[:12]}")
    assert by["C11"]["status"] == "held" and abs(by["C11"]["number"] - (17.4 / 16.5 - 1)) < 1e-5
    assert "code 24.40 -> 27.00 (+10.7%)" in by["C11"]["finding"]
    assert "saved result of `headcount merge-kv --model tiny --kv-heads 1 --json`" in by["C15"]["source"]
    assert "60 local reconstruction steps per layer, a 20-step uptrain" in by["C15"]["finding"]

    from headcount.report.html import render_html
    page = render_html(r)
    assert '<table class="data domains" id="healing-table">' in page and "429 s of healing" in page
    # the saved prune's task scores beside its perplexities; the merge saved none: no table
    assert p["tasks"] == tasks and "merge-tasks" not in page
    table = page[page.index('id="prune-tasks"'):].split("</table>")[0]
    assert "<td>humaneval:4</td><td>0.500</td><td>0.250</td>" in table and "after healing" not in table


def test_without_a_saved_result_the_report_runs_the_commands_defaults(tiny, tmp_path, monkeypatch):
    """Another model's saved results (other weights): prune_to(copy, 0.2) and merge_kv(copy, 1) with nothing
    overridden, in the commands' edit pipeline (run_edit) and measured by the commands' own meter on their windows
    (the settings of surgery.cli_common.quality_meter); healing says how to get it."""
    import headcount.data as data
    import headcount.report.commands as commands
    import headcount.surgery.cli_common as common
    from headcount.surgery.quality import QualityMeter

    calls = {"prune_to": [], "merge_kv": [], "measure": []}
    real_prune, real_merge, real_measure = commands.prune_to, commands.merge_kv, QualityMeter.measure

    def prune_spy(model, fraction, **kwargs):
        calls["prune_to"].append((fraction, kwargs))
        return real_prune(model, fraction, calibration_windows=2, progress=False)  # the defaults, smaller (speed)

    def merge_spy(model, n, **kwargs):
        calls["merge_kv"].append((n, kwargs))
        return real_merge(model, n, n_windows=2, local_steps=2, uptrain_steps=1, progress=False)

    def measure_spy(meter, model, known=None, **kw):
        calls["measure"].append((meter.held_out, meter.eval_windows, meter.window, meter.tasks,
                                 {d: list(w.shape) for d, w in meter.sets(model).items()}))
        return real_measure(meter, model, known, **kw)

    monkeypatch.setattr(commands, "prune_to", prune_spy)
    monkeypatch.setattr(commands, "merge_kv", merge_spy)
    monkeypatch.setattr(QualityMeter, "measure", measure_spy)
    text = " ".join(data.default_corpus().texts("held_out"))[:3000]  # short stand-ins for the three domains
    monkeypatch.setattr(data, "held_out_domains", lambda: {"prose": [text], "code": [text[::-1]], "source": [text]})
    results = tmp_path / "results"
    fake_results(results, "0" * 64)
    r = collect(tiny, None, only=STEPS, progress=False, cache=ResultCache(tmp_path / "c", enabled=False),
                results_dir=results)
    # the functions the commands call, with nothing but progress given: their defaults are the commands'
    assert [(f, set(k)) for f, k in calls["prune_to"]] == [(0.2, {"progress"})]
    assert [(n, set(k)) for n, k in calls["merge_kv"]] == [(1, {"progress"})]
    # what the commands measure: their meter's settings, before / after, for the prune and for the merge; every
    # domain on 4 windows of the model's whole context (the commands' 512 tokens, clamped to 128)
    theirs = common.quality_meter(None, commands.EVAL_WINDOWS)
    windows = {d: [4, 128] for d in ("prose", "code", "source")}
    assert calls["measure"] == [(theirs.held_out, theirs.eval_windows, theirs.window, [], windows)] * 4
    p, m = r["prune_command"], r["kv_merge"]
    assert p["source"] == m["source"] == "run" and p["path"] is None and "command_seconds" not in p
    assert p["weights_sha256"] == weights_hash(tiny) and p["heads_removed"] == 2
    assert list(p["ppl_by_domain_after"]) == ["prose", "code", "source"] and m["ppl_after"] > 0
    assert (m["heads_before"], m["heads_after"]) == (4, 2) and m["uptrain"]["steps"] == 1
    by = {c["id"]: c for c in r["claims"]}
    assert by["C11"]["source"].startswith("run by this report: `headcount prune --model tiny --fraction 0.2")
    assert "healing" not in r
    assert r["unavailable"]["healing"].startswith(
        "not measured: run `headcount prune --model tiny --fraction 0.5 --heal-steps 200 --out DIR --json`")


def test_command_results_saves_what_the_command_printed(tmp_path):
    """benchmarks/command_results.py: the command in a fresh process (here a stand-in printing progress and then
    its JSON), saved under commands/ by model and command; a result without weights_sha256 is refused."""
    spec = importlib.util.spec_from_file_location("command_results", ROOT / "benchmarks" / "command_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\necho 'headcount: working {not json'\n"
                    "echo '{\"weights_sha256\": \"ab\", \"argv\": \"'\"$*\"'\"}'\n")
    fake.chmod(0o755)
    path = module.run_command("merge", "smollm2", tmp_path / "results", python=str(fake))
    assert path == tmp_path / "results" / "commands" / "smollm2-merge-kv-1.json"
    data = json.loads(path.read_text())
    assert data["weights_sha256"] == "ab" and data["argv"] == "-m headcount merge-kv --model smollm2 --kv-heads 1 --json"
    path = module.run_command("heal", "smollm2", tmp_path / "results", python=str(fake), extra=["--eval-windows", "1"])
    argv = json.loads(path.read_text())["argv"].split()
    assert path.name == "smollm2-prune-0.5-heal-200.json"
    assert argv[:7] == ["-m", "headcount", "prune", "--model", "smollm2", "--fraction", "0.5"]
    assert argv[argv.index("--out") + 1] != "DIR" and argv[-3:] == ["--eval-windows", "1", "--json"]
    fake.write_text("#!/bin/sh\necho '{\"ppl_before\": 1.0}'\n")
    with pytest.raises(SystemExit, match="weights_sha256"):
        module.run_command("prune", "smollm2", tmp_path / "results", python=str(fake))
    assert sys.modules.get("command_results") is None
