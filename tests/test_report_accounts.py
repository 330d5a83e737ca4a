"""The report's shape and accounts for the new zoo models, against headcount.cost's own numbers.

No weights: each model's config.json (as the zoo's converter writes it) goes through the loader's reader
(models.formats.hf_config.decoder_config), and the report's shape_of must give the cost module's shape for
the same model: its preset (`headcount cost gemma-3-270m`) and its own config.json reader. The numbers
written out below are what `headcount cost gemma-3-270m --seq 2048 --dtype bf16` prints."""

from types import SimpleNamespace

import pytest

from headcount.cost import get_preset, report, shape_from_config_dict
from headcount.models.formats.hf_config import decoder_config
from headcount.report.accounts import accounts, shape_json, shape_of, window_note

LOCAL, GLOBAL = "sliding_attention", "full_attention"
GEMMA3_270M = {  # google/gemma-3-270m's config.json, the keys the shape reads
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
    "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 512, "layer_types": ([LOCAL] * 5 + [GLOBAL]) * 3, "sliding_window_pattern": 6,
    "attention_bias": False, "use_bidirectional_attention": False, "tie_word_embeddings": True,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
QWEN_CODER_05B = {  # the zoo's qwen2.5-coder-0.5b: its GGUF carries an output matrix, so the embeddings are untied
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 24,
    "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}


def _decoder(cfg: dict, name: str):
    """What shape_of reads of a loaded Decoder: its config, its name, and that it has an lm_head."""
    return SimpleNamespace(config=decoder_config(cfg), name=name, lm_head=None)


def _same(a, b) -> bool:
    return a.replace(name="x") == b.replace(name="x")


def _row(shape, n_kv: int) -> dict:
    r = report(shape.replace(n_kv_heads=n_kv), batch=1, seq=2048, dtype="bf16")
    return {"params": r["params"]["total"], "attention_params": r["params"]["attention_all_layers"],
            "kv_bytes_per_token": r["kv_cache"]["bytes_per_token"], "kv_bytes_context": r["kv_cache"]["bytes_for_context"],
            "flops": r["flops"]["total_causal"], "score_bytes_per_layer": r["score_memory_bytes"]["eager_per_layer"]}


def test_gemma3_270m_shape_is_the_cost_modules_own():
    shape = shape_of(_decoder(GEMMA3_270M, "gemma3-270m"))
    preset = get_preset("gemma-3-270m").shape
    assert _same(shape, preset) and _same(shape, shape_from_config_dict(GEMMA3_270M))
    assert (shape.qk_norm, shape.post_norms, shape.mlp, shape.norm) == (True, True, "gated", "rmsnorm")
    assert (shape.sliding_window, shape.local_layers, shape.global_layers) == (512, 15, 3)
    assert shape.layer_types == tuple(GEMMA3_270M["layer_types"]) and shape.head_dim_decoupled
    d = shape_json(shape)
    assert d["layer_types"] == GEMMA3_270M["layer_types"] and "note" not in d
    assert d["describe"].endswith("sliding window 512 on 15 of 18 layers") and "q/k norm" in d["describe"]


def test_gemma3_270m_accounts_are_headcount_costs_numbers():
    shape = shape_of(_decoder(GEMMA3_270M, "gemma3-270m"))
    acc = accounts(shape)
    assert acc["model_kind"] == "MQA" and acc["window"] == {"size": 512, "local_layers": 15, "global_layers": 3}
    assert [(r["label"], r["n_kv_heads"], r["is_model"]) for r in acc["rows"]] == \
        [("MHA", 4, False), ("GQA", 2, False), ("MQA", 1, True)]
    preset = get_preset("gemma-3-270m").shape
    for r in acc["rows"]:  # every row is headcount.cost's report for that many KV heads, window included
        assert {k: r[k] for k in _row(preset, r["n_kv_heads"])} == _row(preset, r["n_kv_heads"]), r["label"]
    mine = acc["rows"][-1]
    # `headcount cost gemma-3-270m --seq 2048 --dtype bf16`
    assert mine["params"] == 268_098_176 and mine["attention_params"] == 18 * 1_638_912
    assert mine["kv_bytes_per_token"] == 18_432 and mine["kv_bytes_context"] == 14_155_776
    assert mine["kv_bytes_context_without_window"] == 37_748_736 and mine["kv_bytes_per_token_past_window"] == 3_072
    assert mine["flops"] == 1_180_042_264_576 and mine["flops_without_window"] == 1_252_519_837_696
    assert mine["score_bytes_per_layer"] == 33_554_432


def test_qwen_coder_shape_and_accounts():
    shape = shape_of(_decoder(QWEN_CODER_05B, "qwen2.5-coder-0.5b"))
    assert _same(shape, shape_from_config_dict(QWEN_CODER_05B))
    assert _same(shape, get_preset("qwen2.5-coder-0.5b").shape.replace(tied_embeddings=False))
    assert (shape.attn_bias, shape.o_bias, shape.mlp_bias, shape.sliding_window) == (True, False, False, None)
    acc = accounts(shape)
    assert [(r["label"], r["n_kv_heads"], r["is_model"]) for r in acc["rows"]] == \
        [("MHA", 14, False), ("GQA", 2, True), ("MQA", 1, False)]
    assert "window" not in acc and "kv_bytes_context_without_window" not in acc["rows"][1]
    assert acc["rows"][1]["params"] == 630_167_424  # the loaded model's numel (embeddings and lm_head apart)
    assert acc["rows"][1]["kv_bytes_per_token"] == 2 * 24 * 2 * 64 * 2


@pytest.fixture(scope="module")
def bidirectional():
    """A tiny EmbeddingGemma-like BidirectionalEncoder (gemma3_text with use_bidirectional_attention)."""
    import torch

    from headcount.models.encoder import BidirectionalEncoder

    cfg = dict(GEMMA3_270M, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
               layer_types=[LOCAL] * 5 + [GLOBAL], sliding_window=8, use_bidirectional_attention=True,
               max_position_embeddings=64)
    torch.manual_seed(0)
    model = BidirectionalEncoder(decoder_config(cfg)).eval()
    model.name = "tiny-embeddinggemma"
    return model, cfg


def test_a_bidirectional_encoder_is_counted_as_an_encoder_and_says_what_is_left_out(bidirectional):
    model, cfg = bidirectional
    shape = shape_of(model)
    assert shape.arch == "encoder" and shape.sliding_window is None and (shape.qk_norm, shape.post_norms) == (True, True)
    assert _same(shape, shape_from_config_dict(cfg))  # the cost module reads its config.json the same way
    assert sum(p.numel() for p in model.parameters()) == report(shape)["params"]["total"]
    note = window_note(model)
    assert "5 of 6 layers" in note and "counted as global" in note
    acc = accounts(shape)
    assert [r["label"] for r in acc["rows"]] == ["MHA", "GQA", "MQA"] and acc["rows"][-1]["is_model"]
    assert acc["rows"][-1]["flops"] == report(shape, seq=2048)["flops"]["total"]  # an encoder: no causal halving


def test_a_bidirectional_encoder_report_has_its_shape_and_no_merge(bidirectional, tmp_path):
    from headcount.report.cache import ResultCache
    from headcount.report.collect import collect
    from headcount.report.html import render_html

    model, _ = bidirectional
    r = collect(model, only=("shape", "kv_merge"), progress=False, cache=ResultCache(tmp_path, enabled=False),
                results_dir=None)
    assert r["kind"] == "encoder" and r["shape"]["arch"] == "encoder" and "counted as global" in r["shape"]["note"]
    assert "already has one KV head per layer (MQA)" in r["unavailable"]["kv_merge"]
    c15 = next(c for c in r["claims"] if c["id"] == "C15")
    assert c15["status"] == "partly" and "not measured (tiny-embeddinggemma already has one KV head" in c15["finding"]
    page = render_html(r)
    w = model.config.sliding_window  # transformers' bidirectional window: 8 // 2 + 1
    assert w == 5 and f"Not counted: bidirectional sliding window {w} (|p - j| &lt; {w}) on 5 of 6 layers" in page
