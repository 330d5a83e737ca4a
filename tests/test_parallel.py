"""Heads sharded over processes: tiny random models on 2 and 3 gloo ranks, one thread each.

The truth is the same model in one process: logits, greedy tokens with the KV cache, and the gradients
of the head gates and of a replicated weight, computed before sharding on every rank.
Workers are module-level functions: headcount.distributed.spawn starts them in fresh processes.
"""

import pytest
import torch

from headcount import distributed as runtime
from headcount.cost.head_split import head_plan, split_even, stored_kv_heads

# ------------------------------------------------------------------------------------------ shapes
LLAMA = dict(vocab_size=101, d_model=72, n_layers=2, n_heads=9, n_kv_heads=3, head_dim=8, d_ff=40, max_position=64,
             qkv_bias=True, o_bias=True, mlp_bias=True, eos_token_id=None)
GPT2 = dict(vocab_size=101, d_model=48, n_layers=2, n_heads=6, d_ff=50, max_position=64, norm="layer",
            mlp="gelu_tanh", position="learned", qkv_bias=True, o_bias=True, mlp_bias=True, tie_embeddings=False,
            family="gpt2")
BERT = dict(vocab_size=60, d_model=40, n_layers=2, n_heads=5, d_ff=34, max_position=32)


def _loss(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _tiny(cls_name: str, cfg: dict, seed: int = 0):
    """A random model at a realistic scale (weights ~ N(0, 0.1^2), so logits are O(1), as a trained model's)."""
    from headcount.models import decoder, encoder

    torch.manual_seed(seed)
    model = decoder.Decoder(decoder.DecoderConfig(**cfg)) if cls_name == "decoder" else \
        encoder.Encoder(encoder.EncoderConfig(**cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.1)
    return model.eval()


def _decoder_check(model, ids, *, group=None, gates_too=True) -> dict:
    from headcount.models import generate
    from headcount.parallel import tensor_parallel

    n_layers, n_heads = len(model.layers), model.layers[0].attn.n_heads
    with torch.no_grad():
        ref = model(ids).logits
    ref_tokens = generate(model, ids[0, :5].tolist(), 8, stop_at_eos=False).new_ids
    if gates_too:
        gates = torch.full((n_layers, n_heads), 0.9, requires_grad=True)
        _loss(model(ids, head_gates=gates).logits, ids).backward()
        ref_gate_grad, ref_embed_grad = gates.grad.clone(), model.embed.weight.grad.clone()
        model.zero_grad(set_to_none=True)
    full_cache = model.new_cache(1, 16)

    tensor_parallel(model, group)
    with torch.no_grad():
        out = model(ids).logits
    tokens = generate(model, ids[0, :5].tolist(), 8, stop_at_eos=False).new_ids
    attn = model.layers[0].attn
    kept = list(attn.kept_heads)
    cache = model.new_cache(1, 16)
    result = {
        "max_abs_diff": float((out - ref).abs().max()), "logit_scale": float(ref.abs().max()),
        "tokens": tokens, "ref_tokens": ref_tokens,
        "query_heads": list(attn.shard_plan.query_heads), "kv_heads": list(attn.shard_plan.kv_heads),
        "kept_heads": kept, "n_kv_heads": attn.n_kv_heads,
        "cache_nbytes": sum(c.nbytes for c in cache), "cache_kv_heads": cache[0].n_kv_heads,
        "full_cache_nbytes": sum(c.nbytes for c in full_cache),
        "params": sum(p.numel() for p in model.parameters()),
        "has_o_bias": attn.o_proj.bias is not None, "has_down_bias": model.layers[0].mlp.down_proj.bias is not None,
    }
    if gates_too:
        local = torch.full((n_layers, len(kept)), 0.9, requires_grad=True)
        _loss(model(ids, head_gates=local).logits, ids).backward()
        result.update(gate_grad_diff=float((local.grad - ref_gate_grad[:, kept]).abs().max()),
                      gate_grad_scale=float(ref_gate_grad.abs().max()),
                      embed_grad_diff=float((model.embed.weight.grad - ref_embed_grad).abs().max()))
    return result


def _encoder_check(model, ids, mask) -> dict:
    from headcount.parallel import tensor_parallel

    with torch.no_grad():
        ref = model(ids, mask)
        tensor_parallel(model)
        out = model(ids, mask)
    return {"hidden": float((out.last_hidden_state - ref.last_hidden_state).abs().max()),
            "pooled": float((out.pooler_output - ref.pooler_output).abs().max()),
            "n_heads": model.layers[0].attn.n_heads}


def _windows():
    return torch.randint(101, (5, 16), generator=torch.Generator().manual_seed(2))


def _error_of(fn) -> tuple[str, str] | None:
    try:
        fn()
    except Exception as err:  # the test asserts on the type and message
        return type(err).__name__, str(err)
    return None


def _battery(real) -> dict:
    """Everything one group of ranks checks, in one start-up (starting processes is the expensive part)."""
    import torch.distributed as dist

    from headcount.parallel import tensor_parallel
    from headcount.parallel.transfer import rebuild

    rank, world = dist.get_rank(), dist.get_world_size()
    ids = torch.randint(101, (2, 12), generator=torch.Generator().manual_seed(1))
    out = {}
    # failures first: the group must still work after them
    out["mismatch"] = _error_of(lambda: tensor_parallel(_tiny("decoder", LLAMA, seed=rank)))
    few = dict(LLAMA, n_heads=world - 1, n_kv_heads=1, d_model=8 * (world - 1), head_dim=8)
    out["too_many_ranks"] = _error_of(lambda: tensor_parallel(_tiny("decoder", few)))
    out["llama"] = _decoder_check(_tiny("decoder", LLAMA), ids)
    out["gpt2"] = _decoder_check(_tiny("decoder", GPT2), ids)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    out["bert"] = _encoder_check(_tiny("encoder", BERT), ids[:, :9] % 60, mask)
    from headcount.analysis.head_importance import importance

    out["importance"] = importance(_tiny("decoder", LLAMA), windows=_windows(), method="gradient",
                                   group=dist.group.WORLD, progress=False).scores.tolist()
    singles = [dist.new_group([r]) for r in range(world)]  # every rank takes part in creating each group
    out["group_of_one"] = _decoder_check(_tiny("decoder", LLAMA), ids, group=singles[rank], gates_too=False)
    if real is not None:
        smollm2, ref_logits, ref_tokens, minilm, ref_hidden, sentence = real
        model = rebuild(smollm2)
        tensor_parallel(model)
        prompt = ref_tokens[0]
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits
        from headcount.models import generate

        tokens = generate(model, prompt, len(ref_tokens[1]), stop_at_eos=False).new_ids
        out["smollm2"] = {"max_abs_diff": float((logits - ref_logits).abs().max()),
                          "logit_scale": float(ref_logits.abs().max()), "tokens_equal":
                          tokens == ref_tokens[1], "kv_heads": model.layers[0].attn.n_kv_heads}
        encoder = tensor_parallel(rebuild(minilm))
        with torch.no_grad():
            hidden = encoder(sentence).last_hidden_state
        out["minilm"] = {"max_abs_diff": float((hidden - ref_hidden).abs().max())}
    return out


def _fails_on_rank_1() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails before the all-reduce")
    dist.all_reduce(torch.ones(1))


# ------------------------------------------------------------------------------------------- plan
def test_plan_even_contiguous_and_kv_heads_read():
    assert [list(r) for r in split_even(9, 2)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    assert [len(r) for r in split_even(9, 4)] == [3, 2, 2, 2]
    plan = head_plan(9, 2, n_kv_heads=3)  # SmolLM2: q -> kv 0 0 0 1 1 1 2 2 2
    assert [p.kv_heads for p in plan] == [(0, 1), (1, 2)]
    assert [p.replicated_kv_heads for p in plan] == [(1,), (1,)]
    assert stored_kv_heads(plan) == 4
    plan = head_plan(32, 8, n_kv_heads=8)  # Llama 3 70B on 8 ranks: one KV head each, nothing replicated
    assert [p.kv_heads for p in plan] == [(r,) for r in range(8)] and stored_kv_heads(plan) == 8
    assert [p.kv_heads for p in head_plan(8, 4, n_kv_heads=1)] == [(0,)] * 4  # MQA: replicated everywhere
    assert head_plan(5, 2, kv_head_of=[0, 0, 1, 1, 1])[1].kv_heads == (1,)  # an uneven (pruned) map


def test_plan_bad_input():
    with pytest.raises(ValueError, match="more than n_heads=2"):
        head_plan(2, 3)
    with pytest.raises(ValueError, match="kv_head_of"):
        head_plan(4, 2, kv_head_of=[0, 0, 1])
    with pytest.raises(TypeError, match="world_size"):
        split_even(4, 2.0)


# -------------------------------------------------------------------------------- sharded models
_RESULTS: dict[int, list[dict]] = {}


@pytest.fixture(params=[2, 3], ids=["2 ranks", "3 ranks"])
def battery(request, smollm2, minilm):
    """Each world size starts once; SmolLM2 and MiniLM go to the ranks through shared memory."""
    world = request.param
    if world not in _RESULTS:
        from headcount.models import generate
        from headcount.parallel.transfer import share

        prompt = smollm2.tokenizer.encode("Heads are the natural unit to split")
        with torch.no_grad():
            ref_logits = smollm2(torch.tensor([prompt])).logits
        ref_new = generate(smollm2, prompt, 6, stop_at_eos=False).new_ids
        sentence = torch.tensor([minilm.tokenizer.encode("Each rank owns whole query heads.")])
        with torch.no_grad():
            ref_hidden = minilm(sentence).last_hidden_state
        real = (share(smollm2), ref_logits, (prompt, ref_new), share(minilm), ref_hidden, sentence)
        _RESULTS[world] = runtime.spawn(_battery, world, real, timeout_s=120)
    return world, _RESULTS[world]


def test_decoder_logits_tokens_gradients_and_cache(battery):
    world, results = battery
    plans = head_plan(9, world, n_kv_heads=3)
    assert sorted(h for r in results for h in r["llama"]["kept_heads"]) == list(range(9))
    for rank, all_checks in enumerate(results):
        r = all_checks["llama"]
        assert r["max_abs_diff"] < 1e-5 and r["logit_scale"] > 0.1, r
        assert r["tokens"] == r["ref_tokens"]
        assert r["gate_grad_diff"] < 1e-5 * max(1.0, r["gate_grad_scale"]), r  # Megatron's f / g: exact gradients
        assert r["embed_grad_diff"] < 1e-5, r  # a replicated weight gets the full gradient on every rank
        assert r["query_heads"] == list(plans[rank].query_heads) == r["kept_heads"]
        assert r["kv_heads"] == list(plans[rank].kv_heads) and r["n_kv_heads"] == len(plans[rank].kv_heads)
        # this rank's KVCache holds its KV heads only: 2 layers x 2 (K, V) x kv x 16 positions x 8 dims x 4 bytes
        assert r["cache_kv_heads"] == len(plans[rank].kv_heads)
        assert r["cache_nbytes"] == 2 * 2 * len(plans[rank].kv_heads) * 16 * 8 * 4
        assert r["has_o_bias"] == r["has_down_bias"] == (rank == 0)
    # the cost room's per-rank accounts count exactly the parameters each shard holds
    from headcount.cost.parallel import per_rank
    from headcount.cost.shape import ModelShape

    shape = ModelShape(d_model=72, n_heads=9, n_kv_heads=3, head_dim=8, n_layers=2, d_ff=40, mlp="gated",
                       vocab_size=101, tied_embeddings=True, position="rotary", attn_bias=True, o_bias=True,
                       mlp_bias=True, norm="rmsnorm", final_norm=True)
    accounts = per_rank(shape, world, seq=16, dtype="fp32")["per_rank"]
    assert [r["llama"]["params"] for r in results] == [a["params"]["total"] for a in accounts]
    assert [r["llama"]["cache_nbytes"] for r in results] == [a["kv_cache"]["bytes_for_context"] for a in accounts]
    llama = [r["llama"] for r in results]
    assert sum(r["cache_nbytes"] for r in llama) == llama[0]["full_cache_nbytes"] * stored_kv_heads(plans) // 3


def test_gpt2_shape_untied_learned_positions(battery):
    for all_checks in battery[1]:
        r = all_checks["gpt2"]
        assert r["max_abs_diff"] < 1e-5 and r["tokens"] == r["ref_tokens"], r
        assert r["gate_grad_diff"] < 1e-5 * max(1.0, r["gate_grad_scale"]) and r["embed_grad_diff"] < 1e-5, r


def test_encoder_with_padding(battery):
    world, results = battery
    assert [r["bert"]["n_heads"] for r in results] == [len(p) for p in split_even(5, world)]
    for r in results:
        assert r["bert"]["hidden"] < 1e-5 and r["bert"]["pooled"] < 1e-5, r["bert"]


def test_real_models_smollm2_and_minilm(battery):
    world, results = battery
    for rank, r in enumerate(results):
        # SmolLM2's logits reach ~35 and its residual stream has outliers: a different summation order
        # (partial o_proj / down_proj sums added by the all-reduce) moves them by a few fp32 ulps, ~5e-5,
        # less than fp32's own error on this model (1.2e-4 against the same model in float64). The bar
        # is therefore 1e-5 of the logits' scale, and 1e-4 absolute.
        d = r["smollm2"]
        assert d["max_abs_diff"] < 1e-5 * d["logit_scale"] and d["max_abs_diff"] < 1e-4, d
        assert r["smollm2"]["tokens_equal"]
        assert r["smollm2"]["kv_heads"] == len(head_plan(9, world, n_kv_heads=3)[rank].kv_heads)
        assert r["minilm"]["max_abs_diff"] < 1e-5, r["minilm"]


def test_group_of_one_is_the_model_itself(battery):
    for r in battery[1]:
        g = r["group_of_one"]
        assert g["max_abs_diff"] == 0 and g["tokens"] == g["ref_tokens"] and g["kept_heads"] == list(range(9))


def test_data_parallel_importance_equals_one_process(battery):
    """helper-1's importance(group=): rank r scores windows r::world, sums all-reduced."""
    from headcount.analysis.head_importance import importance

    world, results = battery
    one = importance(_tiny("decoder", LLAMA), windows=_windows(), method="gradient", progress=False).scores
    for r in results:
        scores = torch.tensor(r["importance"], dtype=one.dtype)
        rel = float((scores - one).abs().max() / one.abs().max())
        assert rel < 1e-6, rel


# -------------------------------------------------------------------------------------- bad input
def test_more_ranks_than_heads_raises_on_every_rank(battery):
    world, results = battery
    for r in results:
        etype, msg = r["too_many_ranks"]
        assert etype == "ValueError" and f"{world} ranks is more than n_heads={world - 1}" in msg


def test_ranks_that_disagree_on_the_model_fail_on_every_rank(battery):
    world, results = battery
    for r in results:
        etype, msg = r["mismatch"]
        assert etype == "WeightMismatchError" and all(f"rank {i}:" in msg for i in range(world)), msg


def test_a_rank_that_raises_is_reported_and_none_hangs():
    outcomes = runtime.spawn(_fails_on_rank_1, 2, timeout_s=5, raise_errors=False)
    assert outcomes[1].error_type == "RuntimeError" and "rank 1 fails" in outcomes[1].error
    # rank 0 waited in a collective for rank 1: the group's timeout ended the wait with an error
    assert not outcomes[0].ok and outcomes[0].error_type != "Timeout", outcomes[0]


def test_no_process_group_says_how_to_start():
    from headcount import MultiHeadAttention
    from headcount.parallel import shard_heads

    with pytest.raises(runtime.NotInitializedError, match="torchrun --nproc-per-node"):
        shard_heads(MultiHeadAttention(16, 2))
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        shard_heads(torch.nn.Linear(2, 2))


def test_tp_with_a_world_of_one_is_fine_and_says_so(monkeypatch):
    """What `headcount generate --tp` does without torchrun: a group of one process, nothing sharded."""
    import torch.distributed as dist

    from headcount.parallel.model import tensor_parallel_from_env

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    model = _tiny("decoder", LLAMA)
    ids = torch.randint(101, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).logits
    said = []
    try:
        assert tensor_parallel_from_env(model, log=said.append, timeout_s=30) is True
        assert dist.get_world_size() == 1
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref)
    finally:
        runtime.shutdown()
    assert len(said) == 1 and "world size of 1" in said[0] and "torchrun --nproc-per-node N" in said[0]
    assert not dist.is_initialized()


@pytest.mark.parametrize("args, fragment", [(["--new-tokens", "0"], "--new-tokens"), (["--timeout", "-1"], "--timeout")])
def test_check_bad_input_one_line_exit_2(args, fragment):
    from typer.testing import CliRunner

    from headcount.parallel.check import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.output


def test_bench_parallel_bad_input_one_line_exit_2():
    from typer.testing import CliRunner

    from headcount.cli import app

    result = CliRunner().invoke(app, ["bench", "parallel", "--repeats", "0"])
    assert result.exit_code == 2 and "--repeats" in result.stderr and "Traceback" not in result.output
