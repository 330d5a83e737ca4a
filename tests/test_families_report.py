"""The head report's data (report.json, no browser) on one random small model per structural switch: phi3 (partial
rotary, fused qkv / gate-up), gemma2 (score soft-capping), gpt_neox (parallel residual, per-head-interleaved QKV).
The report's tiny sizes (tests/test_report_build.py), SmolLM2's tokenizer (the vocabulary widened to it), the
steps that read the attention: shape, the chapter checks, the attention sample, rank, importance and the K/V merge.
The other families' switches meet the report in its chapter checks only (shape + checks, a fraction of a second
each): full-width q/k norms (olmo2, olmoe), the MoE cost shape (mixtral, qwen3_moe, olmoe, gpt_oss) and GPT-OSS's
sinks. C2's per-head reference (headcount.reference.multi_head) is checked against transformers' own attention
layer (rotary set to the identity) on the three families whose attention it must write out: OLMo 2's norm over
the whole projection, Gemma 2's soft-cap and GPT-OSS's sinks.
benchmarks/families_commands.py runs `headcount report --quick` on every family."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from headcount.report import checks as report_checks  # noqa: E402
from headcount.report.build import dumps  # noqa: E402
from headcount.report.cache import ResultCache  # noqa: E402
from headcount.report.collect import collect  # noqa: E402
from test_report_build import TEXT, TINY  # noqa: E402

STEPS = ("shape", "checks", "sample", "rank", "importance", "kv_merge")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_memory_measurement(monkeypatch):
    """C6's peak-memory measurement is the same for every model (a 20 s probe); the formula part stays."""
    measured = report_checks.c6_memory
    monkeypatch.setattr(report_checks, "c6_memory", lambda measure=True: measured(False))


def _model(family, smollm2):
    from headcount.models import from_transformers
    from headcount.models.exactness import random_transformers_model

    hf = random_transformers_model(family, shape={"vocab_size": smollm2.config.vocab_size, "num_hidden_layers": 2,
                                                  "max_position_embeddings": 256})
    model = from_transformers(hf)
    model.tokenizer, model.name = smollm2.tokenizer, family
    return model


def _report(model, tmp_path, only=STEPS):
    return collect(model, TEXT, sizes=TINY, only=only, progress=False, cache=ResultCache(tmp_path, enabled=False),
                   results_dir=None)


@pytest.mark.parametrize("family", ["phi3", "gemma2", "gpt_neox"])
def test_report_data_on_each_family(family, smollm2, tmp_path):
    model = _model(family, smollm2)
    r = _report(model, tmp_path)
    assert dumps(r)  # report.json's serialisation (sorted, rounded)
    assert not {step for step in STEPS if step in r["unavailable"]}, r["unavailable"]
    attn = model.layers[0].attn
    assert (r["shape"]["n_heads"], r["shape"]["n_kv_heads"]) == (attn.n_heads, attn.n_kv_heads)
    assert len(r["sample"]["layers"]) == 2 and len(r["sample"]["layers"][0]) == attn.n_heads
    for row in r["sample"]["layers"][1][0]:  # the attention sample's rows sum to 1 (in thousandths)
        assert abs(sum(row) - 1000) <= len(row)
    assert r["kv_merge"]  # merge-kv's aware fit ran (partial rotary included)
    claims = {c["id"]: c for c in r["claims"]}
    assert claims["C4"]["status"] == "held"  # the attention's parameter count against the formula
    assert claims["C2"]["status"] == "held"  # gemma2 included: the reference soft-caps its scores too


@pytest.mark.parametrize("family", ["olmo2", "olmoe", "gpt_oss", "mixtral", "qwen3_moe"])
def test_report_checks_on_the_other_families(family, smollm2, tmp_path):
    """Full-width q/k norms (olmo2, olmoe), MoE cost shapes (C4: a 1-layer shape of an MoE model), sinks (gpt_oss)."""
    model = _model(family, smollm2)
    r = _report(model, tmp_path, only=("shape", "checks"))
    assert "checks" not in r["unavailable"], r["unavailable"]
    claims = {c["id"]: c for c in r["claims"]}
    assert claims["C2"]["status"] == "held", claims["C2"]["finding"]
    assert claims["C4"]["status"] == "held", claims["C4"]["finding"]
    assert claims["C14"]["status"] == "held", claims["C14"]["finding"]


def _hf_per_head(hf_attn, n_heads, n_kv_heads, head_dim):
    """PerHeadWeights cut straight from transformers' q_proj / k_proj / v_proj / o_proj (no headcount loader)."""
    from headcount.reference import PerHeadWeights

    def cut(lin, n):
        return [lin.weight[h * head_dim:(h + 1) * head_dim].T for h in range(n)]

    def bias(lin, n):
        return None if lin.bias is None else [lin.bias[h * head_dim:(h + 1) * head_dim] for h in range(n)]

    return PerHeadWeights(W_q=cut(hf_attn.q_proj, n_heads), W_k=cut(hf_attn.k_proj, n_kv_heads),
                          W_v=cut(hf_attn.v_proj, n_kv_heads), W_o=hf_attn.o_proj.weight.T,
                          b_q=bias(hf_attn.q_proj, n_heads), b_k=bias(hf_attn.k_proj, n_kv_heads),
                          b_v=bias(hf_attn.v_proj, n_kv_heads), b_o=hf_attn.o_proj.bias)


@pytest.mark.parametrize("family", ["olmo2", "gemma2", "gpt_oss"])
def test_reference_matches_transformers_attention(family):
    """reference.multi_head = transformers' layer-0 attention (float64, rotary's cos = 1, sin = 0, causal, 12 tokens
    inside every window), with the switch the family needs: OLMo 2's q/k norm over the whole projection, Gemma 2's
    soft-cap, GPT-OSS's sinks. Each switch matters here: the reference without it is far off."""
    from headcount.models.exactness import random_transformers_model
    from headcount.reference import multi_head

    hf = random_transformers_model(family, shape={"num_hidden_layers": 2}).double()
    cfg, attn = hf.config, hf.model.layers[0].self_attn
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    w = _hf_per_head(attn, nh, nkv, dh)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 12, cfg.hidden_size, generator=g, dtype=torch.float64)
    cos, sin = hf.model.rotary_emb(x, torch.arange(12)[None])
    mask = torch.full((12, 12), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want = attn(x, position_embeddings=(torch.ones_like(cos), torch.zeros_like(sin)), attention_mask=mask)[0]
        softcap = None
        if family == "olmo2":
            w.q_norm, w.k_norm, w.norm_eps = attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon
            assert w.q_norm.shape == (nh * dh,)  # over the whole projection
        elif family == "gemma2":
            softcap = cfg.attn_logit_softcapping
        else:
            w.sinks = attn.sinks
        got, weights = multi_head(x, w, is_causal=True, scale=attn.scaling, softcap=softcap)
        if family == "olmo2":  # the norm taken head by head instead (each head's own statistics, its weight slice)
            from headcount.reference import PerHeadWeights, rms_norm
            q = [rms_norm(x @ w.W_q[i], w.q_norm[i * dh:(i + 1) * dh], w.norm_eps) for i in range(nh)]
            k = [rms_norm(x @ w.W_k[j], w.k_norm[j * dh:(j + 1) * dh], w.norm_eps) for j in range(nkv)]
            eye = torch.eye(dh, dtype=torch.float64)
            per = PerHeadWeights(W_q=[eye] * nh, W_k=[eye] * nkv, W_v=w.W_v, W_o=w.W_o)  # q, k fed in as x, context
            wrong = _heads_from(per, q, k, x, attn.scaling)
        else:
            wrong = multi_head(x, w if family == "gemma2" else _without_sinks(w), is_causal=True,
                               scale=attn.scaling)[0]
    rel = float((got - want).abs().max() / want.abs().max())
    # transformers computes Olmo2RMSNorm (4e-8 here) and Gemma 2's eager softmax (1e-7) in float32 whatever the
    # input dtype; GPT-OSS's attention stays in float64
    assert rel <= (1e-12 if family == "gpt_oss" else 1e-6), rel
    assert float((wrong - want).abs().max() / want.abs().max()) > 1e-3
    if family == "gpt_oss":  # the sinks take a share of every row
        share = 1 - weights.sum(-1)
        assert float(share.min()) > 0 and float(share.mean()) > 0.01
    else:
        assert torch.allclose(weights.sum(-1), torch.ones((), dtype=torch.float64))


def _without_sinks(w):
    import dataclasses
    return dataclasses.replace(w, sinks=None)


def _heads_from(per, q, k, x, scale):
    """The causal attention of given per-head q [B, T, d] and k rows, values and W_O from `per`."""
    heads = []
    for i, qi in enumerate(q):
        j = per.kv_head(i)
        scores = (qi @ k[j].transpose(1, 2)) * scale
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        heads.append(torch.softmax(scores, -1) @ (x @ per.W_v[j]))
    return torch.cat(heads, -1) @ per.W_o


def test_a_one_layer_shape_of_an_moe_model_keeps_its_experts():
    """C4 / C5 count one layer of the model's shape: ModelShape.replace(n_layers=1) keeps the MoE layers' share."""
    from headcount.cost import ModelShape, param_counts

    mixtral = ModelShape(d_model=64, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=96, mlp="gated", n_experts=4,
                         experts_per_token=2, d_expert=96)
    one = mixtral.replace(n_layers=1)
    assert (one.n_layers, one.moe_layers) == (1, 1)
    assert param_counts(one)["total"] > param_counts(one)["active_per_token"]  # the experts are still there
    partial = ModelShape(d_model=64, n_heads=4, n_layers=4, d_ff=96, mlp="gated", n_experts=4, experts_per_token=2,
                         d_expert=96, moe_layers=3)
    assert partial.replace(n_layers=8).moe_layers == 6 and partial.replace(n_layers=1).moe_layers == 1
    assert partial.replace(n_layers=2, moe_layers=0).moe_layers == 0  # given explicitly: kept
