"""Families that change the decoder's structure: gemma2 (attention and final logit soft-capping,
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


# ------------------------------------------------------------------------------------- the three families
import warnings  # noqa: E402

from headcount import kernels  # noqa: E402
from headcount.models import CheckpointError, from_transformers, generate, load, load_checkpoint  # noqa: E402
from headcount.models import exactness  # noqa: E402
from headcount.models.formats.hf import export_transformers, from_state_dict  # noqa: E402
from headcount.surgery import save  # noqa: E402

FAMILIES = ("gemma2", "gpt_neox", "olmo2")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared, loaded 2-core machine two spinning
    threads made a 6-layer d_model-128 decode step take 0.8 s instead of 3 ms: one thread, restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    """(family, transformers model, headcount model): exactness's random small config of the family."""
    hf = exactness.random_transformers_model(request.param)
    return request.param, hf, from_transformers(hf)


def _ids(batch, length, seed=1):
    return torch.randint(3, 509, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_logits_on_a_padded_batch_and_32_greedy_tokens(pair):
    family, hf, ours = pair
    ids = _ids(2, 48)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        assert (ours(ids, attention_mask=mask).logits - ref)[mask.bool()].abs().max().item() <= 1e-4
    greedy = exactness._greedy(ours, hf, _ids(1, 24, seed=2)[0].tolist(), 32)  # no stop at eos: 32 tokens
    assert greedy["greedy_equal"] and greedy["greedy_tokens"] == 32 and greedy["distinct_tokens"] > 1


def test_cached_decoding_past_every_window_equals_a_full_forward(pair):
    _, _, ours = pair
    ids = _ids(1, 40, seed=4)  # windows are 16 (gemma2's local layers): 30 decode steps go past them
    with torch.no_grad():
        full = ours(ids).logits
        cache = ours.new_cache(1, 40)
        steps = [ours(ids[:, :10], cache=cache).logits]
        steps += [ours(ids[:, t:t + 1], cache=cache).logits for t in range(10, 40)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4


def test_save_reload_bit_identical_and_export_loads_in_transformers(pair, tmp_path):
    family, hf, ours = pair
    ids = _ids(1, 40, seed=5)
    with torch.no_grad():
        want = ours(ids).logits
        save(ours, tmp_path / "saved")
        assert torch.equal(load(tmp_path / "saved")(ids).logits, want)
        export_transformers(ours, tmp_path / "hf")
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()  # transformers code only
        assert type(back).__name__ == type(hf).__name__
        assert (back(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4
        assert (load_checkpoint(tmp_path / "hf")(ids).logits - want).abs().max().item() <= 1e-4
        hf.save_pretrained(tmp_path / "theirs")  # a checkpoint transformers itself wrote
        assert (load_checkpoint(tmp_path / "theirs")(ids).logits - want).abs().max().item() <= 1e-4


def test_prune_a_fraction_and_importance_run(pair, tmp_path):
    from headcount.analysis import importance
    from headcount.surgery import prune_to

    family, hf, _ = pair
    model = from_transformers(hf)
    cal = _ids(2, 24, seed=6)
    scores = importance(model, method="gradient", windows=cal, progress=False)
    assert tuple(scores.scores.shape) == (6, 4) and torch.isfinite(scores.scores).all()
    result = prune_to(model, 0.25, order="gradient", calibration=cal, progress=False)
    assert result.heads_after == 18 == sum(layer.attn.n_heads for layer in model.layers)
    with torch.no_grad():
        logits = model(cal).logits
    assert torch.isfinite(logits).all()
    if family == "olmo2":  # uniform, whole GQA groups too: the full-width norms renormalise over the heads kept,
        model = from_transformers(hf)  # which is exactly an Olmo2ForCausalLM with that many heads
        prune_to(model, 0.5, order="gradient", mode="group", uniform=True, compensate="none", calibration=cal,
                 progress=False)
        assert [(l.attn.n_heads, l.attn.n_kv_heads) for l in model.layers] == [(2, 1)] * 6
        with torch.no_grad():
            logits = model(cal).logits
    if family in ("gpt_neox", "olmo2"):  # gpt_neox: removed heads written back as zero heads
        export_transformers(model, tmp_path / "pruned")
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
        with torch.no_grad():
            assert (back(cal).logits - logits).abs().max().item() <= 1e-4


def test_olmo2_merge_kv_pools_the_full_width_k_norm_exactly_for_equal_heads(pair):
    family, hf, _ = pair
    if family != "olmo2":
        pytest.skip("olmo2 only")
    model = from_transformers(hf)
    attn, hd = model.layers[2].attn, model.layers[2].attn.head_dim  # 4 query heads, 2 KV heads
    with torch.no_grad():  # make KV head 1 equal KV head 0: K rows, V rows and k_norm weights
        w, nh = attn.qkv_proj.weight, attn.n_heads
        for part in (nh, nh + 2):  # K block, V block
            w[(part + 1) * hd:(part + 2) * hd] = w[part * hd:(part + 1) * hd]
        attn.k_norm.weight[hd:] = attn.k_norm.weight[:hd]
        ids = _ids(1, 20, seed=8)
        want = model(ids).logits
        attn.merge_kv_heads(1)
        assert attn.k_norm.weight.shape == (hd,) and attn.n_kv_heads == 1
        assert (model(ids).logits - want).abs().max().item() <= 1e-5


def test_gemma2_soft_capping_runs_in_query_chunks_and_reaches_the_loss(pair, monkeypatch):
    family, hf, ours = pair
    if family != "gemma2":
        pytest.skip("gemma2 only")
    ids = _ids(1, 64, seed=7)
    with torch.no_grad():
        ref = hf(ids).logits
        monkeypatch.setattr(kernels, "CAPPED_ELEMENTS", 4 * 64 * 8)  # 8-query chunks: the chunked path
        out = ours(ids)
        assert (out.logits - ref).abs().max().item() <= 1e-4
        weighted = ours(ids, need_weights=True).logits  # the eager path with weights, one chunk
        assert (weighted - ref).abs().max().item() <= 1e-4
        monkeypatch.setattr(kernels, "_MIN_CHUNK", 16)  # windowed layers: 16-query chunks over their band only
        assert (ours(ids).logits - ref).abs().max().item() <= 1e-4
        nll = ours.token_nll(out.hidden_states[:, :-1], ids[:, 1:])  # chunked_nll: the final soft-cap too
        want = torch.nn.functional.cross_entropy(ref[0, :-1], ids[0, 1:], reduction="none")
        assert (nll[0] - want).abs().max().item() <= 1e-4
    assert ref.abs().max().item() <= 10.0 and ours.config.final_softcap == 10.0


def test_gpt_neox_fused_qkv_is_split_per_head(pair):
    family, hf, ours = pair
    if family != "gpt_neox":
        pytest.skip("gpt_neox only")
    w = hf.gpt_neox.layers[0].attention.query_key_value.weight  # rows [n_heads, 3, head_dim]
    ours_w = ours.layers[0].attn.qkv_proj.weight  # rows [Q heads | K heads | V heads]
    hd = 32
    assert torch.equal(ours_w[hd:2 * hd], w[3 * hd:4 * hd])  # Q of head 1
    assert torch.equal(ours_w[4 * hd:5 * hd], w[hd:2 * hd])  # K of head 0
    assert ours.rotary.rotary_dim == 8 and ours.layers[0].parallel_residual


@pytest.mark.parametrize("family,field,value,fragment", [
    ("gemma2", "head_dim", 32, "head_dim=32"),
    ("olmo2", "num_key_value_heads", 1, "n_kv_heads=1"),
    ("gpt_neox", "num_attention_heads", 3, "num_attention_heads=3"),
])
def test_contradictory_config_is_one_line_naming_the_field(family, field, value, fragment):
    hf = exactness.random_transformers_model(family)
    cfg = {**hf.config.to_dict(), field: value}
    with pytest.raises(CheckpointError, match=fragment) as err:
        from_state_dict(cfg, hf.state_dict())
    assert "\n" not in str(err.value)


def _tp_worker(payloads: dict) -> dict:
    from headcount.models import generate
    from headcount.parallel import tensor_parallel
    from headcount.parallel.transfer import rebuild

    torch.set_num_threads(1)
    ids = _ids(1, 40, seed=9)
    out = {}
    for family, payload in payloads.items():
        model = tensor_parallel(rebuild(payload))
        with torch.no_grad():
            logits = model(ids).logits
        out[family] = {"logits": logits.flatten().tolist(),  # plain lists: shared memory goes with the rank
                       "tokens": generate(model, ids[0, :24].tolist(), 8, stop_at_eos=False).new_ids}
    return out


def test_generate_tensor_parallel_equals_one_process():
    """gemma2 (soft-capping on each rank's heads, the final cap on the replicated lm_head), gpt_neox
    (parallel residual, partial rotary) and olmo2 (full-width q/k norms: each rank's sum of squares summed
    over the ranks, KV head 1 held by ranks 1 and 2 counted once) on 3 gloo ranks (4 heads = 2 + 1 + 1, the
    uneven split; 2 ranks is the even case test_parallel_families covers for other families): logits and 8
    greedy tokens."""
    world = 3
    from headcount import distributed as runtime
    from headcount.parallel.transfer import share

    ids = _ids(1, 40, seed=9)
    payloads, want = {}, {}
    for family in FAMILIES:
        model = from_transformers(exactness.random_transformers_model(family))
        with torch.no_grad():
            want[family] = (model(ids).logits.flatten(), generate(model, ids[0, :24].tolist(), 8,
                                                                  stop_at_eos=False).new_ids)
        payloads[family] = share(model)
    results = runtime.spawn(_tp_worker, world, payloads, timeout_s=120)
    for family, (logits, tokens) in want.items():
        for r in results:
            assert (torch.tensor(r[family]["logits"]) - logits).abs().max().item() <= 1e-4
            assert r[family]["tokens"] == tokens
