"""headcount's own saved-model format: a model whose layers may have different heads, reloaded exactly.

A transformers checkpoint says "n_heads query heads in every layer"; a pruned or merged model may
keep 7 heads here and 5 there, in uneven GQA groups. This format records each layer's layout:

    DIR/headcount.json      {"format": "headcount", "version": 1, "kind": "decoder" | "encoder",
                             "config": DecoderConfig / EncoderConfig fields (the ORIGINAL shape),
                             "layers": [{"n_heads", "n_kv_heads", "kv_head_of", "kept_heads",
                                         "qkv_bias", "o_bias"} | {"dropped": true}, ...],
                             "tokenizer": {"bos_token_id", "eos_token_id", "pad_token_id",
                                           "add_special_tokens"} | null, "name", "tensors": count,
                             "healing": {"teacher", "steps", "tokens", "moved", ...} (a healed model only)}
    DIR/model.safetensors   the model's state_dict (a tied lm_head is stored once, as embed.weight)
    DIR/tokenizer.json      the tokenizer (written from the live one, so GGUF-born tokenizers travel)

`write(model, dir, force=False)`: written into a temporary sibling directory, then renamed, so DIR
is either absent, the old one, or complete. `read(dir)`: builds the model, checks every tensor's name
and shape against the layout, and says which layer and tensor disagree. Nothing is unpickled.
`headcount.models.load(dir)` routes here when DIR holds a headcount.json.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from headcount.attention import MultiHeadAttention
from headcount.models.dropped import is_dropped
from headcount.models.formats.errors import CheckpointError
from headcount.models.formats.tensors import SafetensorsFile, no_init
from headcount.models.chat import CHAT_TEMPLATE_FILE, read_chat_template
from headcount.models.formats.gguf import chat_template

FORMAT, VERSION = "headcount", 1
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "headcount.json", "model.safetensors", "tokenizer.json"


def is_saved(directory: str | Path) -> bool:
    """True when `directory` holds a headcount save (its headcount.json)."""
    return (Path(directory) / CONFIG_FILE).is_file()


# ------------------------------------------------------------------------------------------ layout
def layer_layout(attn: MultiHeadAttention) -> dict:
    """The per-layer facts a reload needs (JSON-ready); {"dropped": true} for a layer whose attention sublayer
    was dropped (models/dropped.py: no heads, no attention tensors, no attention norms)."""
    if is_dropped(attn):
        return {"dropped": True}
    return {"n_heads": attn.n_heads, "n_kv_heads": attn.n_kv_heads, "kv_head_of": list(attn.kv_head_of),
            "kept_heads": list(attn.kept_heads), "qkv_bias": attn.qkv_proj.bias is not None,
            "o_bias": attn.o_proj.bias is not None}


def _layout_error(source: str, i: int, msg: str) -> CheckpointError:
    return CheckpointError(f"{source}: layer {i}: {msg}")


def attention_from_layout(layout: dict, *, d_model: int, head_dim: int, source: str, index: int,
                          dtype=None, **attention_kwargs) -> MultiHeadAttention:
    """A MultiHeadAttention with exactly this layout (weights uninitialised).

    Uniform groups are built directly. Uneven groups (what pruning leaves) are built the way they
    arose: a module with n_kv_heads groups of the largest group size, then prune_heads removes the
    surplus query heads, so kv_head_of (and the kernels' kv_index) come out as the pruner made them.
    attention_kwargs: what the layer's attention gets beyond its heads (DecoderConfig.attention_kwargs(i):
    softmax_scale, qk_norm_eps, sliding_window), so q/k norms and windows survive a reload.
    """
    try:
        nh, nkv = int(layout["n_heads"]), int(layout["n_kv_heads"])
        kv_of = [int(k) for k in layout["kv_head_of"]]
        kept = [int(k) for k in layout["kept_heads"]]
        qkv_bias, o_bias = bool(layout["qkv_bias"]), bool(layout["o_bias"])
    except (KeyError, TypeError, ValueError) as e:
        raise _layout_error(source, index, f"malformed layout {layout!r} ({e.__class__.__name__}: {e})") from None
    if nh < 1 or nkv < 1:
        raise _layout_error(source, index, f"n_heads={nh}, n_kv_heads={nkv}: both must be positive")
    if len(kv_of) != nh or len(kept) != nh:
        raise _layout_error(source, index, f"n_heads={nh} but kv_head_of has {len(kv_of)} entries and kept_heads "
                                           f"{len(kept)}")
    if sorted(set(kv_of)) != list(range(nkv)):
        raise _layout_error(source, index, f"kv_head_of={kv_of} does not use exactly the KV heads 0..{nkv - 1} "
                                           f"(n_kv_heads={nkv})")
    if len(set(kept)) != nh:
        raise _layout_error(source, index, f"kept_heads={kept} has duplicates")
    uniform = nh % nkv == 0 and all(k == i // (nh // nkv) for i, k in enumerate(kv_of))
    factory = {"dtype": dtype, **attention_kwargs}
    if uniform:
        attn = MultiHeadAttention(d_model, nh, n_kv_heads=nkv, head_dim=head_dim, bias=qkv_bias, o_bias=o_bias,
                                  **factory)
    else:
        if any(b < a for a, b in zip(kv_of, kv_of[1:])):
            raise _layout_error(source, index, f"kv_head_of={kv_of} is not in group order; headcount cannot build it")
        size = max(kv_of.count(k) for k in range(nkv))
        attn = MultiHeadAttention(d_model, nkv * size, n_kv_heads=nkv, head_dim=head_dim, bias=qkv_bias,
                                  o_bias=o_bias, **factory)
        keep = [k * size + kv_of[:i].count(k) for i, k in enumerate(kv_of)]  # slot j of group k
        attn.prune_heads([h for h in range(nkv * size) if h not in set(keep)])
        if list(attn.kv_head_of) != kv_of:  # cannot happen for a group-ordered map; a guard, not a path
            raise _layout_error(source, index, f"rebuilt kv_head_of {attn.kv_head_of} != saved {kv_of}")
    attn.kept_heads = tuple(kept)
    return attn


# ------------------------------------------------------------------------------------------ write
def _config_dict(model) -> tuple[str, dict]:
    from headcount.models.encoder import Encoder

    if isinstance(model, Encoder):
        return "encoder", model.config.to_dict()
    return ("decoder" if getattr(model.config, "causal", True) else "bidirectional"), model.config.to_dict()


def _tensors(model) -> dict[str, torch.Tensor]:
    """The state dict, each tensor once (a tied lm_head shares embed.weight's storage)."""
    out, seen = {}, {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), t.dtype) if t.numel() else None
        if key is not None and key in seen:
            continue  # tied: rebuilt by the model's constructor
        if key is not None:
            seen[key] = name
        out[name] = t.detach()  # no copy: write_safetensors writes one tensor at a time
    return out


def write(model, directory: str | Path, *, force: bool = False) -> Path:
    """Save `model` (a headcount Decoder / Encoder, pruned or not) to `directory`; see the module doc."""
    from headcount.models.formats.tensors import write_safetensors

    directory = Path(directory).expanduser()
    if directory.exists() and not force:
        raise ValueError(f"out: {directory} already exists; pass force=True (--force) to replace it")
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"out: {directory} exists and is not a directory")
    if not hasattr(model, "layers") or not hasattr(model, "config"):
        raise TypeError(f"model: expected a headcount Decoder or Encoder, got {type(model).__name__}")
    kind, config = _config_dict(model)
    tok = model.tokenizer
    meta = {
        "format": FORMAT, "version": VERSION, "kind": kind, "name": model.name, "config": config,
        # the GGUF file the model came from (export_gguf copies its tokenizer fields), when there is one
        "source_gguf": str(getattr(model, "source_gguf", None) or "") or None,
        "layers": [layer_layout(layer.attn) for layer in model.layers],
        # a healed model's record (surgery.healing): teacher, steps, tokens, what moved; kept through re-saves
        **({"healing": model.healing} if getattr(model, "healing", None) else {}),
        # --eval's pass@1 per task: before the edit, after it, after healing (surgery/task_scores.py)
        **({"tasks": model.task_scores} if getattr(model, "task_scores", None) else {}),
        # merge-kv --budget's plan: the budget, {layer: n_kv_heads} and its predicted loss
        **({"merge_plan": model.merge_plan} if getattr(model, "merge_plan", None) else {}),
        "tokenizer": None if tok is None else {
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id, "add_special_tokens": tok.add_special_tokens},
    }
    tensors = _tensors(model)
    meta["tensors"] = len(tensors)
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=parent))
    try:
        write_safetensors(tmp / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
        if tok is not None:
            tok.backend.save(str(tmp / TOKENIZER_FILE))
            if getattr(tok, "chat_template", None):
                (tmp / CHAT_TEMPLATE_FILE).write_text(tok.chat_template, encoding="utf-8")
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def replace_dir(tmp: Path, directory: Path) -> None:
    """Move the finished `tmp` into place; an existing `directory` (force) is swapped out first."""
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, directory)


# ------------------------------------------------------------------------------------------- read
def read_meta(directory: str | Path) -> dict:
    path = Path(directory) / CONFIG_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (not a headcount save)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a headcount save (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{path}: version {meta.get('version')!r}; this headcount reads version {VERSION}")
    for key in ("kind", "config", "layers"):
        if key not in meta:
            raise CheckpointError(f"{path}: no {key!r}")
    return meta


def read(directory: str | Path, *, dtype: torch.dtype = torch.float32):
    """A headcount save -> the model (eval mode, with its tokenizer), exactly as it was written."""
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.models.encoder import Encoder, EncoderConfig
    from headcount.models.tokenizer import Tokenizer

    directory = Path(directory).expanduser()
    meta = read_meta(directory)
    source = str(directory / CONFIG_FILE)
    kind = meta["kind"]
    try:
        if kind == "decoder":
            cfg = DecoderConfig(**meta["config"])
            with no_init():
                model = Decoder(cfg, dtype=dtype)
        elif kind == "encoder":
            cfg = EncoderConfig(**meta["config"])
            with no_init():
                model = Encoder(cfg, dtype=dtype)
        elif kind == "bidirectional":  # a decoder's stack without the causal mask (EmbeddingGemma)
            from headcount.models.encoder import BidirectionalEncoder
            cfg = DecoderConfig(**meta["config"])
            with no_init():
                model = BidirectionalEncoder(cfg, dtype=dtype)
        else:
            raise CheckpointError(f"{source}: kind {kind!r}; expected 'decoder', 'bidirectional' or 'encoder'")
    except TypeError as e:
        raise CheckpointError(f"{source}: config does not fit a {kind} ({e})") from None
    layers = meta["layers"]
    if not isinstance(layers, list) or len(layers) != cfg.n_layers:
        raise CheckpointError(f"{source}: config says n_layers={cfg.n_layers}, 'layers' has "
                              f"{len(layers) if isinstance(layers, list) else type(layers).__name__}")
    with no_init():
        for i, (layer, layout) in enumerate(zip(model.layers, layers)):
            if isinstance(layout, dict) and layout.get("dropped") is True:
                if not hasattr(layer, "drop_attention"):
                    raise CheckpointError(f"{source}: layer {i}: dropped attention in a {kind}; only decoder "
                                          "layers can drop theirs")
                layer.drop_attention()
                continue
            extra = cfg.attention_kwargs(i) if hasattr(cfg, "attention_kwargs") else {}
            old = layer.attn
            layer.attn = attention_from_layout(layout, d_model=cfg.d_model, head_dim=_head_dim(cfg), source=source,
                                               index=i, dtype=dtype, **extra)
            for name in ("q_norm", "k_norm"):  # the norm's rounding order (Qwen3 vs Gemma) as the model built it
                if getattr(old, name, None) is not None:
                    getattr(layer.attn, name).cast_before_weight = getattr(old, name).cast_before_weight
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    tensors = SafetensorsFile(weights)  # one tensor at a time: never a second copy of the weights
    _assign_checked(model, tensors, str(weights), layers)
    tok_meta = meta.get("tokenizer")
    tok_path = directory / TOKENIZER_FILE
    if tok_meta is not None:
        if not tok_path.is_file():
            raise CheckpointError(f"{tok_path}: missing ({CONFIG_FILE} records a tokenizer)")
        model.tokenizer = Tokenizer.from_file(tok_path, **tok_meta)
        source = meta.get("source_gguf")
        model.tokenizer.chat_template = (read_chat_template(directory)
                                         or (chat_template(source) if source else None))
    model.name = str(directory)
    if meta.get("source_gguf"):
        model.source_gguf = Path(meta["source_gguf"])
    if meta.get("healing"):
        model.healing = meta["healing"]
    if meta.get("tasks"):
        model.task_scores = meta["tasks"]
    return model.eval()


def _head_dim(cfg) -> int:
    return cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.d_model // cfg.n_heads


def _assign_checked(model: nn.Module, tensors: SafetensorsFile, source: str, layers: list) -> None:
    params = dict(model.named_parameters())
    buffers = {n: b for n, b in model.named_buffers() if b is not None}
    expected = {**params, **{n: b for n, b in buffers.items() if n in model.state_dict()}}
    tied = {n for n in expected if n == "lm_head.weight" and getattr(model.config, "tie_embeddings", False)}
    missing = sorted(set(expected) - set(tensors) - tied)
    unexpected = sorted(set(tensors) - set(expected))
    for name in missing + unexpected:
        raise CheckpointError(_disagreement(source, name, layers, missing=name in missing))
    for name in tensors:  # every shape and dtype from the header, before any weight is read
        target = expected[name]
        if tensors.shape(name) != tuple(target.shape):
            raise CheckpointError(_disagreement(source, name, layers, got=list(tensors.shape(name)),
                                                want=list(target.shape)))
        if tensors.entries[name]["dtype"] not in ("F64", "F32", "F16", "BF16"):
            raise CheckpointError(f"{source}: tensor {name!r} has dtype {tensors.entries[name]['dtype']}, "
                                  f"expected a float dtype")
    with torch.no_grad():
        for name, value in tensors.items():
            expected[name].data = value.to(dtype=expected[name].dtype).contiguous()  # a fresh read: no copy


def _disagreement(source: str, name: str, layers: list, *, missing: bool = False, got=None, want=None) -> str:
    where = ""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() and int(parts[1]) < len(layers):
        lay = layers[int(parts[1])]
        where = (f" ({CONFIG_FILE} says layer {parts[1]} has n_heads={lay.get('n_heads')}, "
                 f"n_kv_heads={lay.get('n_kv_heads')}, qkv_bias={lay.get('qkv_bias')}, o_bias={lay.get('o_bias')})")
        if lay.get("dropped") is True:
            where = f" ({CONFIG_FILE} says layer {parts[1]}'s attention was dropped)"
    if missing:
        return f"{source}: tensor {name!r} is missing{where}"
    if got is None:
        return f"{source}: unexpected tensor {name!r}{where}"
    return f"{source}: tensor {name!r} has shape {got}, the config expects {want}{where}"


# ------------------------------------------------------------------------------------- writing
def save(model, directory, *, force: bool = False) -> Path:
    """Write `model` (pruned or not) to `directory` in headcount's format (refuses an existing one
    unless force; written to a temporary sibling and renamed). Reload: headcount.models.load(directory)."""
    return write(model, directory, force=force)


def check_out(directory: Path, force: bool) -> None:
    if directory.exists() and not force:
        raise ValueError(f"out: {directory} already exists; pass force=True (--force) to replace it")
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"out: {directory} exists and is not a directory")


def write_dir(directory: Path, files: dict[str, object]) -> Path:
    """files: name -> dict of tensors (.safetensors) | dict (JSON) | callable(path) writer."""
    from headcount.models.formats.tensors import write_safetensors

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        for name, content in files.items():
            if name.endswith(".safetensors"):
                write_safetensors(tmp / name, content, metadata={"format": "pt"})  # one tensor at a time
            elif callable(content):
                content(tmp / name)
            else:
                (tmp / name).write_text(json.dumps(content, indent=2) + "\n")
        replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def tokenizer_writer(model):
    tok = model.tokenizer
    return None if tok is None else (lambda path: tok.backend.save(str(path)))


def chat_template_writer(model):
    """A writer of the model's chat template (chat_template.jinja, as transformers 5 saves it), or None."""
    template = getattr(model.tokenizer, "chat_template", None) if model.tokenizer is not None else None
    return None if not template else (lambda path: Path(path).write_text(template, encoding="utf-8"))
