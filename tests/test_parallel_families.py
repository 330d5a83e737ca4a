"""Tensor parallel on the qwen2 and gemma3_text families: random small models of each (the
exactness bench's, headcount.models.exactness.random_transformers_model, converted by from_transformers)
on 2 and 3 gloo ranks against the same model in one process.

What the families add to the sharded path: qwen2's q/k/v biases (rows taken with their heads), gemma3's
per-head q/k RMSNorm, its sandwich norms (after the all-reduce: replicated), its sliding-window layers (a
padded batch longer than the window of 16, and greedy decoding from a 24-token prompt with each rank's
sliding KV cache), and uneven splits: 4 query heads over 3 ranks = 2 + 1 + 1, gemma3's one KV head held on
every rank, qwen2's KV head 1 held by ranks 1 and 2.
"""

import pytest
import torch

from headcount import distributed as runtime
from headcount.cost.head_split import head_plan

transformers = pytest.importorskip("transformers")

FAMILIES = ("qwen2", "gemma3_text")
NEW_TOKENS = 12


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 509, (2, 40), generator=g)  # 0-2: pad / bos / eos
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    return ids, mask


def _worker(payloads: dict) -> dict:
    from headcount.models import generate
    from headcount.parallel import tensor_parallel
    from headcount.parallel.transfer import rebuild

    ids, mask = _inputs()
    out = {}
    for family, payload in payloads.items():
        model = tensor_parallel(rebuild(payload))
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
        tokens = generate(model, ids[0, :24].tolist(), NEW_TOKENS, stop_at_eos=False).new_ids
        cache = model.new_cache(1, 64)
        attn = [layer.attn for layer in model.layers]
        out[family] = {
            # plain lists: a tensor would travel through shared memory, gone when the rank exits
            "logits": logits[mask.bool()].tolist(), "tokens": tokens,
            "query_heads": list(attn[0].kept_heads), "kv_heads": list(attn[0].shard_plan.kv_heads),
            "n_kv_heads": attn[0].n_kv_heads, "cache_kv_heads": [c.n_kv_heads for c in cache],
            "windows": [a.sliding_window for a in attn],
            "qk_norm": [a.q_norm is not None and a.k_norm is not None for a in attn],
            "qkv_bias": attn[0].qkv_proj.bias is not None,
            "qkv_rows": attn[0].qkv_proj.out_features,
        }
    return out


@pytest.fixture(scope="module")
def reference():
    """Each family's model in one process: its payload for the ranks, logits on the padded batch (real
    tokens), greedy tokens after 24 tokens, its windows and head layout."""
    import warnings

    from headcount.models import from_transformers, generate
    from headcount.models.exactness import random_transformers_model
    from headcount.parallel.transfer import share

    ids, mask = _inputs()
    out = {}
    for family in FAMILIES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = from_transformers(random_transformers_model(family))
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits[mask.bool()]
        tokens = generate(model, ids[0, :24].tolist(), NEW_TOKENS, stop_at_eos=False).new_ids
        attn = model.layers[0].attn
        out[family] = {"payload": share(model), "logits": logits, "tokens": tokens,
                       "windows": [layer.attn.sliding_window for layer in model.layers],
                       "n_heads": attn.n_heads, "n_kv_heads": attn.n_kv_heads, "head_dim": attn.head_dim}
    return out


_RESULTS: dict = {}


@pytest.fixture(params=[2, 3], ids=["2 ranks", "3 ranks"])
def sharded(request, reference):
    world = request.param
    if world not in _RESULTS:
        payloads = {family: r["payload"] for family, r in reference.items()}
        _RESULTS[world] = runtime.spawn(_worker, world, payloads, timeout_s=120)
    return world, _RESULTS[world]


@pytest.mark.parametrize("family", FAMILIES)
def test_tp_equals_one_process(sharded, reference, family):
    world, results = sharded
    ref = reference[family]
    scale = float(ref["logits"].abs().max())
    assert scale > 0.1
    plans = head_plan(ref["n_heads"], world, n_kv_heads=ref["n_kv_heads"])
    assert sorted(h for r in results for h in r[family]["query_heads"]) == list(range(ref["n_heads"]))
    for rank, r in enumerate(r_[family] for r_ in results):
        diff = float((torch.tensor(r["logits"]) - ref["logits"]).abs().max())
        assert diff < 1e-5 * max(1.0, scale), (rank, diff, scale)
        assert r["tokens"] == ref["tokens"], rank
        assert r["query_heads"] == list(plans[rank].query_heads)
        assert r["kv_heads"] == list(plans[rank].kv_heads) and r["n_kv_heads"] == len(plans[rank].kv_heads)
        assert r["cache_kv_heads"] == [len(plans[rank].kv_heads)] * len(r["cache_kv_heads"])
        assert r["windows"] == ref["windows"] and 16 in ref["windows"] and None in ref["windows"]
        rows = (len(plans[rank].query_heads) + 2 * len(plans[rank].kv_heads)) * ref["head_dim"]
        assert r["qkv_rows"] == rows
        if family == "qwen2":
            assert r["qkv_bias"] and not any(r["qk_norm"])
        else:
            assert all(r["qk_norm"]) and not r["qkv_bias"]


def test_the_splits_are_the_uneven_ones(reference):
    """4 query heads over 3 ranks: 2 + 1 + 1; gemma3's one KV head on every rank; qwen2's KV head 1 on ranks 1
    and 2."""
    assert [len(p.query_heads) for p in head_plan(4, 3, n_kv_heads=1)] == [2, 1, 1]
    assert [p.kv_heads for p in head_plan(4, 3, n_kv_heads=1)] == [(0,)] * 3
    assert [p.kv_heads for p in head_plan(4, 3, n_kv_heads=2)] == [(0,), (1,), (1,)]
    assert (reference["gemma3_text"]["n_heads"], reference["gemma3_text"]["n_kv_heads"]) == (4, 1)
    assert (reference["qwen2"]["n_heads"], reference["qwen2"]["n_kv_heads"]) == (4, 2)
