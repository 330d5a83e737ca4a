"""config.json written by `export --to transformers|vllm` carries `transformers_version`, as transformers' own
save_pretrained writes it: without it transformers takes a local checkpoint with a large vocabulary for a
possibly broken Mistral tokenizer and warns "...incorrect regex pattern..." on every load."""

import json
import logging

import pytest
import torch
from tokenizers import pre_tokenizers

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.formats.hf import export_transformers
from headcount.models.formats.vllm_deci import export_vllm
from headcount.models.tokenizer import Tokenizer, byte_level_bpe

transformers = pytest.importorskip("transformers")
WARNING = "incorrect regex pattern"


def _large_vocab_mistral():
    """A tiny mistral-family decoder whose tokenizer has over 100,000 tokens (transformers checks the regex of
    those only), so the warning's conditions are all met but the version."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<s>"] + alphabet + [f"w{i}" for i in range(100_100)]
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                        max_position=64, family="mistral", bos_token_id=0, eos_token_id=0)
    model = Decoder(cfg).eval()
    model.tokenizer = Tokenizer(byte_level_bpe(tokens, [], special_ids=[0]), bos_token_id=0, eos_token_id=0)
    return model


def _load_warnings(directory) -> str:
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Grab()
    transformers.utils.logging.add_handler(handler)
    try:
        transformers.AutoTokenizer.from_pretrained(str(directory))
    finally:
        transformers.utils.logging.remove_handler(handler)
    return "\n".join(records)


def test_transformers_export_writes_the_version_and_loads_without_the_regex_warning(tmp_path):
    model = _large_vocab_mistral()
    export_transformers(model, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["transformers_version"] == transformers.__version__
    assert WARNING not in _load_warnings(tmp_path / "hf")
    # the check can fail: the same directory without the field is warned about
    del cfg["transformers_version"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    assert WARNING in _load_warnings(tmp_path / "hf")


def test_vllm_export_writes_the_version(tmp_path):
    model = _large_vocab_mistral()
    model.config.family = "llama"
    with torch.no_grad():  # per-layer K/V counts: the DeciLM form, whose config.json deci_state_dict writes
        from headcount.head_surgery import merge_kv_heads
        merge_kv_heads(model.layers[0].attn, 1)
    plan = export_vllm(model, tmp_path / "vllm")
    assert plan["form"] == "deci"
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert cfg["transformers_version"] == transformers.__version__
