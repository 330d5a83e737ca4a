"""The default corpus: prose only, deterministic, calibration and held-out parts disjoint."""

import re
from pathlib import Path

import pytest

from headcount.data import (Corpus, clean_topic, corpus_from_text, default_corpus, read_text)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return default_corpus()


def test_deterministic(corpus):
    again = default_corpus()
    assert again == corpus
    assert again.held_out_text == corpus.held_out_text


def test_both_parts_substantial(corpus):
    cal, held = len(corpus.calibration_text.split()), len(corpus.held_out_text.split())
    assert cal > 10_000 and held > 3_000
    assert 0.1 < held / (cal + held) < 0.4


def test_parts_share_no_topic_and_no_paragraph(corpus):
    assert not {d.name for d in corpus.calibration} & {d.name for d in corpus.held_out}
    cal = {p for d in corpus.calibration for p in d.text.split("\n\n")}
    held = [p for d in corpus.held_out for p in d.text.split("\n\n")]
    assert not cal & set(held)
    assert len(held) == len(set(held))  # no paragraph twice within a part either


def test_no_code_tables_or_headings(corpus):
    text = corpus.calibration_text + "\n\n" + corpus.held_out_text
    assert ">>>" not in text
    assert "::=" not in text
    assert not re.search(r"\+-{3,}\+", text)  # grid tables
    assert not re.search(r"^[=*~-]{4,}$", text, re.M)  # heading underlines
    for para in text.split("\n\n"):
        assert "\n" not in para  # unwrapped paragraphs
        assert len(para.split()) >= 6


def test_clean_topic_keeps_prose_drops_code():
    raw = """Title
*****

This paragraph explains things in plain words and ends with a
full stop.

   for x in range(3):
       print(x)

* A list item that also reads like a sentence, wrapped over
  two lines.

     >>> 1 + 1
     2

+------+------+
| a    | b    |
+------+------+

A long word broken by the wrapper: quote-
delimited strings are joined again.
"""
    paras = clean_topic(raw).split("\n\n")
    assert paras == [
        "This paragraph explains things in plain words and ends with a full stop.",
        "* A list item that also reads like a sentence, wrapped over two lines.",
        "A long word broken by the wrapper: quote-delimited strings are joined again.",
    ]


def test_texts_part_names(corpus):
    assert corpus.texts("held_out") == [d.text for d in corpus.held_out]
    with pytest.raises(ValueError, match="calibration"):
        corpus.texts("test")


def test_corpus_from_text_nonempty_parts():
    text = "\n\n".join(f"Paragraph number {i} says something." for i in range(20))
    c = corpus_from_text(text)
    assert c.calibration and c.held_out
    assert len(c.calibration) + len(c.held_out) == 20
    two = corpus_from_text("One paragraph here.\n\nAnother one there.")
    assert len(two.calibration) == 1 and len(two.held_out) == 1


def test_read_text_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_text(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_text(tmp_path / "bin.txt")
    with pytest.raises(ValueError, match="directory"):
        read_text(tmp_path)
    (tmp_path / "ok.txt").write_text("hello\n")
    assert read_text(tmp_path / "ok.txt") == "hello\n"


def test_package_source_is_the_code_domains_files_verbatim_split_the_same_way():
    """heal's "prose+source" stream reads whole torch / numpy files; a file the held-out "code" domain measures is
    never in its calibration part, and no standard-library file is in it."""
    import importlib.util

    from headcount.data import _held_out, code_corpus, package_source_corpus, source_corpus

    source = package_source_corpus()
    assert source.calibration and all(not _held_out(d.name) for d in source.calibration)
    assert all(_held_out(d.name) for d in source.held_out)
    held_code = {d.name for d in code_corpus().held_out}
    assert held_code and not held_code & {d.name for d in source.calibration}
    doc = source.calibration[0]
    package, rel = doc.name.split("/", 1)
    root = Path(next(iter(importlib.util.find_spec(package).submodule_search_locations)))
    assert doc.text == (root / rel).read_text(encoding="utf-8")  # verbatim: the file as it is on disk
    assert "def " in doc.text
    stdlib = {d.text for d in source_corpus().held_out}
    assert not stdlib & {d.text for d in source.calibration}
