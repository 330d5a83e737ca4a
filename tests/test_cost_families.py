"""The presets and config families (Gemma 3, Qwen2.5, Qwen3, Mistral, Gemma 2) against independent
truths: the published parameter totals, and transformers' own models built from its config classes on the
meta device (no download, no weights), for the three presets and for random small configs of each family."""

import json
import random

import pytest

from headcount.cost import CostError, from_config, get_preset, param_counts
from headcount.cost.shape import FULL, LOCAL, GEMMA3_TEXT_DEFAULTS

# The published config.json values (google/gemma-3-270m, Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B), the keys
# that decide the shape.
GEMMA3_270M = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 640,
    "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
    "_sliding_window_pattern": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]
    + ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"],
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "attention_bias": False, "tie_word_embeddings": True,
    "use_bidirectional_attention": False,
}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "hidden_act": "silu", "tie_word_embeddings": True,
    "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 24, "rope_theta": 1000000.0,
}
QWEN25_15B = dict(QWEN25_05B, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  max_position_embeddings=131072, sliding_window=131072, max_window_layers=21)
CONFIGS = {"gemma-3-270m": GEMMA3_270M, "qwen2.5-0.5b": QWEN25_05B, "qwen2.5-1.5b": QWEN25_15B}

# The published totals (Gemma 3 270M: 268,098,176; Qwen2.5-0.5B: 494,032,768; Qwen2.5-1.5B: 1,543,714,304).
PUBLISHED = {"gemma-3-270m": 268_098_176, "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304}


def _write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name, total", PUBLISHED.items())
def test_preset_totals_are_the_published_ones(name, total):
    assert param_counts(get_preset(name).shape)["total"] == total


def test_gemma3_270m_by_hand():
    """Per block: Q 640x1024 + K, V 640x256 + O 1024x640 + q/k norm 2 x 256 + gated MLP 3 x 640 x 2048 +
    4 RMSNorms x 640 = 5,573,632; x 18 + tied embeddings 262144 x 640 + final norm 640 = 268,098,176."""
    s = get_preset("gemma-3-270m").shape
    block = 640 * 1024 + 2 * 640 * 256 + 1024 * 640 + 2 * 256 + 3 * 640 * 2048 + 4 * 640
    assert block == 5_573_632 == param_counts(s)["per_layer"]
    assert 18 * block + 262144 * 640 + 640 == 268_098_176
    assert (s.n_heads, s.n_kv_heads, s.head_dim, s.attn_width, s.d_model) == (4, 1, 256, 1024, 640)
    assert s.head_dim_decoupled and s.attention_kind == "MQA" and s.qk_norm and s.post_norms
    assert s.sliding_window == 512 and (s.global_layers, s.local_layers) == (3, 15)
    assert [i for i in range(18) if not s.is_local(i)] == [5, 11, 17]  # global when (i + 1) % 6 == 0


def test_qwen25_shapes_by_hand():
    for name, (d, h, kv, hd, L, f) in {"qwen2.5-0.5b": (896, 14, 2, 64, 24, 4864),
                                        "qwen2.5-1.5b": (1536, 12, 2, 128, 28, 8960)}.items():
        s = get_preset(name).shape
        assert (s.d_model, s.n_heads, s.n_kv_heads, s.head_dim, s.n_layers, s.d_ff) == (d, h, kv, hd, L, f)
        assert s.attn_bias and not s.o_bias and not s.mlp_bias and s.tied_embeddings and s.sliding_window is None
        qkv_bias = (h + 2 * kv) * hd
        block = 2 * d * h * hd + 2 * d * kv * hd + qkv_bias + 3 * d * f + 2 * d
        assert param_counts(s)["total"] == L * block + 151936 * d + d == PUBLISHED[name]


@pytest.mark.parametrize("alias, key", [("gemma3-270m", "gemma-3-270m"), ("qwen2.5-coder-0.5b", "qwen2.5-0.5b"),
                                        ("Qwen2.5-Coder-1.5B", "qwen2.5-1.5b")])
def test_zoo_names_are_aliases(alias, key):
    assert get_preset(alias) is get_preset(key)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_json_gives_the_preset(tmp_path, name):
    s = from_config(_write(tmp_path, CONFIGS[name]))
    p = get_preset(name).shape
    for field in ("d_model", "n_heads", "n_kv_heads", "head_dim", "n_layers", "d_ff", "vocab_size", "tied_embeddings",
                  "attn_bias", "o_bias", "qk_norm", "post_norms", "sliding_window", "layer_types", "max_positions"):
        assert getattr(s, field) == getattr(p, field), field
    assert param_counts(s)["total"] == PUBLISHED[name]


# ---------------------------------------------------------- against transformers, on the meta device
def _transformers_count(config_class_name, model_class_name, **cfg):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, config_class_name)(**cfg)
    with torch.device("meta"):
        model = getattr(transformers, model_class_name)(config)
    return sum(p.numel() for p in model.parameters()), config


def _keys(cfg):
    return {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}


@pytest.mark.parametrize("name, classes", [
    ("gemma-3-270m", ("Gemma3TextConfig", "Gemma3ForCausalLM")),
    ("qwen2.5-0.5b", ("Qwen2Config", "Qwen2ForCausalLM")),
    ("qwen2.5-1.5b", ("Qwen2Config", "Qwen2ForCausalLM")),
])
def test_presets_equal_transformers_models(name, classes):
    numel, config = _transformers_count(*classes, **_keys(CONFIGS[name]))
    shape = get_preset(name).shape
    assert param_counts(shape)["total"] == numel == PUBLISHED[name]
    types = tuple(config.layer_types)
    assert (shape.layer_types or (FULL,) * shape.n_layers) == types
    if LOCAL in types:
        assert shape.sliding_window == config.sliding_window


def _random_config(family, rng):
    """A small random config of one family, as transformers' config class keywords."""
    n_kv = rng.choice([1, 2])
    n_heads = n_kv * rng.choice([1, 2, 3])
    head_dim = rng.choice([8, 16])
    d_model = n_heads * rng.choice([4, 8, 12])  # often != n_heads * head_dim: decoupled
    cfg = dict(hidden_size=d_model, num_attention_heads=n_heads, num_key_value_heads=n_kv,
               num_hidden_layers=rng.randint(1, 8), intermediate_size=rng.randint(8, 64), vocab_size=rng.randint(50, 300),
               tie_word_embeddings=rng.random() < 0.5)
    if family == "gemma3_text":
        cfg.update(head_dim=head_dim, sliding_window=rng.randint(1, 64), sliding_window_pattern=rng.randint(1, 4))
    elif family == "gemma2":
        cfg.update(head_dim=head_dim, sliding_window=rng.randint(1, 64))
    elif family == "qwen3":
        cfg.update(head_dim=head_dim, use_sliding_window=rng.random() < 0.5, sliding_window=rng.randint(1, 64),
                   max_window_layers=rng.randint(0, 8))
    elif family == "qwen2":
        cfg.update(use_sliding_window=rng.random() < 0.5, sliding_window=rng.randint(1, 64),
                   max_window_layers=rng.randint(0, 8))
    elif family == "mistral":
        cfg.update(head_dim=head_dim, sliding_window=rng.choice([None, rng.randint(1, 64)]))
    return cfg


FAMILIES = {  # model_type -> (config class, model class)
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_small_configs_equal_transformers(tmp_path, family, seed):
    """The config class's own saved config.json (what save_pretrained writes) -> the same parameter count
    and the same local/global layers as the model transformers builds from it."""
    rng = random.Random(f"{family}-{seed}")
    numel, config = _transformers_count(*FAMILIES[family], **_random_config(family, rng))
    config.save_pretrained(tmp_path)
    shape = from_config(tmp_path)
    assert param_counts(shape)["total"] == numel
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ([LOCAL if window is not None else FULL] * config.num_hidden_layers)
    if window is None:
        types = [FULL] * config.num_hidden_layers
    assert list(shape.layer_types or [FULL] * shape.n_layers) == list(types)
    if LOCAL in types:
        assert shape.sliding_window == window and shape.local_layers == list(types).count(LOCAL)
    else:
        assert shape.local_layers == 0


def test_gemma3_multimodal_wrapper_uses_text_config_defaults(tmp_path):
    """gemma-3-4b's config.json lists in text_config only what differs from Gemma3TextConfig's defaults (no
    head counts at all). The language model's count must equal transformers' reading of the same file."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    wrapper = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
               "text_config": {"hidden_size": 64, "intermediate_size": 96, "model_type": "gemma3_text",
                               "num_hidden_layers": 7, "sliding_window": 16, "vocab_size": 320},
               "vision_config": {"model_type": "siglip_vision_model"}}
    _write(tmp_path, wrapper)
    config = transformers.AutoConfig.from_pretrained(tmp_path).text_config
    with torch.device("meta"):
        model = transformers.Gemma3ForCausalLM(config)
    shape = from_config(tmp_path)
    assert param_counts(shape)["total"] == sum(p.numel() for p in model.parameters())
    assert (shape.n_heads, shape.n_kv_heads, shape.head_dim) == (8, 4, 256)  # the class defaults
    assert list(shape.layer_types) == list(config.layer_types) and shape.sliding_window == 16
    # the same without the text config's model_type: the wrapper's says what it is
    del wrapper["text_config"]["model_type"]
    assert from_config(_write(tmp_path, wrapper, "bare.json")) == shape


def test_gemma3_text_defaults_are_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma3TextConfig()
    for key, value in GEMMA3_TEXT_DEFAULTS.items():
        assert getattr(config, key) == value, key


def test_qwen3_config_with_qk_norm_and_decoupled_head_dim(tmp_path):
    cfg = {"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
           "head_dim": 128, "num_hidden_layers": 28, "intermediate_size": 3072, "vocab_size": 151936,
           "tie_word_embeddings": True, "hidden_act": "silu", "max_position_embeddings": 40960}  # Qwen3-0.6B
    s = from_config(_write(tmp_path, cfg))
    assert s.qk_norm and s.head_dim_decoupled and not s.attn_bias and s.sliding_window is None
    # 28 x (Q 1024x2048 + K, V 1024x1024 + O 2048x1024 + q/k norm 256 + MLP 3 x 1024 x 3072 + 2 x 1024)
    # + tied embeddings 151936 x 1024 + final norm: Qwen3-0.6B's 0.6B (0.44B without the embeddings)
    assert param_counts(s)["total"] == 28 * (6 * 1024 * 1024 + 256 + 3 * 1024 * 3072 + 2048) + 151936 * 1024 + 1024 \
        == 596_049_920


@pytest.mark.parametrize("window, types", [(4096, (LOCAL,) * 32), (None, None)])
def test_mistral_window_when_set(tmp_path, window, types):
    cfg = {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000, "sliding_window": window,
           "hidden_act": "silu", "max_position_embeddings": 32768}
    s = from_config(_write(tmp_path, cfg))
    assert s.sliding_window == window and s.layer_types == types
    assert param_counts(s)["total"] == 7_241_732_096


def test_qwen2_window_only_with_use_sliding_window(tmp_path):
    s = from_config(_write(tmp_path, dict(QWEN25_05B, use_sliding_window=True, sliding_window=4096,
                                          max_window_layers=20)))
    assert s.sliding_window == 4096 and [s.is_local(i) for i in range(24)] == [i >= 20 for i in range(24)]


def test_bidirectional_gemma3_is_an_encoder_without_a_causal_window(tmp_path):
    s = from_config(_write(tmp_path, dict(GEMMA3_270M, use_bidirectional_attention=True)))
    assert s.arch == "encoder" and s.sliding_window is None
    assert param_counts(s)["total"] == PUBLISHED["gemma-3-270m"]  # tied: no LM head either way


@pytest.mark.parametrize("change, fragment", [
    (dict(sliding_window=0), "sliding_window: expected a positive number of keys"),
    (dict(sliding_window=-512), "sliding_window: expected a positive number of keys"),
    (dict(sliding_window="512"), "sliding_window: expected a whole number"),
    (dict(sliding_window=512.0), "sliding_window: expected a whole number"),
    (dict(layer_types=["sliding_attention"] * 17), "layer_types: 17 entries for 18 layers"),
    (dict(layer_types=["local"] * 18), "layer_types: unknown layer type"),
    (dict(layer_types="sliding_attention"), "layer_types: expected a list"),
    (dict(layer_types=None, _sliding_window_pattern=0), "sliding_window_pattern should be a positive"),
])
def test_bad_window_configs_name_the_field(tmp_path, change, fragment):
    cfg = {k: v for k, v in dict(GEMMA3_270M, **change).items() if v is not None}
    with pytest.raises(CostError, match=fragment) as info:
        from_config(_write(tmp_path, cfg))
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_null_window_in_a_config_means_every_layer_global(tmp_path):
    s = from_config(_write(tmp_path, dict(GEMMA3_270M, sliding_window=None)))
    assert s.sliding_window is None and s.layer_types is None and s.global_layers == 18


def test_bad_qwen_max_window_layers(tmp_path):
    with pytest.raises(CostError, match="max_window_layers"):
        from_config(_write(tmp_path, dict(QWEN25_05B, use_sliding_window=True, max_window_layers=-1)))


def test_unknown_model_type_still_says_so(tmp_path):
    cfg = {k: v for k, v in dict(GEMMA3_270M, model_type="gemma9_text").items() if k != "hidden_activation"}
    with pytest.raises(CostError, match="unknown model_type 'gemma9_text'.*gemma3_text"):
        from_config(_write(tmp_path, cfg))
