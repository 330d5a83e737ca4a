"""ModelShape from transformers config.json files, checked against known totals and, where transformers
is installed, against the parameters of the same config instantiated on the meta device."""

import json

import pytest

from headcount.cost import CostError, from_config, param_counts

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
}
GPT2 = {  # openai-community/gpt2
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
    "n_positions": 1024, "n_ctx": 1024, "n_inner": None, "vocab_size": 50257, "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-05,
}
BERT = {  # google-bert/bert-base-uncased
    "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768, "num_attention_heads": 12,
    "num_hidden_layers": 12, "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2,
    "vocab_size": 30522, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
}
MISTRAL_HEAD_DIM = {  # Mistral-NeMo-like: head_dim set on its own, 32 x 128 = 4096 != hidden_size 5120
    "model_type": "mistral", "hidden_size": 5120, "head_dim": 128, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 40, "intermediate_size": 14336, "vocab_size": 131072,
    "max_position_embeddings": 1024000, "hidden_act": "silu", "tie_word_embeddings": False,
}
QWEN2 = {  # Qwen2-0.5B: bias on Q, K, V (not O), tied embeddings
    "model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
    "num_hidden_layers": 24, "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
    "hidden_act": "silu", "tie_word_embeddings": True,
}


def _write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return path


def test_llama3_8b_config(tmp_path):
    s = from_config(_write(tmp_path, LLAMA3_8B))
    assert (s.n_heads, s.n_kv_heads, s.head_dim, s.mlp, s.norm) == (32, 8, 128, "gated", "rmsnorm")
    assert param_counts(s)["total"] == 8_030_261_248  # the number


def test_gpt2_config(tmp_path):
    s = from_config(_write(tmp_path, GPT2))
    assert (s.d_model, s.d_ff, s.position, s.max_positions, s.tied_embeddings) == (768, 3072, "learned", 1024, True)
    # GPT-2 small: the widely quoted 124,439,808 = embeddings 50257 x 768 + positions 1024 x 768 + 12 blocks
    # of 12 d^2 + 13 d + the final LayerNorm 2 d.
    d = 768
    assert param_counts(s)["total"] == 50257 * d + 1024 * d + 12 * (12 * d * d + 13 * d) + 2 * d == 124_439_808


def test_bert_config(tmp_path):
    s = from_config(_write(tmp_path, BERT))
    assert s.arch == "encoder" and s.pooler and s.type_vocab_size == 2
    assert param_counts(s)["total"] == 109_482_240  # the number, pooler included


def test_mistral_config_with_decoupled_head_dim(tmp_path):
    s = from_config(_write(tmp_path, MISTRAL_HEAD_DIM))
    assert s.head_dim == 128 and s.attn_width == 4096 and s.head_dim_decoupled
    d, a, kv, L = 5120, 32 * 128, 8 * 128, 40
    per_layer = d * a + 2 * d * kv + a * d + 3 * d * 14336 + 2 * d
    assert param_counts(s)["total"] == L * per_layer + 2 * 131072 * d + d


def test_config_folder_and_text_config(tmp_path):
    _write(tmp_path, LLAMA3_8B)
    assert from_config(tmp_path).n_kv_heads == 8
    wrapped = {"model_type": "llava", "text_config": LLAMA3_8B}
    assert param_counts(from_config(_write(tmp_path, wrapped, "wrapped.json")))["total"] == 8_030_261_248


@pytest.mark.parametrize("cfg, fragment", [
    (dict(GPT2, hidden_size=1024), "contradictory keys for d_model"),
    (dict(BERT, n_head=16), "contradictory keys for n_heads"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "num_attention_heads"}, "missing key num_attention_heads"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}, "missing key hidden_size"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "vocab_size"}, "missing key vocab_size"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "intermediate_size"}, "missing key intermediate_size"),
    ({k: v for k, v in GPT2.items() if k != "n_positions"}, "max_position_embeddings"),
    (dict(LLAMA3_8B, num_attention_heads=24), "does not divide hidden_size"),
    (dict(LLAMA3_8B, num_key_value_heads=5), "num_key_value_heads 5 does not divide"),
    (dict(LLAMA3_8B, num_key_value_heads=64), "does not divide"),
    (dict(LLAMA3_8B, hidden_size=-4096), "hidden_size"),
    (dict(LLAMA3_8B, num_hidden_layers=0), "num_hidden_layers"),
    (dict(LLAMA3_8B, head_dim=0), "head_dim"),
    (dict(LLAMA3_8B, tie_word_embeddings="yes"), "tie_word_embeddings"),
    (dict(LLAMA3_8B, model_type="mixtral", num_local_experts=8), "mixture of experts"),
    ({k: v for k, v in dict(LLAMA3_8B, model_type="mystery").items() if k != "hidden_act"}, "unknown model_type"),
    ([1, 2, 3], "expected a JSON object"),
    ("{not json", "not valid JSON"),
])
def test_bad_configs(tmp_path, cfg, fragment):
    with pytest.raises(CostError, match=fragment) as info:
        from_config(_write(tmp_path, cfg))
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(CostError, match="no such file"):
        from_config(tmp_path / "nope.json")


def test_unknown_model_type_is_refused_unless_a_family_is_named(tmp_path):
    with pytest.raises(CostError, match="unknown model_type 'somethingnew'.*--family"):
        from_config(_write(tmp_path, dict(LLAMA3_8B, model_type="somethingnew")))
    s = from_config(_write(tmp_path, dict(LLAMA3_8B, model_type="somethingnew")), family="llama")
    assert s.mlp == "gated" and param_counts(s)["total"] == 8_030_261_248


# ---------------------------------------------------------- against transformers, on the meta device
@pytest.mark.parametrize("cfg, auto", [
    (LLAMA3_8B, "AutoModelForCausalLM"), (GPT2, "AutoModelForCausalLM"), (BERT, "AutoModel"),
    (MISTRAL_HEAD_DIM, "AutoModelForCausalLM"), (QWEN2, "AutoModelForCausalLM"),
])
def test_matches_transformers_on_meta_device(tmp_path, cfg, auto):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = _write(tmp_path, cfg)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    assert param_counts(from_config(path))["total"] == expected
