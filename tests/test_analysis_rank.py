"""Rank: a constructed low-rank QK^T has the rank it was built with, never more than head_dim; the
recomputed scores are the model's own (before the softmax); minilm's heads against the bound."""

import pytest
import torch

from headcount.analysis.score_rank import EPS32, numerical_rank, score_matrices
from headcount.attention import MultiHeadAttention
from headcount.models.rotary import RotaryEmbedding


@pytest.mark.parametrize("r", [1, 3, 7])
def test_constructed_low_rank(r):
    g = torch.Generator().manual_seed(r)
    n = 20
    m = torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, n, generator=g, dtype=torch.float64)
    assert numerical_rank(m, n * EPS32) == r
    assert numerical_rank(torch.zeros(5, 5), 1e-6) == 0


def test_rank_of_scores_is_bounded_by_head_dim_and_matches_the_model():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, n_kv_heads=2, head_dim=4).eval()
    rot = RotaryEmbedding(4, 64)
    x = torch.randn(1, 12, 32)
    hook = rot.hook(0, 12)
    s = score_matrices(attn, x, hook)
    assert s.shape == (1, 4, 12, 12) and s.dtype == torch.float64
    for h in range(4):
        assert numerical_rank(s[0, h], 12 * EPS32) == 4  # random inputs: full rank min(head_dim, n)
    # the model's weights are softmax(S * scale) under the causal mask
    with torch.no_grad():
        w = attn(x, is_causal=True, need_weights=True, qk_transform=hook).weights
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    want = torch.softmax((s * attn.softmax_scale).masked_fill(~causal, float("-inf")), -1)
    torch.testing.assert_close(w.double(), want, atol=1e-5, rtol=1e-4)
    # below head_dim the bound is n
    s_short = score_matrices(attn, x[:, :3], rot.hook(0, 3))
    assert max(numerical_rank(s_short[0, h], 3 * EPS32) for h in range(4)) == 3


def test_minilm_rank_against_the_bound(minilm):
    from headcount.analysis import rank
    text = " ".join(["The quick brown fox jumps over the lazy dog while the small cat watches from the wall."] * 8)
    r = rank(minilm, text, lengths=[16, 48], max_windows=1, progress=False)
    j = r.to_json()
    assert set(j) == {"tolerance", "lengths", "heads", "summary"}
    assert j["lengths"] == [16, 48]
    assert len(j["heads"]) == 2 * 6 * 12
    assert set(j["heads"][0]) >= {"layer", "head", "length", "rank", "bound"}
    assert [s["bound"] for s in j["summary"]] == [16, 32]
    for h in j["heads"]:
        assert h["rank"] <= h["bound"] and h["rank_float64"] <= h["bound"]
    assert all(set(s) >= {"length", "bound", "mean_rank", "min_rank", "max_rank", "share_at_bound"}
               for s in j["summary"])
    with pytest.raises(ValueError, match="lengths"):
        rank(minilm, text, lengths=[1000], progress=False)


def test_scores_include_the_qk_norms():
    """With q/k RMSNorm (Gemma 3, Qwen3) the recomputed scores still reproduce the module's own weights."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, n_kv_heads=1, head_dim=8, qk_norm_eps=1e-6).eval()
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    rot = RotaryEmbedding(8, 64)
    x = torch.randn(1, 10, 32)
    s = score_matrices(attn, x, rot.hook(0, 10))
    with torch.no_grad():
        w = attn(x, is_causal=True, need_weights=True, qk_transform=rot.hook(0, 10)).weights
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    want = torch.softmax((s * attn.softmax_scale).masked_fill(~causal, float("-inf")), -1)
    torch.testing.assert_close(w.double(), want, atol=1e-5, rtol=1e-4)
