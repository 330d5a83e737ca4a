"""Families that change the decoder's structure (issue 27): gemma2 (attention and final logit soft-capping,
alternating windows), gpt_neox / Pythia (fused per-head-interleaved QKV, partial rotary, parallel residual),
olmo2 (q/k RMSNorm over the whole projection, norms after each sub-layer), each a random small config built
with transformers' own config class (no download) and checked against transformers' modeling code."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models.rotary import RotaryEmbedding  # noqa: E402


def test_partial_rotary_matches_gpt_neox():
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    cfg = transformers.GPTNeoXConfig(hidden_size=64, num_attention_heads=2, rotary_pct=0.25, rotary_emb_base=500)
    theirs = GPTNeoXRotaryEmbedding(cfg)
    ours = RotaryEmbedding(32, 64, 500.0, rotary_dim=8)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 20, 32, generator=g), torch.randn(1, 2, 20, 32, generator=g)
    cos, sin = theirs(q, torch.arange(3, 23)[None])
    want = apply_rotary_pos_emb(q, k, cos, sin)
    got = ours.hook(3, 20)(q, k)
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() <= 1e-6
    assert torch.equal(got[0][..., 8:], q[..., 8:])  # the last 24 dims pass through
    with pytest.raises(ValueError, match="rotary_dim"):
        RotaryEmbedding(32, 64, rotary_dim=7)
