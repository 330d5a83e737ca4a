"""The accounts' invariants (chapter 2.3.3 / 2.3.7), against formulas written out here independently."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headcount.cost import (CostError, ModelShape, attention_flops, attention_params, fit, flop_counts, get_preset,
                            kv_cache, override, param_counts, parse_budget, parse_dtype, parse_seq, report,
                            score_memory)

head_dims = st.sampled_from([1, 2, 8, 16, 32, 64, 80, 96, 128, 256])
heads = st.integers(1, 48)
seqs = st.integers(1, 5000)
batches = st.integers(1, 8)
dtypes = st.sampled_from(["fp32", "fp16", "bf16", "fp8"])


def _bytes(dtype):
    return {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[dtype]


# ------------------------------------------------------------------------- the chapter's three accounts
@given(d_base=st.integers(1, 64), split=st.sampled_from([(1, 2), (2, 8), (1, 16), (4, 8), (3, 12)]))
def test_params_independent_of_head_count(d_base, split):
    """d_model = n_heads * head_dim: parameters 4 d^2 whatever the head count (no bias)."""
    d = d_base * 48  # divisible by every head count used below
    a, b = split
    pa = attention_params(ModelShape(d_model=d, n_heads=a))
    pb = attention_params(ModelShape(d_model=d, n_heads=b))
    assert pa["total"] == pb["total"] == 4 * d * d
    assert pa["total_with_bias"] == pb["total_with_bias"] == 4 * d * d + 4 * d


@given(hd=head_dims, h=heads, factor=st.sampled_from([2, 3, 4]), n=seqs, b=batches)
def test_flops_independent_of_head_count(hd, h, factor, n, b):
    """Score + read FLOPs n_h x 4 n^2 d_h = 4 n^2 d, the same for h heads of width f*hd and f*h heads of hd."""
    d = h * factor * hd
    few = attention_flops(ModelShape(d_model=d, n_heads=h), b, n)
    many = attention_flops(ModelShape(d_model=d, n_heads=h * factor), b, n)
    assert few == many
    assert few["scores"] + few["read"] == 4 * b * n * n * d
    assert few["projections"] == 3 * 2 * b * n * d * d  # X W_Q, X W_K, X W_V: n x d times d x d, each
    assert few["output"] == 2 * b * n * d * d
    assert few["total"] == 8 * b * n * d * d + 4 * b * n * n * d


@given(hd=head_dims, h=heads, n=seqs, b=batches)
def test_causal_halves_scores_and_read_only(hd, h, n, b):
    s = ModelShape(d_model=h * hd, n_heads=h)
    full, causal = attention_flops(s, b, n), attention_flops(s, b, n, causal=True)
    assert causal["scores"] + causal["read"] == 2 * b * n * n * s.d_model  # 2 n^2 d
    assert causal["projections"] == full["projections"] and causal["output"] == full["output"]


@given(hd=head_dims, h=heads, n=seqs, b=batches, dtype=dtypes)
def test_score_memory_linear_in_heads(hd, h, n, b, dtype):
    nbytes = _bytes(dtype)
    one = score_memory(ModelShape(d_model=h * hd, n_heads=h), b, n, nbytes)
    two = score_memory(ModelShape(d_model=2 * h * hd, n_heads=2 * h), b, n, nbytes)
    assert one["eager_per_layer"] == b * h * n * n * nbytes
    assert two["eager_per_layer"] == 2 * one["eager_per_layer"]
    assert one["eager_peak_per_layer"] == 2 * one["eager_per_layer"]  # + the softmax output
    assert one["fused_per_layer"] == two["fused_per_layer"] == 0


@given(hd=head_dims, groups=st.integers(1, 16), n_kv=st.integers(1, 16), layers=st.integers(1, 128), n=seqs,
       b=batches, dtype=dtypes)
def test_kv_bytes_linear_in_kv_heads(hd, groups, n_kv, layers, n, b, dtype):
    nbytes = _bytes(dtype)
    h = groups * n_kv
    s = ModelShape(d_model=h * hd, n_heads=h, n_kv_heads=n_kv, n_layers=layers)
    mqa = s.replace(n_kv_heads=1)
    kv, kv1 = kv_cache(s, b, n, nbytes), kv_cache(mqa, b, n, nbytes)
    assert kv["bytes_per_token"] == 2 * n_kv * hd * layers * nbytes  # K and V x KV heads x width x layers
    assert kv["bytes_per_token"] == n_kv * kv1["bytes_per_token"]
    assert kv["bytes_for_context"] == kv["bytes_per_token"] * n * b


def test_chapter_example_score_memory():
    """d = 4096, n = 4096, FP16, batch 1: 8 heads 268,435,456 bytes (0.25 GiB), 32 heads 1 GiB, 128 heads 4 GiB."""
    got = [score_memory(ModelShape(d_model=4096, n_heads=h), 1, 4096, 2)["eager_per_layer"] for h in (8, 32, 128)]
    assert got == [268_435_456, 1024**3, 4 * 1024**3]
    assert got[0] == 8 * 4096**2 * 2


def test_llama3_8b_kv_cache_chapter_2_3_7():
    """Llama 3 8B at fp16: 131,072 bytes per token with 8 KV heads, four times that with 32."""
    shape = get_preset("llama-3-8b").shape
    assert kv_cache(shape, 1, 1, 2)["bytes_per_token"] == 131_072
    assert kv_cache(override(shape, n_kv_heads=32), 1, 1, 2)["bytes_per_token"] == 4 * 131_072


# ------------------------------------------------------------------------------- GQA, bias, head_dim
@given(hd=head_dims, groups=st.integers(1, 8), n_kv=st.integers(1, 8), d=st.integers(1, 4096))
def test_attention_params_gqa_decoupled(hd, groups, n_kv, d):
    h = groups * n_kv
    s = ModelShape(d_model=d, n_heads=h, n_kv_heads=n_kv, head_dim=hd)
    p = attention_params(s)
    # W_Q d x (h hd), W_K and W_V d x (n_kv hd) each, W_O (h hd) x d
    assert p["total_without_bias"] == d * h * hd + 2 * d * n_kv * hd + h * hd * d
    assert p["total_with_bias"] == p["total_without_bias"] + h * hd + 2 * n_kv * hd + d
    assert p["total"] == p["total_without_bias"]  # no bias by default
    sb = s.replace(attn_bias=True, o_bias=False)  # Qwen2: bias on Q, K, V only
    assert attention_params(sb)["total"] == p["total_without_bias"] + (h + 2 * n_kv) * hd


@given(hd=head_dims, groups=st.integers(1, 8), n_kv=st.integers(1, 8), n=seqs, b=batches)
def test_gqa_flops_scores_use_query_heads(hd, groups, n_kv, n, b):
    """Every query head scores and reads; only the K/V projections shrink with n_kv."""
    h = groups * n_kv
    s = ModelShape(d_model=h * hd, n_heads=h, n_kv_heads=n_kv)
    f = attention_flops(s, b, n)
    assert f["scores"] == f["read"] == 2 * b * h * n * n * hd
    assert f["projections"] == 2 * b * n * s.d_model * (h * hd + 2 * n_kv * hd)


def test_model_flops_totals_add_up():
    s = get_preset("llama-3-8b").shape
    f = flop_counts(s, 2, 1000)
    d, L = s.d_model, s.n_layers
    mlp = 2 * 2 * 1000 * 3 * d * s.d_ff
    logits = 2 * 2 * 1000 * d * s.vocab_size
    assert f["total"] == L * (f["attention_per_layer"]["total"] + mlp) + logits
    assert f["total"] - f["total_causal"] == L * (f["attention_per_layer"]["scores"] + f["attention_per_layer"]["read"]) // 2
    assert f["attention_total_causal"] < f["attention_total"]


def test_encoder_decoder_counts_cross_attention():
    s = get_preset("transformer-base").shape
    p = param_counts(s)
    attn = 4 * (512 * 512 + 512)
    mlp = 2 * 512 * 2048 + 2048 + 512
    enc = attn + mlp + 2 * 1024
    dec = 2 * attn + mlp + 3 * 1024
    assert p["total"] == 6 * enc + 6 * dec + 37000 * 512
    assert flop_counts(s, 1, 10)["attention_modules"] == 18


# ---------------------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("kwargs, fragment", [
    (dict(d_model=0, n_heads=1), "d_model"),
    (dict(d_model=-4, n_heads=1), "d_model"),
    (dict(d_model=64, n_heads=0), "n_heads"),
    (dict(d_model=64, n_heads=6), "do not divide d_model"),
    (dict(d_model=64, n_heads=8, n_kv_heads=3), "do not divide"),
    (dict(d_model=64, n_heads=8, n_kv_heads=16), "more than"),
    (dict(d_model=64, n_heads=8, head_dim=0), "head_dim"),
    (dict(d_model=64, n_heads=8, n_layers=0), "n_layers"),
    (dict(d_model=64, n_heads=8, vocab_size=-1), "vocab_size"),
    (dict(d_model=64, n_heads=8, mlp="relu3"), "mlp"),
    (dict(d_model=64, n_heads=8, position="learned"), "max_positions"),
    (dict(d_model=64.0, n_heads=8), "d_model"),
    (dict(d_model=True, n_heads=8), "d_model"),
    (dict(d_model=64, n_heads=8, attn_bias=1), "attn_bias"),
])
def test_shape_rejects_impossible(kwargs, fragment):
    with pytest.raises(CostError, match=fragment) as info:
        ModelShape(**kwargs)
    assert "\n" not in str(info.value)


def test_shape_is_frozen_and_resolved():
    s = ModelShape(d_model=4096, n_heads=32)
    assert (s.n_kv_heads, s.head_dim, s.d_ff) == (32, 128, 4 * 4096)
    with pytest.raises(Exception):
        s.d_model = 1  # type: ignore[misc]
    assert ModelShape(d_model=2048, n_heads=24, head_dim=128).head_dim_decoupled


def test_override_rederives_head_dim_and_keeps_gqa():
    llama = get_preset("llama-3-8b").shape
    s = override(llama, n_heads=64)
    assert (s.head_dim, s.n_kv_heads) == (64, 8)
    s = override(llama, n_heads=16, head_dim=256)
    assert (s.head_dim, s.n_kv_heads) == (256, 8)
    mha = ModelShape(d_model=512, n_heads=8)
    assert override(mha, n_heads=16).n_kv_heads == 16  # MHA stays MHA
    with pytest.raises(CostError, match="unknown shape field"):
        override(mha, n_head=3)


# ------------------------------------------------------------------------------ parsing and fitting
@pytest.mark.parametrize("text, expected", [
    ("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("1.5TiB", 3 * 2**39), ("512MiB", 512 * 2**20),
    ("80 gib", 80 * 2**30), ("1000", 1000), ("2TB", 2 * 10**12), (".5GiB", 2**29),
])
def test_parse_budget(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "80XB", "-1GiB", "0GiB", "eighty", "80GiB extra", "1e3GB"])
def test_parse_budget_rejects(text):
    with pytest.raises(CostError) as info:
        parse_budget(text)
    assert "\n" not in str(info.value)


def test_parse_seq_and_dtype():
    assert parse_seq("8192") == 8192 and parse_seq("8k") == 8192 and parse_seq("128K") == 131072
    for bad in ("0", "-3", "abc", "1.5k"):
        with pytest.raises(CostError):
            parse_seq(bad)
    assert parse_dtype("bfloat16") == ("bf16", 2) and parse_dtype("torch.float16") == ("fp16", 2)
    with pytest.raises(CostError, match="unknown dtype"):
        parse_dtype("fp13")


@given(extra_tokens=st.integers(0, 10**6), batch=st.integers(1, 4), slack=st.integers(0, 131_071))
def test_fit_solves_the_budget(extra_tokens, batch, slack):
    """Budget = weights + batch x k tokens of KV (+ less than one token's worth): the longest context is k."""
    shape = get_preset("llama-3-8b").shape
    weights = 8_030_261_248 * 2  # bf16, the total
    per_token = 131_072  # the bf16/fp16 bytes per token
    budget = weights + batch * extra_tokens * per_token + min(slack, batch * per_token - 1)
    got = fit(shape, budget, batch=batch, seq=4096, dtype="bf16")
    assert got["max_context"] == extra_tokens
    assert got["max_batch"] == (budget - weights) // (4096 * per_token)


def test_fit_weights_do_not_fit():
    got = fit(get_preset("llama-3-70b").shape, parse_budget("80GiB"), dtype="bf16")
    assert got["max_context"] == 0 and "do not fit" in got["note"]


def test_report_keys_and_validation():
    rep = report(get_preset("mistral-7b").shape, batch=1, seq=8192, dtype="bf16")
    assert set(rep["flops"]["attention_per_layer"]) >= {"projections", "scores", "read", "output"}
    assert "2 FLOPs" in rep["conventions"]["flops"]
    for bad in (dict(batch=0), dict(seq=-1), dict(dtype="fp4x")):
        with pytest.raises(CostError):
            report(get_preset("mistral-7b").shape, **bad)
