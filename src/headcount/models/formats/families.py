"""One entry per transformers family: what its checkpoint calls each tensor, how its norms, biases and
fused projections are stored, which config.json keys it has. hf.py's reader and writer both walk the entry
(the reader maps transformers names to headcount's, the writer the same map inverted, as torchtune's
convert_weights does with one `_FROM_HF` dict), and hf_config.py reads its bias, tie and field rules from it,
so adding a family is one entry (plus, where its config differs, a config reader) and its tests.

Names are relative: a block's tensors to `layer` (formatted with the layer index), everything else to the
checkpoint's `prefix` (tried first when reading, the bare name after it), except `lm_head`, which sits
outside it in *ForCausalLM checkpoints. headcount's own names (the Decoder / Encoder modules): embed,
pos_embed, layers.{i}.{attn_norm, post_attn_norm, mlp_norm, post_mlp_norm}, attn.qkv_proj (rows [all Q
heads | all K heads | all V heads]), attn.o_proj, attn.q_norm / k_norm, attn.sinks, mlp.gate_up_proj (rows
[gate | up]) or mlp.up_proj, mlp.down_proj, norm, lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

# headcount's norm -> transformers' (Llama's post_attention_layernorm is the norm BEFORE the MLP; Gemma's is the
# one after the attention, and its pre_feedforward_layernorm comes before the MLP; OLMo 2 has only the norms
# after each sub-layer; BERT's are post-norms inside its attention.output / output modules)
LLAMA_NORMS = MappingProxyType({"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"})
GEMMA_NORMS = MappingProxyType({"attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
                                "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm"})
OLMO2_NORMS = MappingProxyType({"post_attn_norm": "post_attention_layernorm",
                                "post_mlp_norm": "post_feedforward_layernorm"})

ATTENTION_BIAS = ("switch", "qkv", "none", "always")
BIAS_RULES = ("none", "switch", "always")
QKV_LAYOUTS = ("rows", "per_head")


@dataclass(frozen=True)
class Family:
    """A transformers family as headcount reads and writes it (see the module docstring for the names)."""

    name: str  # DecoderConfig.family / EncoderConfig.family
    model_types: tuple[str, ...]  # config.json model_type(s) read; the first is the one written
    reader: str  # which config reader of hf_config.py builds the headcount config
    classes: tuple[str, str] | None = None  # (config class, model class) written; None: read only
    bidirectional_class: str | None = None  # the model class of the family's encoder variant (Gemma3TextModel)
    encoder: bool = False  # an Encoder (BERT's post-norm stack with token types and a pooler)
    # --- tensor names
    prefix: str = "model."
    embed: str = "embed_tokens.weight"
    pos_embed: str | None = None
    layer: str = "layers.{i}."
    norms: Mapping[str, str] = field(default_factory=lambda: LLAMA_NORMS)
    final_norm: str | None = "norm"
    lm_head: tuple[str, ...] = ("lm_head.weight", "language_model.lm_head.weight")  # the first is written
    qkv: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # one name: fused
    qkv_layout: str = "rows"  # a fused qkv's rows: "rows" = headcount's, "per_head" = [n_heads, 3, head_dim]
    o_proj: str = "self_attn.o_proj"
    qk_norms: tuple[str, str] = ("self_attn.q_norm", "self_attn.k_norm")
    sinks: str = "self_attn.sinks"
    mlp_in: tuple[str, ...] = ("mlp.gate_proj", "mlp.up_proj")  # gated: (gate, up) or one fused gate_up; else (up,)
    mlp_out: str = "mlp.down_proj"
    conv1d: bool = False  # GPT-2's Conv1D: every weight stored [in, out]
    norm_bias: bool = False  # LayerNorms with a bias
    one_plus_norms: bool = False  # Gemma: every RMSNorm weight stored as w and applied as 1 + w (float32)
    zero_heads: bool = False  # transformers sizes heads by hidden_size / heads: removed heads written as zeros
    extra: Mapping[str, str] = field(default_factory=dict)  # further headcount name -> transformers name
    # --- biases and config keys
    attention_bias: str = "switch"  # switch: one attention_bias for q, k, v, o; qkv: q/k/v always, o never;
    #                                 none: no attention biases; always: every projection has one
    attention_bias_default: bool = False  # the switch when config.json leaves it out
    mlp_bias: str = "none"  # none / switch (config.json's mlp_bias) / always
    tie_default: bool = False  # tie_word_embeddings when config.json leaves it out
    reads: frozenset[str] = frozenset()  # fields refused for every other family (hf_config._REFUSED) it reads
    act_key: str = "hidden_act"  # where config.json names the activation
    keys: tuple[str, ...] = ()  # the family's own config.json keys, each written by hf.py's CONFIG_KEYS
    window_every_layer: bool = False  # one sliding window on every layer (a model with full layers is refused)
    window_default: int | None = None  # sliding_window written when the model has none (Gemma's classes need one)
    embed_scale_sqrt: bool = False  # embeddings multiplied by sqrt(hidden_size), nothing else
    q_norm_by_hidden: bool = False  # the class sizes q_norm by hidden_size (OLMoE): query heads cannot go
    moe: bool = False  # routed experts (hf_moe.py) and transformers 5's rope_parameters spelling

    def __post_init__(self):
        if self.attention_bias not in ATTENTION_BIAS:
            raise ValueError(f"attention_bias: expected one of {ATTENTION_BIAS}, got {self.attention_bias!r}")
        if self.qkv_layout not in QKV_LAYOUTS:
            raise ValueError(f"qkv_layout: expected one of {QKV_LAYOUTS}, got {self.qkv_layout!r}")
        if len(self.qkv) not in (1, 3):
            raise ValueError(f"qkv: expected one fused name or three (q, k, v), got {self.qkv!r}")
        if self.mlp_bias not in BIAS_RULES:
            raise ValueError(f"mlp_bias: expected one of {BIAS_RULES}, got {self.mlp_bias!r}")
        if not 1 <= len(self.mlp_in) <= 2:
            raise ValueError(f"mlp_in: expected one or two names, got {self.mlp_in!r}")

    def read_biases(self, cfg: dict) -> tuple[bool, bool]:
        """(q/k/v biases, o_proj bias) of a checkpoint with this config.json."""
        on = bool(cfg.get("attention_bias", self.attention_bias_default))
        return {"switch": (on, on), "qkv": (True, False), "none": (False, False),
                "always": (True, True)}[self.attention_bias]

    def read_mlp_bias(self, cfg: dict) -> bool:
        """Whether the MLP projections of a checkpoint with this config.json have biases."""
        return {"none": False, "switch": bool(cfg.get("mlp_bias", False)), "always": True}[self.mlp_bias]


_QWEN_WINDOW = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
_GEMMA = dict(norms=GEMMA_NORMS, one_plus_norms=True, act_key="hidden_activation", tie_default=True,
              window_default=4096, embed_scale_sqrt=True)
_MOE = dict(moe=True, reader="moe")

# In SUPPORTED's order (error messages list the model types in it).
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", ("bert",), "bert", classes=("BertConfig", "BertModel"), encoder=True, prefix="bert.",
           embed="embeddings.word_embeddings.weight", pos_embed="embeddings.position_embeddings.weight",
           layer="encoder.layer.{i}.",
           norms=MappingProxyType({"attn_norm": "attention.output.LayerNorm", "mlp_norm": "output.LayerNorm"}),
           final_norm=None, lm_head=(), qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
           o_proj="attention.output.dense", mlp_in=("intermediate.dense",), mlp_out="output.dense",
           norm_bias=True, zero_heads=True, attention_bias="always", mlp_bias="always",
           extra={"type_embed.weight": "embeddings.token_type_embeddings.weight",
                  "embed_norm.weight": "embeddings.LayerNorm.weight", "embed_norm.bias": "embeddings.LayerNorm.bias",
                  "pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}),
    Family("gpt2", ("gpt2",), "gpt2", prefix="transformer.", embed="wte.weight", pos_embed="wpe.weight",
           layer="h.{i}.", norms=MappingProxyType({"attn_norm": "ln_1", "mlp_norm": "ln_2"}), final_norm="ln_f",
           lm_head=(), qkv=("attn.c_attn",), o_proj="attn.c_proj", mlp_in=("mlp.c_fc",), mlp_out="mlp.c_proj",
           conv1d=True, norm_bias=True, attention_bias="always", mlp_bias="always", tie_default=True),
    Family("llama", ("llama",), "llama", classes=("LlamaConfig", "LlamaForCausalLM"), mlp_bias="switch",
           keys=("attention_bias", "mlp_bias")),
    Family("qwen2", ("qwen2",), "llama", classes=("Qwen2Config", "Qwen2ForCausalLM"), attention_bias="qkv",
           keys=_QWEN_WINDOW),
    Family("qwen3", ("qwen3",), "llama", classes=("Qwen3Config", "Qwen3ForCausalLM"),
           keys=(*_QWEN_WINDOW, "attention_bias")),
    Family("mistral", ("mistral",), "llama", classes=("MistralConfig", "MistralForCausalLM"), attention_bias="none",
           keys=("sliding_window",), window_every_layer=True),
    Family("gemma3", ("gemma3_text", "gemma3"), "gemma3", classes=("Gemma3TextConfig", "Gemma3ForCausalLM"),
           bidirectional_class="Gemma3TextModel",
           keys=("query_pre_attn_scalar", "sliding_window", "layer_types", "rope_local_base_freq", "attention_bias",
                 "use_bidirectional_attention", "final_logit_softcapping", "attn_logit_softcapping"), **_GEMMA),
    Family("mixtral", ("mixtral",), classes=("MixtralConfig", "MixtralForCausalLM"), attention_bias="none",
           keys=("sliding_window",), window_every_layer=True, **_MOE),
    Family("qwen3_moe", ("qwen3_moe",), classes=("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
           keys=("attention_bias", "use_sliding_window", "sliding_window"), **_MOE),
    Family("olmoe", ("olmoe",), classes=("OlmoeConfig", "OlmoeForCausalLM"), keys=("attention_bias",),
           q_norm_by_hidden=True, **_MOE),
    Family("gpt_oss", ("gpt_oss",), classes=("GptOssConfig", "GptOssForCausalLM"), attention_bias_default=True,
           keys=("attention_bias", "sliding_window", "layer_types"), **_MOE),
    Family("phi3", ("phi3",), "llama", classes=("Phi3Config", "Phi3ForCausalLM"), qkv=("self_attn.qkv_proj",),
           mlp_in=("mlp.gate_up_proj",), attention_bias="none", reads=frozenset({"partial_rotary_factor"}),
           keys=("sliding_window", "original_max_position_embeddings"), window_every_layer=True),
    Family("smollm3", ("smollm3",), "llama", classes=("SmolLM3Config", "SmolLM3ForCausalLM"), mlp_bias="switch",
           tie_default=True, reads=frozenset({"no_rope_layers"}),
           keys=("attention_bias", "mlp_bias", "no_rope_layers", "layer_types", "use_sliding_window",
                 "sliding_window")),
    Family("granite", ("granite",), "llama", classes=("GraniteConfig", "GraniteForCausalLM"), mlp_bias="switch",
           reads=frozenset({"logits_scaling", "embedding_multiplier", "residual_multiplier", "attention_multiplier"}),
           keys=("attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "logits_scaling",
                 "attention_multiplier")),
    Family("gemma2", ("gemma2",), "gemma2", classes=("Gemma2Config", "Gemma2ForCausalLM"),
           reads=frozenset({"final_logit_softcapping", "attn_logit_softcapping"}),
           keys=("query_pre_attn_scalar", "sliding_window", "layer_types", "attention_bias", "attn_logit_softcapping",
                 "final_logit_softcapping"), **_GEMMA),
    Family("gpt_neox", ("gpt_neox",), "gpt_neox", classes=("GPTNeoXConfig", "GPTNeoXForCausalLM"), prefix="gpt_neox.",
           embed="embed_in.weight", final_norm="final_layer_norm", lm_head=("embed_out.weight", "lm_head.weight"),
           qkv=("attention.query_key_value",), qkv_layout="per_head", o_proj="attention.dense",
           mlp_in=("mlp.dense_h_to_4h",), mlp_out="mlp.dense_4h_to_h", norm_bias=True, zero_heads=True,
           mlp_bias="always", attention_bias_default=True, reads=frozenset({"partial_rotary_factor"})),
    Family("olmo2", ("olmo2",), "olmo2", classes=("Olmo2Config", "Olmo2ForCausalLM"), norms=OLMO2_NORMS,
           keys=("attention_bias",)),
)}

# config.json model_type -> its family
BY_MODEL_TYPE: dict[str, Family] = {mt: f for f in FAMILIES.values() for mt in f.model_types}
SUPPORTED = tuple(BY_MODEL_TYPE)  # every model_type the transformers reader knows
MOE_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.moe)


def family(name: str) -> Family:
    """The entry of headcount family `name` (DecoderConfig.family); ValueError naming the known ones."""
    if name not in FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


# llama.cpp's block tensor names (the same in every architecture it writes): headcount's norms, and each
# projection of a family entry in its order (q, k, v; o; gate, up; down; q_norm, k_norm)
GGUF_NORMS = {"attn_norm": "attn_norm", "mlp_norm": "ffn_norm", "post_attn_norm": "post_attention_norm",
              "post_mlp_norm": "post_ffw_norm"}
GGUF_QKV, GGUF_O = ("attn_q", "attn_k", "attn_v"), "attn_output"
GGUF_MLP_IN, GGUF_MLP_OUT = ("ffn_gate", "ffn_up"), "ffn_down"
GGUF_QK_NORMS = ("attn_q_norm", "attn_k_norm")


def gguf_names(fam: Family, *, qk_norm: bool = False, qkv_bias: bool = False) -> dict[str, str]:
    """llama.cpp block name -> the family's transformers name (both relative to the block), for a family with
    separate q / k / v and gate / up projections: what gguf.py reads a llama / qwen2 / gemma3 file by."""
    if len(fam.qkv) != 3 or len(fam.mlp_in) != 2:
        raise ValueError(f"fam: llama.cpp keeps q, k, v and gate, up apart; {fam.name} fuses them")
    pairs = [("attn_norm", fam.norms["attn_norm"]), *zip(GGUF_QKV, fam.qkv), (GGUF_O, fam.o_proj),
             *zip(GGUF_MLP_IN, fam.mlp_in), (GGUF_MLP_OUT, fam.mlp_out)]
    if qk_norm:
        pairs += zip(GGUF_QK_NORMS, fam.qk_norms)
    pairs += [(GGUF_NORMS[ours], theirs) for ours, theirs in fam.norms.items() if ours != "attn_norm"]
    names = {f"{gguf}.weight": f"{theirs}.weight" for gguf, theirs in pairs}
    if qkv_bias:
        names.update({f"{gguf}.bias": f"{theirs}.bias" for gguf, theirs in zip(GGUF_QKV, fam.qkv)})
    return names
