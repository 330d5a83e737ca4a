"""build / write / cache / collect: the output-folder rules, atomic writes, the cache keys, and a
byte-identical report.json for the same seed on a tiny random decoder (real analyses, small sizes)."""

import json
import os

import pytest
import torch

from headcount.report.build import OutputExistsError, check_out, dumps, write_report
from headcount.report.cache import ResultCache, cache_key, text_hash, weights_hash
from headcount.report.collect import QUICK, Sizes, _untimed, collect, normalise
from headcount.report.example import example_report


def _tree(path):
    return sorted((p.relative_to(path).as_posix(), p.read_bytes()) for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------ --out rules
def test_existing_out_is_refused_without_force_and_left_alone(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    before = _tree(tmp_path)
    with pytest.raises(OutputExistsError, match="exists; pass --force"):
        write_report(example_report(), out)
    assert _tree(tmp_path) == before  # nothing written, not even a temporary folder


def test_force_replaces_the_folder_whole(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "old.txt").write_text("old")
    write_report(example_report(), out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "report.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no temporary siblings left


def test_a_failed_render_writes_nothing(tmp_path):
    bad = example_report()
    bad["sample"]["layers"] = [[["x"]]]  # a weight that is not a number
    with pytest.raises(TypeError):
        write_report(bad, tmp_path / "rep")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere: the permission check cannot fail")
def test_unwritable_parent_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot write"):
            check_out(ro / "rep", force=False)
    finally:
        ro.chmod(0o700)


def test_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_out(f, force=True)


def test_report_json_is_sorted_rounded_and_round_trips(tmp_path):
    r = example_report()
    out = write_report(r, tmp_path / "rep")
    text = (out / "report.json").read_text()
    assert text == dumps(json.loads(text))
    assert json.loads(text) == r
    for key in ("model", "shape", "roles", "faithfulness", "rank", "importance", "pruning", "kv_merge", "claims"):
        assert key in r


# ----------------------------------------------------------------------------------- normalising
def test_normalise_rounds_to_six_significant_digits_and_drops_nan():
    assert normalise({"a": 1 / 3, "b": (float("nan"), float("inf")), 2: torch.tensor([1e-9 / 3])}) == \
        {"a": 0.333333, "b": [None, None], "2": [3.33333e-10]}
    assert normalise(True) is True and normalise(7) == 7


def test_timings_are_left_out():
    assert _untimed({"a": 1, "seconds": 3.2, "merge": {"seconds": 1.0, "b": [{"seconds": 2}]}}) == \
        {"a": 1, "merge": {"b": [{}]}}


# ------------------------------------------------------------------------------------------ cache
def test_cache_key_changes_with_weights_text_and_parameters():
    base = dict(weights="w", text=text_hash(["abc"]), params={"seed": 0})
    k = cache_key("roles", **base)
    assert k == cache_key("roles", **base)
    assert k != cache_key("rank", **base)
    assert k != cache_key("roles", **{**base, "weights": "w2"})
    assert k != cache_key("roles", **{**base, "text": text_hash(["abd"])})
    assert k != cache_key("roles", **{**base, "params": {"seed": 1}})
    assert text_hash(None) != text_hash(["abc"])


def test_weights_hash_sees_one_changed_weight():
    m = torch.nn.Linear(3, 2)
    h = weights_hash(m)
    with torch.no_grad():
        m.weight[0, 0] += 1e-6
    assert weights_hash(m) != h


def test_cache_reads_back_without_recomputing(tmp_path):
    cache = ResultCache(tmp_path)
    calls = []
    compute = lambda: calls.append(1) or {"x": [1, 2.5]}  # noqa: E731
    assert cache.get_or_compute("roles", "k", compute) == {"x": [1, 2.5]}
    assert cache.get_or_compute("roles", "k", compute) == {"x": [1, 2.5]}
    assert calls == [1] and cache.hits == ["roles"]
    (tmp_path / "roles-k.json").write_text("{damaged")
    assert cache.get_or_compute("roles", "k", compute) == {"x": [1, 2.5]} and calls == [1, 1]


# ------------------------------------------------------------------------- collect, real analyses
TINY = Sizes(roles_tokens=256, roles_sentences=8, faithfulness_layers=2, faithfulness_examples=1, rank_examples=1,
             importance_windows=1, pruning_fractions=(0.25,), eval_windows=1, merge_windows=1, window=64,
             merge_local_steps=4, merge_uptrain_steps=2)  # the merge's defaults are 60 and 20: small here
STEPS = ("shape", "sample", "roles", "rank")
# A short text of plain sentences (paragraphs split into calibration / held-out like the default corpus).
TEXT = "\n\n".join(
    f"The {a} quickly reads the long {b} that the old {c} wrote last year. A careful {b} often helps the {a}, "
    f"and the {c} rarely asks for it back. When the {a} finished the {b}, the {c} smiled and wrote another one."
    for a, b, c in [("student", "letter", "teacher"), ("farmer", "report", "mayor"), ("child", "story", "writer"),
                    ("doctor", "note", "nurse"), ("pilot", "manual", "engineer"), ("singer", "song", "poet"),
                    ("baker", "recipe", "cook"), ("judge", "brief", "lawyer")])


@pytest.fixture(scope="module")
def tiny(smollm2):
    """A 2-layer random GQA decoder with SmolLM2's tokenizer: the real analyses in a second."""
    from headcount.models.decoder import Decoder, DecoderConfig

    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=smollm2.config.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                        d_ff=64, max_position=256)
    model = Decoder(cfg).eval()
    model.tokenizer = smollm2.tokenizer
    model.name = "tiny"
    return model


def test_same_seed_gives_a_byte_identical_report_json(tiny, tmp_path):
    a = collect(tiny, TEXT, seed=1, sizes=TINY, only=STEPS, progress=False, cache=ResultCache(tmp_path, enabled=False))
    b = collect(tiny, TEXT, seed=1, sizes=TINY, only=STEPS, progress=False, cache=ResultCache(tmp_path, enabled=False))
    assert dumps(a) == dumps(b)
    assert list(tmp_path.iterdir()) == []  # a disabled cache stores nothing
    # the contract: roles as RoleScores.to_json(), one entry per role
    assert set(a["roles"]) == {"previous_token", "duplicate_token", "induction", "positional", "syntactic",
                               "rare_word", "sink"}
    for role in a["roles"].values():
        assert set(role) == {"scores", "threshold", "heads"} and len(role["scores"]) == 2
    assert a["shape"]["n_heads"] == 4 and a["shape"]["n_kv_heads"] == 2
    assert [r["label"] for r in a["accounts"]["rows"]] == ["MHA", "GQA", "MQA"]
    assert len(a["sample"]["layers"]) == 2 and len(a["sample"]["layers"][0]) == 4
    # each attention row of the sample sums to 1 (in thousandths, up to rounding)
    for row in a["sample"]["layers"][1][3]:
        assert abs(sum(row) - 1000) <= len(row)
    assert a["unavailable"] == {k: "not run" for k in (
        "checks", "faithfulness", "importance", "pruning", "prune_command", "kv_merge", "healing", "gates",
        "experiment-multi-relation",
        "experiment-write-address", "experiment-heads-sweep", "experiment-low-rank")}
    assert [c["id"] for c in a["claims"]] == [f"C{i}" for i in range(1, 16)]


def test_a_rerun_reads_every_step_from_the_cache(tiny, tmp_path):
    cache = ResultCache(tmp_path)
    first = collect(tiny, TEXT, sizes=TINY, only=STEPS, progress=False, cache=cache)
    cache2 = ResultCache(tmp_path)
    second = collect(tiny, TEXT, sizes=TINY, only=STEPS, progress=False, cache=cache2)
    assert sorted(cache2.hits) == sorted(STEPS)
    assert dumps(first) == dumps(second)
    third = ResultCache(tmp_path)
    collect(tiny, TEXT, seed=5, sizes=TINY, only=("shape", "rank"), progress=False, cache=third)
    assert third.hits == ["shape"]  # the seed is part of rank's key, not of the shape's


def test_bad_seed_and_model_are_type_errors(tiny):
    with pytest.raises(TypeError, match="seed"):
        collect(tiny, seed="1", progress=False)
    with pytest.raises(TypeError, match="model"):
        collect(object(), progress=False)


def test_real_faithfulness_importance_and_merge_render(tiny, tmp_path):
    from headcount.report.html import render_html

    r = collect(tiny, TEXT, sizes=TINY, only=("shape", "faithfulness", "importance", "kv_merge"), progress=False,
                cache=ResultCache(tmp_path, enabled=False))
    assert {(h["layer"], h["head"]) for h in r["faithfulness"]["heads"]} == {(l, h) for l in (0, 1) for h in range(4)}
    assert all(h["tv"] <= 0.01 for h in r["faithfulness"]["heads"])  # the search stays within epsilon
    assert len(r["importance"]["scores"]) == 2
    # on the user's own text the K/V merge is merge_kv's defaults (the command's local steps and uptrain) on the
    # report's windows of that text (on the default corpus it is the command's: tests/test_report_commands.py)
    m = r["kv_merge"]
    assert m["source"] == "text" and (m["heads_before"], m["heads_after"]) == (4, 2)  # 2 layers, 2 -> 1 KV heads each
    assert m["kv_bytes_per_token_after"] * 2 == m["kv_bytes_per_token_before"]
    assert m["params_after"] < m["params_before"] and m["ppl_before"] > 0 and m["ppl_after"] > 0
    assert m["uptrain"]["steps"] == 2 and m["options"]["local_steps"] == 4  # TINY's (defaults: 60 and 20)
    assert "calibrated on the report's own text" in next(c for c in r["claims"] if c["id"] == "C15")["finding"]
    page = render_html(r)
    for fig in ("fig-faith", "fig-importance", "fig-accounts"):
        assert f'id="{fig}"' in page


def test_c12_reads_the_gates_benchs_saved_result_as_is(tiny, tmp_path, monkeypatch):
    import headcount.report.trained as trained
    monkeypatch.setattr(trained, "train_gates", lambda *a, **k: pytest.fail("trained gates despite a saved result"))
    # the gates bench's saved result for this model (its own format, read as is)
    results = tmp_path / "results"
    results.mkdir()
    point = {"fraction": 0.5, "heads_kept": 4, "ppl_by_text": {"prose": 12.0, "code": 30.0}}
    bench = {"gates": {"quick": False, "tiny": {"model": "tiny", "heads": 8, "steps": 300, "base": {
        "ppl_by_text": {"prose": 10.0, "code": 20.0}}, "points": [
        point | {"method": "retraining-free"}, point | {"method": "l0 + lstsq"},
        point | {"method": "l0 (no refit)", "ppl_by_text": {"prose": 50.0}}]}}}
    (results / "surgery_gates.json").write_text(json.dumps(bench))
    r = collect(tiny, TEXT, sizes=TINY, only=("shape", "gates"), progress=False,
                cache=ResultCache(tmp_path, enabled=False), results_dir=results)
    assert r["gates"]["source"] == "saved" and len(r["gates"]["points"]) == 1
    c12 = next(c for c in r["claims"] if c["id"] == "C12")
    assert c12["status"] == "held" and abs(c12["number"] - 0.2) < 1e-9, c12["finding"]
    assert "benchmarks/results/surgery_gates.json" in c12["source"] and "4 of 8 heads" in c12["finding"]


def test_experiments_come_from_saved_full_runs_or_quick_runs(tiny, tmp_path, monkeypatch):
    import headcount.report.trained as trained
    from headcount.experiments.results import ExperimentResult

    calls = []

    def fake_run(name, *, quick=False, seed=0, progress=True, **kw):
        calls.append((name, quick))
        rows = [{"n_heads": 1, "head_dim": 32, "accuracy": 0.5, "attention_params": 4096},
                {"n_heads": 2, "head_dim": 16, "accuracy": 1.0, "attention_params": 4096}]
        return ExperimentResult(name, "claim", quick, {"seeds": 1, "steps": 10}, rows)
    monkeypatch.setattr(trained, "run_experiment", fake_run)
    results = tmp_path / "results"
    results.mkdir()
    saved = fake_run("multi-relation").to_json() | {"quick": False, "config": {"seeds": 3, "steps": 1000}}
    (results / "multi-relation.json").write_text(json.dumps(saved))
    calls.clear()
    only = ("shape", "experiment-multi-relation")
    cache = ResultCache(tmp_path / "cache")
    r = collect(tiny, TEXT, sizes=TINY, only=only, progress=False, cache=cache, results_dir=results)
    assert calls == []  # the saved full run is read, nothing trained
    assert r["experiments"]["multi-relation"]["source"] == "saved"
    c1 = r["claims"][0]
    assert c1["id"] == "C1" and c1["status"] == "held" and "benchmarks/results/multi-relation.json" in c1["source"]
    assert "3 seeds, 1000 steps" in c1["source"]
    # no saved run: the --quick run, once; a second report (any model) reads it back from the cache
    r = collect(tiny, TEXT, sizes=TINY, only=only, progress=False, cache=cache, results_dir=None)
    assert calls == [("multi-relation", True)] and r["experiments"]["multi-relation"]["source"] == "quick"
    assert "--quick run" in r["claims"][0]["source"]
    again = ResultCache(tmp_path / "cache")
    collect(tiny, TEXT, seed=0, sizes=TINY, only=("experiment-multi-relation",), progress=False, cache=again,
            results_dir=None)
    assert calls == [("multi-relation", True)] and again.hits == ["experiment-multi-relation"]


def test_real_checks_default_pruning_and_gates(tiny, tmp_path):
    """The chapter checks, prune_to with the project's defaults (C11) and trained gates (C12) on the tiny model:
    real calls, small sizes; the claims are read from what they measured."""
    import inspect

    from headcount.surgery import prune_to

    sizes = Sizes(**{**TINY.__dict__, "pruning_fractions": (0.2, 0.5), "random_fractions": (0.5,), "gate_steps": 4,
                     "gate_windows": 2, "importance_windows": 2})
    r = collect(tiny, TEXT, sizes=sizes, only=("shape", "checks", "importance", "pruning"), progress=False,
                cache=ResultCache(tmp_path, enabled=False), results_dir=None)
    by = {c["id"]: c for c in r["claims"]}
    for cid in ("C2", "C4", "C5", "C10", "C14"):  # arithmetic and the fused path: exact on any model
        assert by[cid]["status"] == "held", (cid, by[cid]["finding"])
    assert r["checks"]["c2"]["view_moves_no_data"] and not r["checks"]["c2"]["transposed_q_contiguous"]
    assert r["checks"]["c14"]["measured"] == 2 * 2 * 8 * 2 * 2  # 2 x n_kv x head_dim x layers x bf16 bytes
    assert by["C6"]["status"] in ("held", "did not hold") and len(r["checks"]["c6"]["measured"]) == 2
    default = r["pruning"]["default"]
    params = inspect.signature(prune_to).parameters
    assert default["via"] == "prune_to" and default["fraction"] == 0.2
    assert (default["order"], default["compensate"]) == (params["order"].default, params["compensate"].default)
    assert r["pruning"]["default_order"] == params["order"].default
    assert {(p["order"], p["compensate"]) for p in r["pruning"]["points"]} >= {
        (params["order"].default, params["compensate"].default), ("random", "none")}
    assert r["importance"]["method"] == params["order"].default  # one scoring pass: the curve reuses it
    assert by["C11"]["status"] in ("held", "did not hold") and by["C11"]["number"] is not None
    assert by["C11"]["source"].startswith("measured on tiny in this report's run")


def test_real_gates(tiny, tmp_path):
    sizes = Sizes(**{**TINY.__dict__, "gate_steps": 4, "gate_windows": 2, "gate_window": 32})
    r = collect(tiny, TEXT, sizes=sizes, only=("shape", "gates"), progress=False,
                cache=ResultCache(tmp_path, enabled=False), results_dir=None)
    by = {c["id"]: c for c in r["claims"]}
    g = r["gates"]
    assert g["steps"] == 4 and g["heads_removed"] == 4 and g["heads_before"] == 8  # half of 2 x 4 heads
    assert g["ppl_before"] > 0 and g["ppl_after"] > 0 and g["window"] == 32
    assert by["C12"]["status"] in ("held", "did not hold") and by["C12"]["number"] is not None
    assert g["source"] == "run" and "the gates bench has no saved result for this model" in by["C12"]["source"]


def test_pruning_shows_the_three_held_out_domains(tiny, tmp_path, monkeypatch):
    """On the default corpus the curve's default prune reports prose, code and stdlib source, through
    surgery's one measure, QualityMeter (measuring once per model: the unmodified one, the pruned one), and
    domain_rows; code and source agree with surgery's own held_out_report on the same windows. (The K/V merge and
    C11's prune are the commands': tests/test_report_commands.py.)"""
    import headcount.surgery.cli_common as common
    from headcount.report.claims import domain_table
    from headcount.report.html import render_html
    from headcount.report.meter import ReportMeter
    from headcount.surgery.quality import QualityMeter

    calls = []
    real = QualityMeter.measure

    def counted(meter, model, known=None, **kw):
        calls.append((meter.held_out, meter.eval_windows, meter.window, meter.sizes))
        return real(meter, model, known, **kw)
    monkeypatch.setattr(QualityMeter, "measure", counted)
    import inspect
    import textwrap

    import headcount.data as data
    # short stand-ins for the two other domains (the real ones take seconds to gather): docstrings, stdlib source
    code = [inspect.getdoc(torch.nn.Linear), inspect.getdoc(torch.nn.functional.scaled_dot_product_attention)]
    monkeypatch.setattr(data, "held_out_domains", lambda: {"prose": data.default_corpus().texts("held_out"),
                                                           "code": code, "source": [inspect.getsource(textwrap)]})
    sizes = Sizes(**{**TINY.__dict__, "pruning_fractions": (0.2,), "random_fractions": (), "eval_windows": 1,
                     "domain_windows": 1, "domain_window": 64})
    timings = {}
    r = collect(tiny, None, sizes=sizes, only=("shape", "pruning"), progress=False, timings=timings,
                cache=ResultCache(tmp_path, enabled=False), results_dir=None)
    # the unmodified model once, then the pruned one: prose on eval_windows x window, code / source on their sizes
    assert calls == [(None, 1, 64, {"code": (1, 64), "source": (1, 64)})] * 2
    assert timings[ReportMeter.TIMING] > 0
    base = common.held_out_report(tiny, None, 1, 64)[2]  # the commands' measure, on the same windows
    for name, key, after in (("pruning", "default", "ppl"),):
        section = r[name]
        assert list(section["ppl_by_domain_before"]) == ["prose", "code", "source"]
        assert section["domain_sizes"] == {"prose": [1, 64], "code": [1, 64], "source": [1, 64]}
        headline = (section[key] if key else section)[after]
        assert section["ppl_by_domain_after"]["prose"] == headline  # one prose number on the page
        for domain in ("code", "source"):
            assert section["ppl_by_domain_before"][domain] == normalise(base[domain])
            assert section["ppl_by_domain_after"][domain] > 0
        assert [row[0] for row in domain_table(section)] == ["prose", "code", "source"]
    assert r["pruning"]["ppl_by_domain_before"]["prose"] == r["pruning"]["base_ppl"]
    by = {c["id"]: c for c in r["claims"]}
    for cid in ("C11",):
        assert "on the other held-out domains: code " in by[cid]["finding"] and ", source " in by[cid]["finding"]
    page = render_html(r)
    assert page.count('class="data domains"') == 1 and "<td>source</td><td>1 \u00d7 64</td>" in page
    # a user's text has one held-out set: no domains, and the section says why
    r = collect(tiny, TEXT, sizes=sizes, only=("shape", "pruning"), progress=False,
                cache=ResultCache(tmp_path, enabled=False), results_dir=None)
    assert "ppl_by_domain_before" not in r["pruning"] and "one held-out set" in r["pruning"]["domains_note"]
    assert "Held-out domains: the report" in render_html(r)


def test_c12_prefers_the_gates_benchs_saved_result(tiny, tmp_path, monkeypatch):
    import headcount.report.trained as trained
    from headcount.report.html import render_html

    for name in ("train_gates", "apply_gates"):  # the saved result must be preferred: never called
        monkeypatch.setattr(trained, name, lambda *a, **k: pytest.fail("the report trained gates although a saved "
                                                                       "result exists"))
    results = tmp_path / "results"
    results.mkdir()
    point = {"fraction": 0.5, "heads_kept": 4, "ppl_by_text": {"prose": 11.0}, "method": "l0 + lstsq"}
    bench = {"gates": {"quick": True, "tiny": {"model": "tiny", "heads": 8, "steps": 300,
                                                "base": {"ppl_by_text": {"prose": 10.0}}, "points": [point]}}}
    (results / "surgery_gates.json").write_text(json.dumps(bench))
    cache = ResultCache(tmp_path / "cache")
    r = collect(tiny, TEXT, sizes=TINY, only=("shape", "gates"), progress=False, cache=cache, results_dir=results)
    assert r["gates"]["source"] == "saved" and r["gates"]["quick"] is True
    c12 = next(c for c in r["claims"] if c["id"] == "C12")
    assert "saved --quick result in benchmarks/results/surgery_gates.json" in c12["source"]
    assert "preferred to a short run" in c12["source"] and c12["status"] == "held"
    assert "Source: the gates bench&#x27;s saved --quick result" in render_html(r)
    # the file is part of the cache key: a new saved result is read, not the cached old one
    bench["gates"]["tiny"]["points"][0]["ppl_by_text"] = {"prose": 13.0}
    (results / "surgery_gates.json").write_text(json.dumps(bench))
    again = ResultCache(tmp_path / "cache")
    r = collect(tiny, TEXT, sizes=TINY, only=("shape", "gates"), progress=False, cache=again, results_dir=results)
    assert "gates" not in again.hits and r["gates"]["points"][0]["ppl"] == 13.0
