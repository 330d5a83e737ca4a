"""headcount's own saved format keeps what the new families add: q/k norms, sliding-window layers,
Gemma's attention scale, and the bidirectional (encoder) Gemma — a pruned model saved and reloaded gives
the same outputs, checked against the model before saving (no download; random small configs)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import from_transformers, load  # noqa: E402
from headcount.models.encoder import BidirectionalEncoder  # noqa: E402
from headcount.surgery import prune, save  # noqa: E402

GEMMA = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=128, sliding_window=8,
             query_pre_attn_scalar=24)
QWEN3 = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, max_position_embeddings=128)


def _random(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.02 if "embed" in name else 0.3))
    return model.eval()


def _ids():
    return torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", ["gemma3", "qwen3"])
def test_pruned_model_reloads_equal(family, tmp_path):
    if family == "gemma3":
        hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**GEMMA))
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3))
    model = from_transformers(_random(hf))
    prune(model, {0: [1], 1: [0, 3]}, compensate="none")  # uneven groups in layer 0
    assert model.layers[0].attn.q_norm is not None
    with torch.no_grad():
        want = model(_ids()).logits
    save(model, tmp_path / "saved")
    back = load(tmp_path / "saved")
    assert [l.attn.sliding_window for l in back.layers] == [l.attn.sliding_window for l in model.layers]
    assert [l.attn.softmax_scale for l in back.layers] == [l.attn.softmax_scale for l in model.layers]
    with torch.no_grad():
        got = back(_ids()).logits
    assert torch.equal(got, want)


def test_bidirectional_gemma_reloads_as_an_encoder(tmp_path):
    cfg = transformers.Gemma3TextConfig(**GEMMA, use_bidirectional_attention=True)
    model = from_transformers(_random(transformers.Gemma3TextModel(cfg)))
    assert isinstance(model, BidirectionalEncoder)
    mask = torch.ones(2, 24, dtype=torch.long)
    with torch.no_grad():
        want = model(_ids(), mask).last_hidden_state
    save(model, tmp_path / "saved")
    back = load(tmp_path / "saved")
    assert isinstance(back, BidirectionalEncoder)
    with torch.no_grad():
        assert torch.equal(back(_ids(), mask).last_hidden_state, want)
