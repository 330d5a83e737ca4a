"""ModelShape: everything the three accounts and the KV cache need to know about a model.

Built from a preset (presets.py), from a transformers config.json (`from_config`), or from flags that
override any field (`override`). Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("decoder", "encoder", "encoder-decoder")
MLPS = ("gelu", "gated")  # gelu: up, down (2 matrices); gated: gate, up, down (3 matrices; SwiGLU)
NORMS = ("layernorm", "rmsnorm")  # layernorm: weight + bias; rmsnorm: weight only
POSITIONS = ("learned", "rotary", "sinusoidal", "none")  # only "learned" has parameters

# Bytes per element. Canonical names first; the rest are aliases.
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "fp64": 8}
_DTYPE_ALIASES = {
    "float32": "fp32", "f32": "fp32", "float": "fp32",
    "float16": "fp16", "f16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8", "f8": "fp8", "e4m3": "fp8", "e5m2": "fp8",
    "float64": "fp64", "f64": "fp64", "double": "fp64",
}


class CostError(ValueError):
    """Bad input to the cost accounts: the message is one line that names the problem."""


def parse_dtype(name: str) -> tuple[str, int]:
    """'bf16' / 'bfloat16' / 'torch.float16' ... -> (canonical name, bytes per element)."""
    if not isinstance(name, str):
        raise CostError(f"dtype: expected a name such as fp16, bf16 or fp32, got {name!r}")
    key = name.strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise CostError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    return key, DTYPES[key]


def _check_int(name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CostError(f"{name}: expected a whole number, got {value!r}")
    if value < minimum:
        what = "a positive" if minimum == 1 else f"a number >= {minimum}, not a negative"
        raise CostError(f"{name}: expected {what} size, got {value}")
    return value


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise CostError(f"{name}: expected true or false, got {value!r}")
    return value


def _check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise CostError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelShape:
    """A transformer's shape, as far as parameters, FLOPs and memory are concerned.

    head_dim None = d_model // n_heads (must divide); given, n_heads * head_dim may differ from
    d_model (GPT-3 XL, Mistral NeMo) and W_O maps n_heads * head_dim back to d_model.
    n_kv_heads None = n_heads (MHA); 1 = MQA; a divisor of n_heads = GQA.
    n_layers: blocks in the stack; for arch="encoder-decoder" each of the two stacks has n_layers
    (Vaswani et al.'s N), and every decoder block also has a cross-attention.
    d_ff None = 4 * d_model. o_bias / mlp_bias None = attn_bias.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    n_layers: int = 1
    d_ff: int | None = None
    mlp: str = "gelu"
    vocab_size: int = 0
    tied_embeddings: bool = True
    position: str = "none"
    max_positions: int = 0  # rows of a learned position table; otherwise the context window (0 = unknown)
    type_vocab_size: int = 0  # BERT's token-type embeddings
    attn_bias: bool = False  # bias on Q, K, V
    o_bias: bool | None = None  # bias on W_O
    mlp_bias: bool | None = None
    norm: str = "layernorm"
    embedding_norm: bool = False  # a norm right after the embeddings (BERT)
    final_norm: bool = False  # a norm after the last block (pre-norm decoders)
    pooler: bool = False  # BERT's pooler: a d_model x d_model dense layer with bias
    arch: str = "decoder"
    name: str = "custom"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _check_int("d_model", self.d_model)
        _check_int("n_heads", self.n_heads)
        n_kv = self.n_heads if self.n_kv_heads is None else _check_int("n_kv_heads", self.n_kv_heads)
        if n_kv > self.n_heads:
            raise CostError(f"n_kv_heads: {n_kv} KV heads is more than the {self.n_heads} query heads")
        if self.n_heads % n_kv:
            raise CostError(f"n_kv_heads: {n_kv} KV heads do not divide {self.n_heads} query heads "
                            "(each group of query heads shares one KV head)")
        set_(self, "n_kv_heads", n_kv)
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise CostError(f"n_heads: {self.n_heads} heads do not divide d_model {self.d_model}; "
                                "give head_dim to decouple them")
            set_(self, "head_dim", self.d_model // self.n_heads)
        else:
            _check_int("head_dim", self.head_dim)
        _check_int("n_layers", self.n_layers)
        set_(self, "d_ff", 4 * self.d_model if self.d_ff is None else _check_int("d_ff", self.d_ff))
        _check_choice("mlp", self.mlp, MLPS)
        _check_int("vocab_size", self.vocab_size, minimum=0)
        _check_bool("tied_embeddings", self.tied_embeddings)
        _check_choice("position", self.position, POSITIONS)
        _check_int("max_positions", self.max_positions, minimum=0)
        if self.position == "learned" and self.max_positions == 0:
            raise CostError("max_positions: a learned position table needs its number of rows (max_positions > 0)")
        _check_int("type_vocab_size", self.type_vocab_size, minimum=0)
        _check_bool("attn_bias", self.attn_bias)
        set_(self, "o_bias", self.attn_bias if self.o_bias is None else _check_bool("o_bias", self.o_bias))
        set_(self, "mlp_bias", self.attn_bias if self.mlp_bias is None else _check_bool("mlp_bias", self.mlp_bias))
        _check_choice("norm", self.norm, NORMS)
        for flag in ("embedding_norm", "final_norm", "pooler"):
            _check_bool(flag, getattr(self, flag))
        _check_choice("arch", self.arch, ARCHS)
        if not isinstance(self.name, str) or not self.name:
            raise CostError(f"name: expected a non-empty string, got {self.name!r}")

    # ------------------------------------------------------------------------------------- derived
    @property
    def attn_width(self) -> int:
        """n_heads * head_dim: the width Q and the concatenated heads have (W_O's input)."""
        return self.n_heads * self.head_dim

    @property
    def head_dim_decoupled(self) -> bool:
        return self.attn_width != self.d_model

    @property
    def attention_kind(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def n_blocks(self) -> int:
        """Transformer blocks in the whole model (both stacks for an encoder-decoder)."""
        return 2 * self.n_layers if self.arch == "encoder-decoder" else self.n_layers

    @property
    def n_attention_modules(self) -> int:
        """Attention modules in the whole model: one per block, plus a cross-attention per decoder block."""
        return 3 * self.n_layers if self.arch == "encoder-decoder" else self.n_layers

    @property
    def has_lm_head(self) -> bool:
        return self.arch != "encoder" and self.vocab_size > 0

    def replace(self, **changes) -> "ModelShape":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


def override(shape: ModelShape, **changes) -> ModelShape:
    """A copy of `shape` with the given fields changed (None values are ignored).

    The chapter's convention d_model = n_heads * head_dim is kept: changing n_heads or d_model without
    head_dim re-derives head_dim = d_model // n_heads. An MHA shape stays MHA when n_heads changes
    (n_kv_heads follows) unless n_kv_heads is given.
    """
    changes = {k: v for k, v in changes.items() if v is not None}
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise CostError(f"unknown shape field(s): {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    if not changes:
        return shape
    if ("n_heads" in changes or "d_model" in changes) and "head_dim" not in changes:
        changes["head_dim"] = None
    if "n_heads" in changes and "n_kv_heads" not in changes and shape.n_kv_heads == shape.n_heads:
        changes["n_kv_heads"] = None
    if "d_model" in changes and "d_ff" not in changes and shape.d_ff == 4 * shape.d_model:
        changes["d_ff"] = None  # a default 4 * d_model MLP follows d_model
    return dataclasses.replace(shape, **changes)


# ----------------------------------------------------------------------------------- config.json
# model_type -> the parts of the shape a config.json does not spell out.
_DECODER_GATED = dict(arch="decoder", mlp="gated", norm="rmsnorm", position="rotary", final_norm=True,
                      attn_bias=False, mlp_bias=False, tied=False)
_FAMILIES: dict[str, dict] = {
    "llama": _DECODER_GATED,
    "mistral": _DECODER_GATED,
    "mixtral": None,  # mixture of experts: not a dense MLP, refused below
    "qwen2": dict(_DECODER_GATED, attn_bias=True, o_bias=False),  # bias on Q, K, V only
    "qwen3": _DECODER_GATED,
    "gemma": dict(_DECODER_GATED, tied=True),
    "gemma2": dict(_DECODER_GATED, tied=True),
    "phi3": _DECODER_GATED,
    "olmo": dict(_DECODER_GATED, norm="layernorm"),
    "gpt2": dict(arch="decoder", mlp="gelu", norm="layernorm", position="learned", final_norm=True,
                 attn_bias=True, mlp_bias=True, tied=True),
    "gpt_neox": dict(arch="decoder", mlp="gelu", norm="layernorm", position="rotary", final_norm=True,
                     attn_bias=True, mlp_bias=True, tied=False),
    "bert": dict(arch="encoder", mlp="gelu", norm="layernorm", position="learned", embedding_norm=True,
                 pooler=True, attn_bias=True, mlp_bias=True, tied=True),
    "roberta": dict(arch="encoder", mlp="gelu", norm="layernorm", position="learned", embedding_norm=True,
                    pooler=True, attn_bias=True, mlp_bias=True, tied=True),
}
# key in the shape -> the names config.json files use for it (GPT-2 names second).
_KEYS = {
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_heads": ("num_attention_heads", "n_head", "num_heads"),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "d_ff": ("intermediate_size", "n_inner", "ffn_dim"),
    "max_positions": ("max_position_embeddings", "n_positions"),
}


def _pick(cfg: dict, field: str, where: str, *, required: bool):
    present = [(k, cfg[k]) for k in _KEYS[field] if cfg.get(k) is not None]
    values = {json.dumps(v) for _, v in present}
    if len(values) > 1:
        listed = ", ".join(f"{k}={v}" for k, v in present)
        raise CostError(f"{where}: contradictory keys for {field}: {listed}")
    if not present:
        if required:
            raise CostError(f"{where}: missing key {_KEYS[field][0]} (or {' / '.join(_KEYS[field][1:])})")
        return None
    return present[0][1]


def from_config(path: str | Path) -> ModelShape:
    """A ModelShape from a transformers config.json (Llama/Mistral/Qwen2-style, GPT-2, BERT, ...)."""
    path = Path(path)
    where = str(path)
    if path.is_dir():
        path = path / "config.json"
        where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CostError(f"{where}: no such file") from None
    except OSError as err:
        raise CostError(f"{where}: cannot read it ({err.strerror or err})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise CostError(f"{where}: not valid JSON (line {err.lineno}: {err.msg})") from None
    return shape_from_config_dict(cfg, where=where)


def shape_from_config_dict(cfg, *, where: str = "config.json") -> ModelShape:
    if not isinstance(cfg, dict):
        raise CostError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and not any(
            cfg.get(k) is not None for k in _KEYS["d_model"]):
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model's shape here
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise CostError(f"{where}: model_type should be a string, got {model_type!r}")
    if (model_type in _FAMILIES and _FAMILIES[model_type] is None) or cfg.get("num_local_experts"):
        raise CostError(f"{where}: model_type {model_type!r} is a mixture of experts; only dense MLPs are counted")
    family = _FAMILIES.get(model_type)
    act = cfg.get("hidden_act", cfg.get("activation_function"))
    if family is None:
        if act is None:
            raise CostError(f"{where}: unknown model_type {model_type!r} and no hidden_act to tell the MLP kind; "
                            f"known model types: {', '.join(k for k, v in _FAMILIES.items() if v)}")
        gated = str(act).lower() in ("silu", "swish", "swiglu", "geglu")
        family = _DECODER_GATED if gated else _FAMILIES["gpt_neox"]

    d_model = _pick(cfg, "d_model", where, required=True)
    n_heads = _pick(cfg, "n_heads", where, required=True)
    n_layers = _pick(cfg, "n_layers", where, required=True)
    d_ff = _pick(cfg, "d_ff", where, required=family["mlp"] == "gated")
    max_positions = _pick(cfg, "max_positions", where, required=False)
    vocab = cfg.get("vocab_size")
    if vocab is None:
        raise CostError(f"{where}: missing key vocab_size")
    for key, value in (("hidden_size", d_model), ("num_attention_heads", n_heads), ("num_hidden_layers", n_layers),
                       ("vocab_size", vocab)):
        _check_int(f"{where}: {key}", value)
    n_kv = cfg.get("num_key_value_heads")
    if n_kv is not None:
        _check_int(f"{where}: num_key_value_heads", n_kv)
        if n_kv > n_heads or n_heads % n_kv:
            raise CostError(f"{where}: num_key_value_heads {n_kv} does not divide num_attention_heads {n_heads}")
    head_dim = cfg.get("head_dim")
    if head_dim is not None:
        _check_int(f"{where}: head_dim", head_dim)
    elif d_model % n_heads:
        raise CostError(f"{where}: num_attention_heads {n_heads} does not divide hidden_size {d_model} "
                        "and there is no head_dim")
    if family["position"] == "learned" and not max_positions:
        raise CostError(f"{where}: missing key {_KEYS['max_positions'][0]} (the learned position table's rows)")
    tied = cfg.get("tie_word_embeddings", family["tied"])
    if not isinstance(tied, bool):
        raise CostError(f"{where}: tie_word_embeddings should be true or false, got {tied!r}")
    # Llama's attention_bias covers Q, K, V and O; without it the family decides (Qwen2: Q, K, V only).
    attn_bias = cfg.get("attention_bias", family["attn_bias"])
    o_bias = attn_bias if "attention_bias" in cfg else family.get("o_bias")
    mlp_bias = cfg.get("mlp_bias", family["mlp_bias"])
    try:
        return ModelShape(
            d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, n_layers=n_layers, d_ff=d_ff,
            mlp=family["mlp"], vocab_size=vocab, tied_embeddings=tied, position=family["position"],
            max_positions=max_positions or 0, type_vocab_size=cfg.get("type_vocab_size", 0) or 0,
            attn_bias=attn_bias, o_bias=o_bias, mlp_bias=mlp_bias, norm=family["norm"],
            embedding_norm=family.get("embedding_norm", False), final_norm=family.get("final_norm", False),
            pooler=family.get("pooler", False), arch=family["arch"],
            name=str(cfg.get("_name_or_path") or model_type or Path(where).parent.name or "config.json"),
        )
    except CostError as err:
        raise CostError(f"{where}: {err}") from None


def describe(shape: ModelShape) -> str:
    """One line: '32 layers, d_model 4096, 32 query heads x 128 (GQA, 8 KV heads), ...'."""
    kv = f"{shape.attention_kind}, {shape.n_kv_heads} KV head{'s' if shape.n_kv_heads > 1 else ''}"
    decoupled = f" = {shape.attn_width} != d_model" if shape.head_dim_decoupled else ""
    stacks = f"{shape.n_layers}+{shape.n_layers} layers (encoder+decoder)" if shape.arch == "encoder-decoder" \
        else f"{shape.n_layers} layer{'s' if shape.n_layers > 1 else ''} ({shape.arch})"
    return (f"{stacks}, d_model {shape.d_model}, {shape.n_heads} heads x {shape.head_dim}{decoupled} ({kv}), "
            f"d_ff {shape.d_ff} ({shape.mlp}), vocab {shape.vocab_size}")

