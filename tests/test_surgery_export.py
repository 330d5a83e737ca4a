"""export_transformers: the pruned model loads in transformers with no headcount code, same logits."""

import copy
import os

import pytest
import torch

from headcount.surgery import export_transformers, prune
from test_surgery_prune import tiny, windows

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _tiny_float():
    return tiny(n_layers=2, n_heads=8, n_kv=2, d_model=48).float()


@pytest.mark.parametrize("mode,heads,compensate", [
    ("query", {0: [1, 6], 1: [0, 7]}, "lstsq"),  # one from each group of 4: 6 heads, groups of 3
    ("group", {0: [4, 5, 6, 7], 1: [0, 1, 2, 3]}, "none"),  # one KV group per layer
])
def test_llama_export_matches(tmp_path, mode, heads, compensate):
    model = _tiny_float()
    prune(model, heads, mode=mode, compensate=compensate, calibration=windows(3, 16))
    export_transformers(model, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    n = model.layers[0].attn.n_heads
    assert hf.config.num_attention_heads == n and hf.config.head_dim == 8
    assert hf.model.layers[0].self_attn.q_proj.weight.shape == (n * 8, 48)  # n * head_dim != hidden_size
    ids = windows(2, 20, seed=7)
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max().item() < 1e-4


def test_llama_export_refuses_what_transformers_cannot_hold(tmp_path):
    model = _tiny_float()
    prune(model, {0: [1]}, compensate="none")
    with pytest.raises(ValueError, match="different head counts"):
        export_transformers(model, tmp_path / "a")
    model = _tiny_float()
    prune(model, {0: [1, 2], 1: [5, 6]}, compensate="none")  # same count, groups of 2 and 4
    with pytest.raises(ValueError, match="uneven GQA groups"):
        export_transformers(model, tmp_path / "b")
    model = tiny(n_layers=2, n_heads=6, n_kv=1, d_model=48).float()
    prune(model, {0: [0], 1: [0]}, compensate="none")  # 5 heads: 48 % 5 != 0
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        export_transformers(model, tmp_path / "c")
    assert list(tmp_path.iterdir()) == []


def test_bert_export_pads_removed_heads_with_zeros(tmp_path, minilm):
    model = copy.deepcopy(minilm)
    prune(model, {0: [0, 5, 11], 2: [3], 5: list(range(8))}, compensate="none")  # uneven per layer
    export_transformers(model, tmp_path / "bert")
    hf = transformers.BertModel.from_pretrained(tmp_path / "bert").eval()
    ids, mask = model.tokenizer.batch(["Which heads count?", "Pruned heads come back as zero heads."])
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
        got = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    assert (got - want)[mask].abs().max().item() < 1e-4


def test_existing_out_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        export_transformers(_tiny_float(), tmp_path / "x")
