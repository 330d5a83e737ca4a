"""ModelShape: everything the three accounts and the KV cache need to know about a model.

Built from a preset (presets.py), from a transformers config.json (`from_config`), or from flags that
override any field (`override`). Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from headcount.arguments import boolean, is_int, one_of, positive_int

ARCHS = ("decoder", "encoder", "encoder-decoder")
MLPS = ("gelu", "gated")  # gelu: up, down (2 matrices); gated: gate, up, down (3 matrices; SwiGLU)
NORMS = ("layernorm", "rmsnorm")  # layernorm: weight + bias; rmsnorm: weight only
POSITIONS = ("learned", "rotary", "sinusoidal", "none")  # only "learned" has parameters
# Per-layer attention, spelled as transformers' configs spell it (config.layer_types).
FULL, LOCAL = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, LOCAL)

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
    """A size field: the wrong type ("a whole number") and a value below `minimum` (a size) are told apart."""
    if not is_int(value):
        raise CostError(f"{name}: expected a whole number, got {value!r}")
    what = "a positive" if minimum == 1 else f"a number >= {minimum}, not a negative"
    return positive_int(name, value, minimum, expected=f"{what} size", error=CostError)


_check_bool = functools.partial(boolean, error=CostError)
_check_choice = functools.partial(one_of, error=CostError)


@dataclass(frozen=True)
class ModelShape:
    """A transformer's shape, as far as parameters, FLOPs and memory are concerned.

    head_dim None = d_model // n_heads (must divide); given, n_heads * head_dim may differ from
    d_model (GPT-3 XL, Mistral NeMo) and W_O maps n_heads * head_dim back to d_model.
    n_kv_heads None = n_heads (MHA); 1 = MQA; a divisor of n_heads = GQA.
    n_layers: blocks in the stack; for arch="encoder-decoder" each of the two stacks has n_layers
    (Vaswani et al.'s N), and every decoder block also has a cross-attention.
    d_ff None = 4 * d_model. o_bias / mlp_bias None = attn_bias.
    qk_norm: a norm over each head's query and key (one weight vector of head_dim for Q, one for K,
    shared by the heads: Gemma 3, Qwen3). post_norms: a norm after the attention and after the MLP as
    well as before them (Gemma 2 / 3: 4 norms per block).
    sliding_window: the keys each query of a LOCAL layer sees, itself included (transformers' mask:
    key j visible from query i when i - window < j <= i); None = no local layers. layer_types: one
    entry per layer, "full_attention" (global) or "sliding_attention" (local), as transformers'
    configs carry it; None with a window = every layer local (Mistral 7B v0.1). Windows are causal:
    decoders only. `replace(n_layers=...)` keeps the pattern (its shortest period repeats), and the MoE
    layers' share (moe_layers: all stay all, none stay none, otherwise the share rounded half up).
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
    qk_norm: bool = False  # a norm on each head's q and k: 2 x head_dim weights per attention (shared by heads)
    post_norms: bool = False  # norms after the attention and the MLP too (Gemma 2/3: 4 per block)
    sliding_window: int | None = None  # keys a query of a local layer sees (itself included)
    layer_types: tuple[str, ...] | None = None  # per layer: "full_attention" | "sliding_attention"
    arch: str = "decoder"
    name: str = "custom"
    # mixture of experts: n_experts gated experts of width d_expert per MoE layer, experts_per_token
    # of them active; a router Linear(d_model, n_experts). moe_layers: how many layers have experts (None =
    # all); the others keep the dense MLP of d_ff. attn_sinks: one learned logit per query head (GPT-OSS).
    n_experts: int = 0
    experts_per_token: int = 0
    d_expert: int = 0
    expert_bias: bool = False
    router_bias: bool = False
    moe_layers: int | None = None
    attn_sinks: bool = False
    qk_norm_full: bool = False  # q/k norms over the whole projection: (n_heads + n_kv_heads) x head_dim weights (OLMoE)

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
        for flag in ("embedding_norm", "final_norm", "pooler", "qk_norm", "post_norms"):
            _check_bool(flag, getattr(self, flag))
        _check_choice("arch", self.arch, ARCHS)
        self._check_experts()
        self._check_window()
        if not isinstance(self.name, str) or not self.name:
            raise CostError(f"name: expected a non-empty string, got {self.name!r}")

    def _check_experts(self) -> None:
        set_ = object.__setattr__
        _check_int("n_experts", self.n_experts, minimum=0)
        for flag in ("expert_bias", "router_bias", "attn_sinks", "qk_norm_full"):
            _check_bool(flag, getattr(self, flag))
        if not self.n_experts:
            set_(self, "moe_layers", 0)
            return
        _check_int("experts_per_token", self.experts_per_token)
        if self.experts_per_token > self.n_experts:
            raise CostError(f"experts_per_token: {self.experts_per_token} is more than the {self.n_experts} experts")
        _check_int("d_expert", self.d_expert)
        layers = self.n_layers if self.moe_layers is None else _check_int("moe_layers", self.moe_layers, minimum=0)
        if layers > self.n_layers:
            raise CostError(f"moe_layers: {layers} is more than the {self.n_layers} layers")
        set_(self, "moe_layers", layers)

    def _check_window(self) -> None:
        set_ = object.__setattr__
        w, types = self.sliding_window, self.layer_types
        if w is not None:
            if not is_int(w):
                raise CostError(f"sliding_window: expected a whole number of keys (or none), got {w!r}")
            if w <= 0:
                raise CostError(f"sliding_window: expected a positive number of keys each query of a local layer "
                                f"sees (itself included), got {w}")
        if types is not None:
            if isinstance(types, str) or not isinstance(types, (list, tuple)):
                raise CostError(f"layer_types: expected a list with one of {', '.join(LAYER_TYPES)} per layer, "
                                f"got {types!r}")
            types = tuple(types)
            bad = sorted({str(t) for t in types if t not in LAYER_TYPES})
            if bad:
                raise CostError(f"layer_types: unknown layer type(s) {', '.join(bad)}; known: {', '.join(LAYER_TYPES)}")
            if len(types) != self.n_layers:
                raise CostError(f"layer_types: {len(types)} entries for {self.n_layers} layers (one per layer)")
            if w is None and LOCAL in types:
                raise CostError(f"layer_types: {types.count(LOCAL)} sliding_attention layers but no sliding_window "
                                "(how many keys does a local layer see?)")
        if w is None:
            set_(self, "layer_types", None)  # every layer global: nothing to record
            return
        if self.arch != "decoder":
            raise CostError(f"sliding_window: counted for causal decoders only (arch=decoder), not arch={self.arch}")
        set_(self, "layer_types", types if types is not None else (LOCAL,) * self.n_layers)

    # ------------------------------------------------------------------------------------- derived
    @property
    def local_layers(self) -> int:
        """Layers whose attention is limited to the sliding window."""
        return self.layer_types.count(LOCAL) if self.layer_types else 0

    @property
    def global_layers(self) -> int:
        return self.n_layers - self.local_layers

    def is_local(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == LOCAL

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
        """A copy with `changes`; a new n_layers keeps the local/global pattern (its shortest period repeats)
        and the share of MoE layers (every layer MoE stays every layer: a 1-layer Mixtral is one MoE layer)."""
        n = changes.get("n_layers")
        if is_int(n) and n > 0:
            if "layer_types" not in changes and self.layer_types is not None:
                changes["layer_types"] = repeat_pattern(self.layer_types, n)
            if "moe_layers" not in changes and self.n_experts and "n_experts" not in changes:
                changes["moe_layers"] = min(n, math.floor(self.moe_layers * n / self.n_layers + 0.5))
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


def _period(pattern) -> int:
    n = len(pattern)
    return next(p for p in range(1, n + 1) if all(pattern[i] == pattern[i % p] for i in range(n)))


def repeat_pattern(pattern, n_layers: int) -> tuple[str, ...]:
    """The pattern's shortest period, repeated (or cut) to n_layers: Gemma 3's 5 local + 1 global stays so."""
    p = _period(pattern)
    return tuple(pattern[i % p] for i in range(n_layers))


def global_every(n_layers: int, every: int) -> tuple[str, ...]:
    """layer_types with layer i global when (i + 1) % every == 0 (Gemma 3: every=6; Gemma 2: every=2)."""
    positive_int("global_every", every, expected="a positive whole number (every k-th layer global)", error=CostError)
    return tuple(FULL if (i + 1) % every == 0 else LOCAL for i in range(n_layers))


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
    return shape.replace(**changes)


# ----------------------------------------------------------------------------------- config.json
# model_type -> the parts of the shape a config.json does not spell out. "window": how the family's
# config says which layers are local (see _window below); "defaults": the config class's defaults for
# keys a saved config may leave out (transformers fills them in the same way).
_DECODER_GATED = dict(arch="decoder", mlp="gated", norm="rmsnorm", position="rotary", final_norm=True,
                      attn_bias=False, mlp_bias=False, tied=False)
# transformers' Gemma3TextConfig defaults: Gemma 3's multimodal config.json files (model_type gemma3)
# keep in text_config only what differs from them (gemma-3-4b lists no head counts at all).
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
    "sliding_window": 4096, "tie_word_embeddings": True, "attention_bias": False,
}
_FAMILIES: dict[str, dict] = {
    "llama": _DECODER_GATED,
    "mistral": dict(_DECODER_GATED, window="all"),  # sliding_window set: every layer local (v0.1); null: none
    # mixture of experts: "experts" names the config keys of the expert count and width
    "mixtral": dict(_DECODER_GATED, window="all", experts=("num_local_experts", "intermediate_size")),
    "qwen3_moe": dict(_DECODER_GATED, qk_norm=True, window="qwen_all", defaults={"head_dim": 128},
                      experts=("num_experts", "moe_intermediate_size")),
    "olmoe": dict(_DECODER_GATED, qk_norm="full", experts=("num_experts", "intermediate_size")),
    "gpt_oss": dict(_DECODER_GATED, attn_bias=True, window="every", every=2, sinks=True, expert_bias=True,
                    router_bias=True, defaults={"sliding_window": 128, "head_dim": 64},
                    experts=("num_local_experts", "intermediate_size")),
    "qwen2": dict(_DECODER_GATED, attn_bias=True, o_bias=False, window="qwen"),  # bias on Q, K, V only
    "qwen3": dict(_DECODER_GATED, qk_norm=True, window="qwen", defaults={"head_dim": 128}),
    "gemma": dict(_DECODER_GATED, tied=True),
    "gemma2": dict(_DECODER_GATED, tied=True, post_norms=True, window="every", every=2,
                   defaults={"sliding_window": 4096}),
    "gemma3_text": dict(_DECODER_GATED, tied=True, qk_norm=True, post_norms=True, window="every", every=6,
                        defaults=GEMMA3_TEXT_DEFAULTS),
    "phi3": dict(_DECODER_GATED, window="all"),  # sliding_window set: every layer local (null by default)
    "smollm3": dict(_DECODER_GATED, tied=True, window="qwen_all"),  # windows where layer_types marks them
    "granite": _DECODER_GATED,  # its multipliers change no count
    "olmo": dict(_DECODER_GATED, norm="layernorm"),
    "olmo2": dict(_DECODER_GATED, qk_norm="full"),  # its two norms sit after each sub-layer: the same count
    "gpt2": dict(arch="decoder", mlp="gelu", norm="layernorm", position="learned", final_norm=True,
                 attn_bias=True, mlp_bias=True, tied=True),
    "gpt_neox": dict(arch="decoder", mlp="gelu", norm="layernorm", position="rotary", final_norm=True,
                     attn_bias=True, mlp_bias=True, tied=False),
    "bert": dict(arch="encoder", mlp="gelu", norm="layernorm", position="learned", embedding_norm=True,
                 pooler=True, attn_bias=True, mlp_bias=True, tied=True),
    "roberta": dict(arch="encoder", mlp="gelu", norm="layernorm", position="learned", embedding_norm=True,
                    pooler=True, attn_bias=True, mlp_bias=True, tied=True),
}
# Wrappers whose language model sits in text_config, and the model_type that text config has.
_WRAPPERS = {"gemma3": "gemma3_text"}
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


def from_config(path: str | Path, *, family: str | None = None) -> ModelShape:
    """A ModelShape from a transformers config.json (Llama/Mistral/Qwen2-style, GPT-2, BERT, ...).
    family: count it as this model_type (a key of the families table) whatever its own model_type says."""
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
    return shape_from_config_dict(cfg, where=where, family=family)


def known_model_types() -> tuple[str, ...]:
    """The model_types whose counts the families table knows (a wrapper's included)."""
    return (*_FAMILIES, *_WRAPPERS)


def _family(cfg: dict, model_type, chosen: str | None, where: str) -> dict:
    """The family entry config.json is counted as: the one `chosen` names, else its model_type's. An unknown
    model_type is refused rather than guessed: what config.json leaves to the family (biases, q/k norms, which
    layers are local, and so the KV cache) would silently be another model's."""
    if chosen is not None:
        if chosen not in _FAMILIES:
            raise CostError(f"--family: expected one of {', '.join(_FAMILIES)}, got {chosen!r}")
        return _FAMILIES[chosen]
    family = _FAMILIES.get(model_type)
    if (family is None or "experts" not in family) and (cfg.get("num_local_experts") or cfg.get("num_experts")):
        raise CostError(f"{where}: model_type {model_type!r} is a mixture of experts headcount does not know; "
                        f"known: {', '.join(k for k, v in _FAMILIES.items() if 'experts' in v)}")
    if family is None:
        raise CostError(f"{where}: unknown model_type {model_type!r}; known: {', '.join(_FAMILIES)}; to count it "
                        "as one of them, give --family (e.g. --family llama), or the shape by flags (--d-model, "
                        "--heads, ...)")
    return family


def shape_from_config_dict(cfg, *, where: str = "config.json", family: str | None = None) -> ModelShape:
    if not isinstance(cfg, dict):
        raise CostError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and not any(
            cfg.get(k) is not None for k in _KEYS["d_model"]):
        outer = cfg.get("model_type")
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model's shape here
        if cfg.get("model_type") is None and outer in _WRAPPERS:
            cfg = dict(cfg, model_type=_WRAPPERS[outer])
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise CostError(f"{where}: model_type should be a string, got {model_type!r}")
    family = _family(cfg, model_type, family, where)
    cfg = {k: v for k, v in family.get("defaults", {}).items() if k not in cfg} | cfg

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
    arch = family["arch"]
    if cfg.get("use_bidirectional_attention") is True:  # Gemma 3 embedding models: an encoder, no causal window
        arch = "encoder"
    sliding_window, layer_types = _window(cfg, family, n_layers, where) if arch == "decoder" else (None, None)
    moe = _experts(cfg, family, n_layers, where)
    qk_norm = family.get("qk_norm", False)
    try:
        return ModelShape(
            d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, n_layers=n_layers, d_ff=d_ff,
            mlp=family["mlp"], vocab_size=vocab, tied_embeddings=tied, position=family["position"],
            max_positions=max_positions or 0, type_vocab_size=cfg.get("type_vocab_size", 0) or 0,
            attn_bias=attn_bias, o_bias=o_bias, mlp_bias=mlp_bias, norm=family["norm"],
            embedding_norm=family.get("embedding_norm", False), final_norm=family.get("final_norm", False),
            pooler=family.get("pooler", False), qk_norm=bool(qk_norm), qk_norm_full=qk_norm == "full", **moe,
            post_norms=family.get("post_norms", False), sliding_window=sliding_window, layer_types=layer_types,
            arch=arch,
            name=str(cfg.get("_name_or_path") or model_type or Path(where).parent.name or "config.json"),
        )
    except CostError as err:
        raise CostError(f"{where}: {err}") from None


def _experts(cfg: dict, family: dict, n_layers: int, where: str) -> dict:
    """The MoE fields of ModelShape from a mixtral / qwen3_moe / olmoe / gpt_oss config ({} for dense)."""
    if "experts" not in family:
        return {}
    count_key, width_key = family["experts"]
    n = cfg.get(count_key, cfg.get("num_local_experts", cfg.get("num_experts")))
    k, width = cfg.get("num_experts_per_tok"), cfg.get(width_key)
    for key, value in ((count_key, n), ("num_experts_per_tok", k), (width_key, width)):
        if value is None:
            raise CostError(f"{where}: missing key {key} (a mixture of experts)")
        _check_int(f"{where}: {key}", value, minimum=0 if key == count_key else 1)
    moe_layers = n_layers
    if count_key == "num_experts" and "moe_intermediate_size" in family["experts"]:  # Qwen3-MoE's dense layers
        step = cfg.get("decoder_sparse_step", 1) or 1
        only = cfg.get("mlp_only_layers") or []
        moe_layers = sum(1 for i in range(n_layers) if i not in only and (i + 1) % step == 0)
    if not n:
        return {}
    return {"n_experts": n, "experts_per_token": k, "d_expert": width, "moe_layers": moe_layers,
            "expert_bias": family.get("expert_bias", False), "router_bias": family.get("router_bias", False),
            "attn_sinks": family.get("sinks", False)}


def _window(cfg: dict, family: dict, n_layers: int, where: str) -> tuple[int | None, list | None]:
    """(sliding_window, layer_types) the way transformers' config classes derive them.

    mistral: sliding_window set = every layer local; qwen2 / qwen3: only with use_sliding_window, layers
    i >= max_window_layers local; gemma2 / gemma3_text: layer i global when (i + 1) % pattern == 0
    (sliding_window_pattern, 2 / 6 by default). An explicit layer_types list wins over the pattern.
    """
    kind = family.get("window")
    if kind is None:
        return None, None
    window = cfg.get("sliding_window")
    if kind in ("qwen", "qwen_all") and not cfg.get("use_sliding_window", False):
        window = None
    if window is None:
        return None, None
    if cfg.get("layer_types") is not None:
        return window, cfg["layer_types"]
    if kind in ("all", "qwen_all"):  # qwen_all: Qwen3-MoE windows every layer when use_sliding_window
        return window, None
    if kind == "qwen":
        first = cfg.get("max_window_layers", 28)
        if not is_int(first) or first < 0:
            raise CostError(f"{where}: max_window_layers should be a whole number >= 0, got {first!r}")
        return window, [LOCAL if i >= first else FULL for i in range(n_layers)]
    every = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", family["every"]))
    if not is_int(every) or every <= 0:
        raise CostError(f"{where}: sliding_window_pattern should be a positive whole number, got {every!r}")
    return window, list(global_every(n_layers, every))


def describe(shape: ModelShape) -> str:
    """One line: '32 layers, d_model 4096, 32 query heads x 128 (GQA, 8 KV heads), ...'."""
    kv = f"{shape.attention_kind}, {shape.n_kv_heads} KV head{'s' if shape.n_kv_heads > 1 else ''}"
    decoupled = f" = {shape.attn_width} != d_model" if shape.head_dim_decoupled else ""
    stacks = f"{shape.n_layers}+{shape.n_layers} layers (encoder+decoder)" if shape.arch == "encoder-decoder" \
        else f"{shape.n_layers} layer{'s' if shape.n_layers > 1 else ''} ({shape.arch})"
    extra = " + q/k norm" if shape.qk_norm else ""
    window = ""
    if shape.sliding_window is not None:
        window = (f", sliding window {shape.sliding_window} on {shape.local_layers} of {shape.n_layers} layers"
                  if shape.global_layers else f", sliding window {shape.sliding_window} on every layer")
    return (f"{stacks}, d_model {shape.d_model}, {shape.n_heads} heads x {shape.head_dim}{decoupled} ({kv}{extra}), "
            f"d_ff {shape.d_ff} ({shape.mlp}), vocab {shape.vocab_size}{window}")

