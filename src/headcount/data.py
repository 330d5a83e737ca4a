"""The default corpus: English prose that every Python installation carries.

``pydoc_data.topics`` holds the language reference topics that ``help()`` prints (about 80 topics,
~460 kB of text, rendered from reStructuredText). `default_corpus()` keeps the prose paragraphs
and drops what is not prose: section headings, grammar productions (``::=``), interactive
examples (``>>>``), tables (``+---+`` grids and ``===`` simple tables) and indented code blocks.

The split is deterministic and by topic, so no topic contributes to both parts: a topic goes to
the held-out part when ``zlib.crc32(name) % 5 == 0`` (about one topic in five), to the
calibration part otherwise. Calibration text is for choosing things (scoring heads); held-out text
is for measuring quality, so no result is measured on the data that chose it. Hashing the name
(rather than counting positions) keeps a topic's side fixed when a Python release adds topics;
the text itself follows the running interpreter's documentation.

Nothing here imports torch.
"""

from __future__ import annotations

import functools
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from headcount.arguments import one_of

__all__ = ["Corpus", "Document", "default_corpus", "corpus_from_text", "read_text", "clean_topic", "code_corpus",
           "source_corpus", "package_source_corpus", "held_out_domains", "function_stubs"]

HELD_OUT_MODULUS = 5  # one topic (or paragraph) in five is held out

_HEADING_CHARS = set("*=-~^+#")
_BULLET = re.compile(r"^(\*|-|\d+\.|#\.|\([0-9a-z]+\))\s+")
_TABLE_LINE = re.compile(r"^\s*(\+[-=+]+\+?|\|.*|[=\s]{3,}|[-\s]{3,})$")


@dataclass(frozen=True)
class Document:
    """One topic (or one paragraph of a user's file) after cleaning."""

    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Calibration and held-out documents; the two never share a document."""

    calibration: tuple[Document, ...]
    held_out: tuple[Document, ...]

    @property
    def calibration_text(self) -> str:
        return "\n\n".join(d.text for d in self.calibration)

    @property
    def held_out_text(self) -> str:
        return "\n\n".join(d.text for d in self.held_out)

    def texts(self, part: str) -> list[str]:
        """The documents' texts of one part: ``"calibration"`` or ``"held_out"``."""
        one_of("part", part, ("calibration", "held_out"), expected="'calibration' or 'held_out'")
        return [d.text for d in getattr(self, part)]


def _unwrap(lines: list[str]) -> str:
    """Join wrapped lines; a line broken after a hyphen ("quote-" / "delimited") rejoins whole."""
    out = ""
    for line in lines:
        part = line.strip()
        if not out:
            out = part
        elif re.search(r"[A-Za-z]-$", out):
            out += part
        else:
            out += " " + part
    return re.sub(r"\s+", " ", out)


def _is_heading(lines: list[str]) -> bool:
    if len(lines) != 2:
        return False
    under = lines[1].strip()
    return len(under) >= 3 and len(set(under)) == 1 and under[0] in _HEADING_CHARS


def _looks_like_code_or_table(lines: list[str]) -> bool:
    for line in lines:
        s = line.strip()
        if s.startswith((">>>", "...")) or "::=" in s or _TABLE_LINE.match(line):
            return True
    return False


_PLAIN_WORD = re.compile(r"^[A-Za-z][a-z]*[,.;:]?$")


def _prose_stats(text: str) -> tuple[int, float, float]:
    """(words, fraction of non-space characters that are letters, fraction of plain words)."""
    words = text.split()
    chars = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in chars)
    plain = sum(bool(_PLAIN_WORD.match(w)) for w in words)
    return len(words), letters / max(1, len(chars)), plain / max(1, len(words))


def _is_prose(text: str, *, strict: bool) -> bool:
    """Sentences, not code: enough words, mostly letters, ending like a sentence."""
    n_words, letter_frac, plain_frac = _prose_stats(text)
    if n_words < 6 or letter_frac < 0.6 or plain_frac < 0.4 or text[-1] not in '.:!?)"”]':
        return False
    if strict:  # a block indented more than its context: prose only on strong evidence
        return text.endswith(".") and letter_frac >= 0.75 and "#" not in text and " = " not in text
    return True


def clean_topic(raw: str) -> str:
    """One ``pydoc_data.topics`` entry -> its prose paragraphs, unwrapped, joined by blank lines.

    Indentation decides first: a paragraph at an indentation its context allows (0, or the text
    column of an enclosing list item or accepted definition) is prose if it reads like sentences;
    a paragraph indented deeper is a code block unless it passes a strict sentence test (that
    keeps the descriptions under method signatures such as ``object.__init__(self[, ...])``).
    """
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in raw.expandtabs(8).splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)

    allowed = [0]  # indentation columns at which prose may sit
    kept: list[str] = []
    for block in blocks:
        if _is_heading(block):
            allowed = [0]
            continue
        indent = len(block[0]) - len(block[0].lstrip())
        if _looks_like_code_or_table(block):
            continue
        text = _unwrap(block)
        bullet = _BULLET.match(block[0].strip())
        if bullet:
            if indent not in allowed and not _is_prose(text, strict=True):
                continue
            allowed = [i for i in allowed if i < indent] + [indent, indent + bullet.end()]
            if _is_prose(text, strict=False):
                kept.append(text)
            continue
        if indent in allowed:
            allowed = [i for i in allowed if i <= indent]
            if _is_prose(text, strict=False):
                kept.append(text)
        elif _is_prose(text, strict=True):
            allowed = [i for i in allowed if i < indent] + [indent]
            kept.append(text)
    return "\n\n".join(kept)


def _held_out(key: str) -> bool:
    return zlib.crc32(key.encode("utf-8")) % HELD_OUT_MODULUS == 0


@functools.lru_cache(maxsize=1)  # deterministic and immutable (frozen, tuples): built once per process
def default_corpus() -> Corpus:
    """The standard library's documentation topics as a calibration / held-out corpus.

    Deterministic for a given Python version: topics sorted by name, cleaned by `clean_topic`,
    split by ``crc32(name) % 5 == 0`` (held out). Several topics repeat whole sections of others
    (``class`` inside ``compound``, ``customization`` inside ``specialnames``), so paragraphs are
    de-duplicated: a paragraph appears once per part, and a paragraph of a held-out topic is
    removed from every calibration topic. Topics left empty are skipped.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions split the stdlib docs into their own package
        raise ValueError("this Python installation has no pydoc_data.topics (the default corpus); "
                         "give a text file instead (--text FILE)") from None

    cleaned = {name: clean_topic(topics[name]).split("\n\n") for name in sorted(topics)}
    held_names = [n for n in cleaned if _held_out(n)]
    cal_names = [n for n in cleaned if not _held_out(n)]

    def build(names: list[str], exclude: set[str]) -> tuple[Document, ...]:
        seen = set(exclude)
        docs = []
        for name in names:
            paras = []
            for p in cleaned[name]:
                if p and p not in seen:
                    seen.add(p)
                    paras.append(p)
            if paras:
                docs.append(Document(name, "\n\n".join(paras)))
        return tuple(docs)

    held_out = build(held_names, set())
    held_paras = {p for d in held_out for p in d.text.split("\n\n")}
    return Corpus(build(cal_names, held_paras), held_out)


def corpus_from_text(text: str, name: str = "text") -> Corpus:
    """Any text standing in for the default corpus (``--text FILE``).

    Paragraphs (separated by blank lines) are split like topics, by ``crc32(paragraph) % 5``;
    when that leaves a side empty and there are at least two paragraphs, the last paragraph is
    held out (or the first is kept for calibration), so both parts are non-empty.
    """
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    docs = [Document(f"{name}:{i}", p) for i, p in enumerate(paragraphs)]
    held = [_held_out(d.text) for d in docs]
    if len(docs) >= 2 and all(held):
        held[0] = False
    elif len(docs) >= 2 and not any(held):
        held[-1] = True
    return Corpus(
        tuple(d for d, h in zip(docs, held) if not h),
        tuple(d for d, h in zip(docs, held) if h),
    )


def read_text(path: str | Path) -> str:
    """A UTF-8 text file's contents, with one clear error when it is missing, binary or empty."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{p}: is a directory, not a text file") from None
    except OSError as e:
        raise ValueError(f"{p}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise ValueError(f"{p}: the file is empty")
    return text


# ------------------------------------------------------------------------------ code-like text
CODE_PACKAGES = (("torch", ("nn", "optim", "utils/data", "distributions")), ("numpy", ("lib", "linalg", "polynomial")))
CODE_MAX_CHARS = 800_000


def _docs_and_comments(source: str) -> str:
    """A Python file's docstrings and comments, in file order, as blank-line separated paragraphs."""
    import ast
    import io
    import tokenize

    pieces: list[tuple[int, str]] = []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and node.body:
                pieces.append((node.body[0].lineno, doc.strip()))
    comment_lines: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith("#!"):
                text = tok.string.lstrip("#").strip()
                if text and not text.startswith(("noqa", "type:", "pragma", "fmt:", "pyre-", "mypy")):
                    comment_lines.append((tok.start[0], text))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    block: list[str] = []
    last = -2
    for line, text in comment_lines + [(10**9, "")]:  # consecutive comment lines form one paragraph
        if line != last + 1 and block:
            pieces.append((last, " ".join(block)))
            block = []
        if text:
            block.append(text)
        last = line
    return "\n\n".join(text for _, text in sorted(pieces))


def _package_files(max_chars: int, read) -> Corpus:
    """One Document per .py file of CODE_PACKAGES' fixed sub-packages (files sorted by path, tests skipped),
    text = read(the file's source), kept when >= 200 chars, about `max_chars` in all (half per package), split
    like topics by ``crc32("package/relative path") % 5 == 0`` (held out), so every reader splits the same files
    the same way."""
    import importlib.util

    docs: list[Document] = []
    for package, subdirs in CODE_PACKAGES:
        total = 0  # each package gets an equal share of max_chars
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for sub in subdirs:
            for path in sorted((root / sub).rglob("*.py")):
                if "test" in path.relative_to(root).as_posix():
                    continue
                try:
                    text = read(path.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError):
                    continue
                if len(text) < 200:
                    continue
                name = f"{package}/{path.relative_to(root).as_posix()}"
                docs.append(Document(name, text))
                total += len(text)
                if total >= max_chars // len(CODE_PACKAGES):
                    break
            if total >= max_chars // len(CODE_PACKAGES):
                break
    if not docs:
        raise ValueError("code_corpus: neither torch nor numpy sources were found")
    return Corpus(tuple(d for d in docs if not _held_out(d.name)), tuple(d for d in docs if _held_out(d.name)))


@functools.lru_cache(maxsize=4)  # deterministic for the installed files and immutable: read once per process
def code_corpus(max_chars: int = CODE_MAX_CHARS) -> Corpus:
    """Code-like text from another domain than the default corpus: the docstrings and comments of the
    installed torch and numpy sources (fixed sub-packages, files sorted by path), one document per
    file, split like topics (``crc32(relative path) % 5 == 0`` held out), about `max_chars` in all
    (half per package).
    Deterministic for given installed versions. Found with importlib (the packages are not imported)."""
    return _package_files(max_chars, _docs_and_comments)


@functools.lru_cache(maxsize=4)  # deterministic for the installed files and immutable: read once per process
def package_source_corpus(max_chars: int = CODE_MAX_CHARS) -> Corpus:
    """The same torch / numpy files as code_corpus, verbatim (code, docstrings and comments), split by the same
    rule: a file held out of code_corpus is held out here, so calibrating on this corpus's calibration part never
    reads a file the held-out "code" domain measures. No standard-library file is in it (the "source" domain)."""
    return _package_files(max_chars, lambda source: source)


STUB_DOC_CHARS = 800  # a stub's docstring is cut at a paragraph break before this: torch's run to pages
STUB_MIN_DOC = 40  # shorter docstrings ("Alias for x.") say too little to be asked to implement


def _indented(doc: str) -> str:
    """A cleaned docstring's lines after the first, indented for a function body (blank lines left blank)."""
    first, *rest = doc.split("\n")
    return "\n".join([first] + [f"    {line}" if line.strip() else "" for line in rest])


@functools.lru_cache(maxsize=4)  # deterministic for the installed files and immutable: built once per process
def function_stubs(part: str = "calibration", max_doc_chars: int = STUB_DOC_CHARS) -> tuple[str, ...]:
    """Python function stubs (signature + docstring, no body: the shape of a HumanEval prompt) of every public
    function and method with a docstring of at least STUB_MIN_DOC characters in that part of
    package_source_corpus, in file order. Decorators are dropped; a docstring is cut at the last paragraph break
    before `max_doc_chars`. A file that does not parse on its own is skipped. The calibration part holds no
    held-out file and no standard-library one, so no held-out domain and no eval problem reaches a stub."""
    import ast
    import copy

    one_of("part", part, ("calibration", "held_out"))
    stubs: list[str] = []
    for text in package_source_corpus().texts(part):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < STUB_MIN_DOC:
                continue
            if len(doc) > max_doc_chars:
                cut = doc.rfind("\n\n", 0, max_doc_chars)
                doc = doc[:cut if cut > 0 else max_doc_chars].rstrip()
            stub = copy.copy(node)  # the signature as it stands; the docstring re-indented under it
            stub.decorator_list, stub.body = [], [ast.Expr(ast.Constant(_indented(doc) + "\n    "))]
            stubs.append(ast.unparse(stub))
    return tuple(stubs)


# ------------------------------------------------------------------ a domain nothing calibrates on
# Python source code (code, comments and docstrings verbatim) of standard-library modules that no other
# corpus here reads. The WHOLE domain is held out: no calibration part, and no default, order, ridge or
# fraction in the project is chosen on it. It answers "does an edit calibrated on our text hold on text
# nobody calibrated on?"
SOURCE_MODULES = ("argparse", "configparser", "csv", "difflib", "email._header_value_parser", "http.client",
                  "logging.__init__", "shutil", "tarfile", "textwrap", "zipfile.__init__", "fractions")
SOURCE_MAX_CHARS = 600_000


@functools.lru_cache(maxsize=4)  # deterministic for the installed files and immutable: read once per process
def source_corpus(max_chars: int = SOURCE_MAX_CHARS) -> Corpus:
    """Standard-library Python source as one held-out domain: Corpus(calibration=(), held_out=files).

    One document per module of SOURCE_MODULES (found by path under the running interpreter's stdlib,
    never imported), each file's text as it is, blank-line runs kept, at most `max_chars` in all.
    Deterministic for a given Python version."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[Document] = []
    total = 0
    for module in SOURCE_MODULES:
        parts = module.split(".")
        path = root.joinpath(*parts[:-1], parts[-1] + ".py") if parts[-1] != "__init__" else \
            root.joinpath(*parts[:-1], "__init__.py")
        if not path.is_file():
            path = root.joinpath(*parts, "__init__.py")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        text = text[: max(0, max_chars - total)]
        if len(text) < 200:
            continue
        docs.append(Document(module, text))
        total += len(text)
        if total >= max_chars:
            break
    if not docs:
        raise ValueError(f"source_corpus: no standard-library source found under {root}")
    return Corpus((), tuple(docs))


def held_out_domains() -> dict[str, list[str]]:
    """The three held-out texts every edit reports: {"prose": the default corpus's held-out topics,
    "code": held-out torch / numpy docstrings and comments, "source": standard-library Python source, a
    domain no calibration and no choice ever sees}."""
    return {"prose": default_corpus().texts("held_out"), "code": code_corpus().texts("held_out"),
            "source": source_corpus().texts("held_out")}
