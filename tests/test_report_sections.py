"""report.json's typed sections (sections.py): each one read back from its JSON and written out again gives the
same section; a report.json of another format version is refused in one line that says to rebuild it; a step whose
section does not apply (NotApplicable) is recorded as unavailable, while any other exception fails the report."""

from dataclasses import fields, replace

import pytest
from conftest import tiny_byte_decoder

from headcount.report.measures import rank as rank_measure
from headcount.report.build import write_report
from headcount.report.cache import ResultCache
from headcount.report.claims import read_claims
from headcount.report.collect import collect
from headcount.report.example import example_report
from headcount.report.html import render_html
from headcount.report.not_applicable import NotApplicable
from headcount.report.section_base import Section
from headcount.report.sections import FORMAT, Experiment, Gates, Pruning, ReportData, check_format
from headcount.report.summary import summary_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: conftest's module-wide single thread

SECTIONS = ("shape", "accounts", "faithfulness", "rank", "checks", "pruning", "prune_command", "kv_merge", "healing",
            "gates")


def _typed(report: dict) -> ReportData:
    return ReportData.from_json(report)


@pytest.mark.parametrize("name", SECTIONS + ("roles", "experiments"))
def test_a_section_round_trips_through_its_dataclass(name):
    r = example_report()
    data = _typed(r)
    section = getattr(data, name)
    assert section is not None and section != {}
    items = section.items() if isinstance(section, dict) else [(None, section)]
    for key, typed in items:
        original = r[name] if key is None else r[name][key]
        assert typed.to_json() == original  # every key back with its value: those no class names ride in `more`
        assert type(typed).from_json(typed.to_json()) == typed
    built = type(typed)(**{f.name: getattr(typed, f.name) for f in fields(typed)})  # made in code, not read
    assert type(typed).from_json(built.to_json()) == built == typed


def test_the_whole_report_round_trips():
    data = _typed(example_report())
    assert ReportData.from_json(data.to_json()) == data
    assert isinstance(data.pruning, Pruning) and isinstance(data.gates, Gates)
    assert all(isinstance(e, Experiment) for e in data.experiments.values())
    assert read_claims(data.to_json()) == read_claims(example_report())  # the claims read the same sections


def test_a_section_missing_a_required_key_names_it():
    with pytest.raises(ValueError, match=r"report.json report.pruning: expected the key 'default'"):
        _typed(example_report() | {"pruning": {"points": []}})
    with pytest.raises(ValueError, match=r"report.json report.checks.c14: expected an object, got list"):
        _typed(example_report() | {"checks": {"c14": [1, 2]}})


def test_a_generic_section_keeps_what_it_does_not_name():
    from dataclasses import dataclass

    @dataclass
    class Point(Section):
        x: int
        y: int | None = None

    @dataclass
    class Curve(Section):
        points: list[Point]
        label: str = ""

    data = {"points": [{"x": 1, "y": 2, "z": [3]}, {"x": 4}], "label": "a", "note": None}
    curve = Curve.from_json(data)
    assert curve.points[0] == Point(1, 2, more={"z": [3]}) and curve.more == {"note": None}
    assert curve.to_json() == data  # y: absent from the JSON, absent again
    assert Curve(curve.points).to_json() == {"points": data["points"], "label": ""}  # made in code: every field
    assert Curve.from_json(curve.to_json()) == curve


@pytest.mark.parametrize("old", [{"format": FORMAT - 1}, {"format": None}, {}])
def test_another_format_version_is_refused_in_one_line(old, tmp_path):
    report = {k: v for k, v in example_report().items() if k != "format"} | old
    for read in (check_format, render_html, read_claims, summary_lines, lambda r: write_report(r, tmp_path / "o")):
        with pytest.raises(ValueError) as err:
            read(report)
        message = str(err.value)
        assert "\n" not in message and f"reads format {FORMAT}" in message, message
        assert "rebuild it: headcount report --model example --force" in message, message
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------- NotApplicable vs. a real bug
@pytest.fixture(scope="module")
def tiny():
    model = tiny_byte_decoder(max_position=128)
    model.name = "tiny"
    return model


def _collect(model, tmp_path, only):
    return collect(model, None, only=only, progress=False, cache=ResultCache(tmp_path, enabled=False),
                   results_dir=None)


def test_a_section_that_does_not_apply_is_unavailable_with_its_reason(tiny, tmp_path, monkeypatch):
    def not_here(ctx):
        raise NotApplicable("ranks need   a window\nlonger than this model's context")
    monkeypatch.setattr(rank_measure, "step", not_here)
    r = _collect(tiny, tmp_path, ("shape", "rank"))
    assert r["rank"] is None and r["unavailable"]["rank"] == "ranks need a window longer than this model's context"
    assert next(c for c in r["claims"] if c["id"] == "C9")["status"] == "not measured"
    assert "not available" in render_html(r)


def test_a_model_with_one_kv_head_has_no_kv_merge(tiny, tmp_path):
    mqa = type(tiny)(replace(tiny.config, n_kv_heads=1)).eval()
    mqa.tokenizer, mqa.name = tiny.tokenizer, "tiny-mqa"
    assert all(layer.attn.n_kv_heads == 1 for layer in mqa.layers)
    r = _collect(mqa, tmp_path, ("shape", "kv_merge"))
    assert "kv_merge" not in r and "already has one KV head per layer" in r["unavailable"]["kv_merge"]


@pytest.mark.parametrize("error", [TypeError("a bug"), KeyError("order"), ValueError("bad"), ImportError("gone"),
                                   AttributeError("renamed")])
def test_any_other_exception_fails_the_report(error, tiny, tmp_path, monkeypatch):
    def broken(ctx):
        raise error
    monkeypatch.setattr(rank_measure, "step", broken)
    with pytest.raises(type(error)):
        _collect(tiny, tmp_path, ("shape", "rank"))


def test_the_report_calls_analysis_with_keywords_it_takes(tiny, tmp_path, monkeypatch):
    """A keyword the analysis does not take is a TypeError (nothing is dropped on the way): rank given one."""
    real = rank_measure.rank

    def strict(model, texts=None, *, max_windows, seed, progress):
        return real(model, texts, max_windows=max_windows, seed=seed, progress=progress)
    monkeypatch.setattr(rank_measure, "rank", strict)
    assert _collect(tiny, tmp_path, ("shape", "rank"))["rank"]["summary"]
    monkeypatch.setattr(rank_measure, "rank", lambda model, texts=None, *, seed: pytest.fail("called"))
    with pytest.raises(TypeError, match="max_windows"):
        _collect(tiny, tmp_path, ("shape", "rank"))


def test_every_measure_step_has_its_typed_section(tiny):
    """The measure modules' wiring: each step's name is a typed field of ReportData (the shape step gives `shape` and
    `accounts`; the experiments gather under `experiments`), so no section reaches the page untyped."""
    from dataclasses import fields as dc_fields

    from headcount.report.collect import QUICK
    from headcount.report.steps import MEASURES, Context, report_steps

    ctx = Context.build(tiny, None, seed=0, sizes=QUICK, sample=None, progress=False, results_dir=None,
                        timings=None, weights="w")
    typed = {f.name for f in dc_fields(ReportData)}
    names = [s.name for s in report_steps(ctx)]
    assert len(names) == len(set(names))
    for name in names:
        key = "experiments" if name.startswith("experiment-") else name
        assert key in typed, name
    assert {"shape", "accounts"} <= typed
    assert [m.NAME for m in MEASURES] == [n for n in dict.fromkeys(
        "experiments" if n.startswith("experiment-") else n for n in names)]
