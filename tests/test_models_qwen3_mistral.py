"""Qwen3 and Mistral (and Qwen2's sliding window) against transformers on random small configs (no
download): logits on a padded batch, greedy decoding past the sliding window equal to generate(), the
writer (export -> from_pretrained, load_checkpoint), refusals."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import CheckpointError, from_transformers, generate, load_checkpoint  # noqa: E402
from headcount.models.formats.hf import export_transformers, from_state_dict, to_transformers  # noqa: E402

VOCAB = 96
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)


def _randomise(model, seed=0):
    """Weights that make every tensor matter and keep greedy decoding from collapsing onto one token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + torch.randn(p.shape, generator=g) * (0.1 if "norm" in name else 0.25))
    return model.eval()


def qwen3(**kw):
    cfg = transformers.Qwen3Config(**{**BASE, "head_dim": 24, **kw})  # 4 x 24 != 64: decoupled head_dim
    cfg._attn_implementation = "sdpa"
    return _randomise(transformers.Qwen3ForCausalLM(cfg))


def mistral(**kw):
    cfg = transformers.MistralConfig(**{**BASE, "sliding_window": 6, **kw})
    cfg._attn_implementation = "sdpa"
    return _randomise(transformers.MistralForCausalLM(cfg))


def qwen2(**kw):
    cfg = transformers.Qwen2Config(**{**BASE, "use_sliding_window": True, "sliding_window": 6,
                                      "max_window_layers": 1, **kw})
    cfg._attn_implementation = "sdpa"
    return _randomise(transformers.Qwen2ForCausalLM(cfg))


def _ids(batch=2, length=24, seed=1):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _check(hf, ours, *, new=16):
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = ours(ids, attention_mask=mask).logits
    assert (out - ref)[mask.bool()].abs().max().item() <= 1e-4
    prompt = _ids(1, 10, seed=2)  # past the window of 6 where there is one
    want = hf.generate(prompt, max_new_tokens=new, do_sample=False)[0, 10:].tolist()
    got = generate(ours, prompt[0], new).new_ids
    assert got == want and len(set(got)) > 2


# ---------------------------------------------------------------------------------------------- Qwen3
def test_qwen3_matches():
    hf = qwen3()
    ours = from_transformers(hf)
    attn = ours.layers[0].attn
    assert ours.config.family == "qwen3" and attn.q_norm is not None and attn.head_dim == 24
    assert attn.qkv_proj.bias is None and attn.sliding_window is None
    _check(hf, ours)


def test_qwen3_sliding_window_layers_and_biases():
    hf = qwen3(use_sliding_window=True, sliding_window=6, max_window_layers=1, attention_bias=True)
    ours = from_transformers(hf)
    assert [layer.attn.sliding_window for layer in ours.layers] == [None, 6, 6]
    assert ours.layers[0].attn.o_proj.bias is not None
    _check(hf, ours)


def test_qwen3_writer(tmp_path):
    hf = qwen3(use_sliding_window=True, sliding_window=6, max_window_layers=2)
    ours = from_transformers(hf)
    export_transformers(ours, tmp_path / "q3")
    back = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "q3").eval()
    assert back.config.layer_types == ["full_attention", "full_attention", "sliding_attention"]
    ids = _ids(1, 20)
    with torch.no_grad():
        ref = hf(ids).logits
        assert (back(ids).logits - ref).abs().max().item() <= 1e-4
        assert (load_checkpoint(tmp_path / "q3")(ids).logits - ref).abs().max().item() <= 1e-4


# -------------------------------------------------------------------------------------------- Mistral
def test_mistral_sliding_window_on_every_layer():
    hf = mistral()
    ours = from_transformers(hf)
    assert ours.config.family == "mistral" and [la.attn.sliding_window for la in ours.layers] == [6, 6, 6]
    _check(hf, ours)


def test_mistral_without_window_is_llama():
    hf = mistral(sliding_window=None)
    ours = from_transformers(hf)
    assert all(layer.attn.sliding_window is None for layer in ours.layers)
    _check(hf, ours, new=8)


def test_mistral_writer(tmp_path):
    hf = mistral()
    ours = from_transformers(hf)
    export_transformers(ours, tmp_path / "m")
    back = transformers.MistralForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert back.config.sliding_window == 6
    ids = _ids(1, 20)
    with torch.no_grad():
        assert (back(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4
        assert (to_transformers(ours)(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4


# ------------------------------------------------------------------------------ Qwen2's window, refusals
def test_qwen2_sliding_window_layers():
    hf = qwen2()
    ours = from_transformers(hf)
    assert [layer.attn.sliding_window for layer in ours.layers] == [None, 6, 6]
    _check(hf, ours, new=8)


@pytest.mark.parametrize("field,value,match", [
    ("rope_parameters", {"rope_type": "ntk-by-parts", "factor": 4.0, "rope_theta": 1e4},
     "rope_type: 'ntk-by-parts' is not supported"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
     "partial_rotary_factor"),
    ("final_logit_softcapping", 30.0, "final_logit_softcapping"),
    ("hidden_act", "gelu", "hidden_act 'gelu'"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention"),
])
def test_fields_that_change_the_computation_are_refused_by_name(field, value, match):
    hf = qwen3(num_hidden_layers=1)
    cfg = {**hf.config.to_dict(), field: value}
    with pytest.raises(CheckpointError, match=match):
        from_state_dict(cfg, hf.state_dict())


def test_linear_rope_scaling_is_implemented():
    hf = mistral(sliding_window=None, num_hidden_layers=1,
                 rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    ours = from_transformers(hf)
    assert ours.rotary.linear_factor == 4.0
    ids = _ids(1, 40)
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4


def test_bench_exactness_family_row():
    """`headcount bench exactness`'s random-family rows (one family here; the bench runs them all)."""
    from headcount.models.exactness import random_family_vs_transformers, render

    row = random_family_vs_transformers("qwen3", new_tokens=12)
    assert row["max_abs_diff"] <= 1e-4 and row["greedy_equal"] and row["sliding_windows"].count(16) == 4
    render({"families": [row]})
