"""The mixture-of-experts families and GPT-OSS's per-head sinks, against transformers 5 on random
small configs built with transformers' own config classes (no download): logits, 32 greedy tokens,
cached decoding past every window against a full forward, save + reload bit-identical, export back to a
checkpoint transformers loads with no headcount code; the sink's fused path against the formula; bad input."""

import copy
import functools
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import export_transformers, from_transformers, generate, load  # noqa: E402
from headcount.models.exactness import random_transformers_model  # noqa: E402
from headcount.models.formats.errors import CheckpointError  # noqa: E402

# small enough for a few seconds per family: 2 layers (GPT-OSS: one windowed, one full), window 8
TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=96)
WINDOW = 8
FAMILIES = {
    "mixtral": {"sliding_window": WINDOW, "intermediate_size": 48},
    "qwen3_moe": {"sliding_window": WINDOW, "head_dim": 24, "mlp_only_layers": [1], "intermediate_size": 80},
    "olmoe": {"intermediate_size": 48},  # no window in OLMoE: the cache check runs past none
    "gpt_oss": {"sliding_window": WINDOW, "head_dim": 16, "intermediate_size": 48},
}
PROMPT, NEW = 12, 32  # the prompt is past every window; 32 greedy tokens


@functools.lru_cache(maxsize=None)
def _built(family):
    hf = random_transformers_model(family, shape={**TINY, **FAMILIES[family]})
    with torch.no_grad():  # sinks big enough to take a visible share of each row
        for name, p in hf.named_parameters():
            if name.endswith("sinks"):
                p.mul_(10.0)
    return hf, from_transformers(hf)


def _pair(family):
    """(transformers model, headcount model), built once per family; the headcount model a fresh copy."""
    hf, ours = _built(family)
    return hf, copy.deepcopy(ours)


def _ids():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 125, (2, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    return ids, mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_transformers(family, tmp_path):
    hf, ours = _pair(family)
    assert ours.config.moe is not None and ours.config.family == family
    ids, mask = _ids()
    real = mask.bool()
    with torch.inference_mode():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        logits = ours(ids, attention_mask=mask).logits
    assert ref[real].abs().max() > 1.0
    assert (logits - ref)[real].abs().max() <= 1e-4

    # 32 greedy tokens after a prompt past the window, headcount's generate() (KV cache): each is transformers'
    # argmax after the tokens before it (one forward over the whole sequence: causal, so the same as its
    # greedy generate() token by token, without 32 of its forwards)
    prompt = ids[:1, :PROMPT]
    got = generate(ours, prompt[0].tolist(), NEW, stop_at_eos=False).new_ids
    seq = torch.tensor([prompt[0].tolist() + got])
    with torch.inference_mode():
        want = hf(input_ids=seq).logits[0, PROMPT - 1:-1].argmax(-1).tolist()
    assert got == want
    assert len(set(want)) > 4  # not collapsed onto one token

    # cached decoding, one token at a time past every window, = one full forward of the whole sequence
    with torch.inference_mode():
        full = ours(seq).logits[0]
        cache = ours.new_cache(1)
        steps = [ours(seq[:, :PROMPT], cache=cache).logits[0]]
        for t in range(PROMPT, seq.shape[1]):
            steps.append(ours(seq[:, t:t + 1], cache=cache).logits[0])
    assert (torch.cat(steps) - full).abs().max() <= 1e-4

    # headcount's own format: bit-identical after a reload
    from headcount.surgery import save

    save(ours, tmp_path / "saved")
    back = load(tmp_path / "saved")
    with torch.inference_mode():
        assert torch.equal(back(ids, attention_mask=mask).logits, logits)

    # export: transformers loads it by itself (AutoModelForCausalLM, no headcount code), logits within 1e-4
    export_transformers(ours, tmp_path / "hf")
    kw = {"attn_implementation": "eager"} if family == "gpt_oss" else {}
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32, **kw).eval()
    assert type(again).__name__ == type(hf).__name__
    with torch.inference_mode():
        assert (again(input_ids=ids, attention_mask=mask).logits - ref)[real].abs().max() <= 1e-4


def test_qwen3_moe_dense_layers_and_routers():
    _, ours = _pair("qwen3_moe")
    from headcount.models.decoder import GatedMLP
    from headcount.models.moe import MoEFeedForward

    assert isinstance(ours.layers[0].mlp, MoEFeedForward) and isinstance(ours.layers[1].mlp, GatedMLP)
    assert ours.layers[0].mlp.cfg.normalize is True
    _, gpt = _pair("gpt_oss")
    assert gpt.layers[0].mlp.cfg.router == "topk_softmax" and gpt.layers[0].attn.sinks is not None
    assert [layer.attn.sliding_window for layer in gpt.layers] == [WINDOW, None]


def test_experts_run_only_on_their_tokens():
    """Each expert sees exactly the tokens routed to it (counted by a hook on its weights' use)."""
    _, ours = _pair("mixtral")
    mlp = ours.layers[0].mlp
    seen = []
    real = mlp._expert
    mlp._expert = lambda e, h: (seen.append((e, h.shape[0])), real(e, h))[1]
    x = torch.randn(1, 10, 64)
    with torch.no_grad():
        _, _, index = mlp.route(x.reshape(-1, 64))
        mlp(x)
    counts = torch.bincount(index.reshape(-1), minlength=mlp.n_experts).tolist()
    assert seen == [(e, c) for e, c in enumerate(counts) if c]
    assert sum(c for _, c in seen) == 10 * mlp.top_k


def _sink_reference(q, k, v, sinks, scale, window=None):
    """The formula head by head: softmax over [scores | sink] (causal, optional window), sink dropped."""
    t, s = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    scores = q.double() @ k.transpose(-1, -2) * scale
    pos = torch.arange(s - t, s)[:, None]
    key = torch.arange(s)[None, :]
    allowed = key <= pos
    if window is not None:
        allowed &= key > pos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    col = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    w = torch.softmax(torch.cat([scores, col], -1), -1)[..., :-1]
    return w @ v


@pytest.mark.parametrize("grad", [False, True], ids=["CPU kernel's LSE", "chunked LSE (with grad)"])
def test_sinks_fused_path_matches_the_formula(grad):
    from headcount import kernels

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 300, 16, generator=g) for n in (4, 2, 2))  # 2 chunks of _logsumexp
    sinks = torch.randn(4, generator=g) * 3
    if grad:
        q.requires_grad_(True)
    for window in (None, 128):
        want = _sink_reference(q.detach(), k, v, sinks, 0.25, window)
        fused, _ = kernels.attend(q, k, v, is_causal=True, scale=0.25, window=window, sinks=sinks)
        eager, weights = kernels.attend(q, k, v, is_causal=True, scale=0.25, window=window, sinks=sinks,
                                        need_weights=True)
        assert (fused.double() - want).abs().max() < 1e-5 and (eager.double() - want).abs().max() < 1e-5
        assert (weights.sum(-1) < 1).all()  # the sink takes its share of every row
    if grad:
        fused.sum().backward()
        assert torch.isfinite(q.grad).all()


def test_pruning_a_head_drops_its_sink():
    """Pruned head h = head h gated to 0: the other heads keep their own sinks."""
    _, ours = _pair("gpt_oss")
    ids, _ = _ids()
    gates = torch.ones(2, 4)
    gates[0, 1] = 0.0
    with torch.no_grad():
        want = ours(ids, head_gates=gates).logits
        sinks = ours.layers[0].attn.sinks.detach().clone()
        ours.layers[0].attn.prune_heads([1])
        got = ours(ids).logits
    assert torch.equal(ours.layers[0].attn.sinks.detach(), sinks[[0, 2, 3]])
    assert (got - want).abs().max() < 1e-5


def test_expert_count_the_tensors_lack_is_one_line_naming_the_field(tmp_path):
    import json

    hf, ours = _pair("mixtral")
    export_transformers(ours, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["num_local_experts"] = 6
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as err:
        load(tmp_path / "m")
    msg = str(err.value)
    assert "\n" not in msg and "num_local_experts=6" in msg and "expected [6, 64]" in msg
    from typer.testing import CliRunner

    from headcount.cli import app

    result = CliRunner().invoke(app, ["perplexity", "--model", str(tmp_path / "m")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in (result.stderr if hasattr(result, "stderr") else result.output).splitlines() if line]
    assert len(lines) == 1 and "num_local_experts=6" in lines[0]
    # the hub's per-expert layout: one expert short
    sd = {k: v for k, v in hf.state_dict().items()}
    legacy = {}
    for name, t in sd.items():
        if ".mlp.experts.gate_up_proj" in name:
            base = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2)
                legacy[f"{base}{e}.w1.weight"], legacy[f"{base}{e}.w3.weight"] = gate, up
        elif ".mlp.experts.down_proj" in name:
            base = name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
            for e in range(t.shape[0]):
                legacy[f"{base}{e}.w2.weight"] = t[e]
        else:
            legacy[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t
    from headcount.models import from_state_dict

    cfg = hf.config.to_dict()
    again = from_state_dict(cfg, legacy)  # the per-expert layout reads to the same model
    ids, _ = _ids()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, ours(ids).logits)
    short = {k: v for k, v in legacy.items() if ".experts.3." not in k}
    with pytest.raises(CheckpointError, match=r"holds 3 experts .* num_local_experts=4"):
        from_state_dict(cfg, short)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cost_counts_total_and_active_parameters(family, tmp_path):
    """`headcount cost PATH`: total = every tensor transformers builds; active per token = total minus the
    experts a token does not read (n_experts - top_k of them in each MoE layer)."""
    from headcount.cost.accounts import param_counts
    from headcount.cost.shape import from_config

    hf, _ = _built(family)
    hf.config.to_json_file(str(tmp_path / "config.json"))
    counts = param_counts(from_config(tmp_path))
    total = sum(p.numel() for p in hf.parameters())
    assert counts["total"] == total
    layers = [layer.mlp for layer in hf.model.layers if hasattr(layer.mlp, "experts")]
    e, k = hf.config.num_local_experts if family != "qwen3_moe" else hf.config.num_experts, hf.config.num_experts_per_tok
    per_expert = sum(p[0].numel() for n, p in layers[0].experts.named_parameters())
    assert counts["active_per_token"] == total - len(layers) * (e - k) * per_expert


@pytest.mark.parametrize("family", list(FAMILIES))
def test_report_accounts_count_the_loaded_model(family):
    """The report's accounts (shape_of a loaded model): total = the model's own parameters."""
    from headcount.cost.accounts import param_counts
    from headcount.report.accounts import shape_of

    _, ours = _built(family)
    counts = param_counts(shape_of(ours))
    assert counts["total"] == sum(p.numel() for p in ours.parameters())
    assert counts["active_per_token"] < counts["total"]


def test_cost_of_mixtral_8x7b_is_the_published_46_7b_total_12_9b_active(tmp_path):
    import json

    from typer.testing import CliRunner

    from headcount.cli import app

    cfg = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
           "num_experts_per_tok": 2, "max_position_embeddings": 32768, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    result = CliRunner().invoke(app, ["cost", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    params = json.loads(result.output)["params"]
    assert round(params["total"] / 1e9, 1) == 46.7 and round(params["active_per_token"] / 1e9, 1) == 12.9


def _with_tokenizer():
    """A tiny GPT-OSS on a byte-level vocabulary of 260 tokens, with its tokenizer (roles / importance / prune)."""
    from tokenizers import pre_tokenizers

    from headcount.models.tokenizer import Tokenizer, byte_level_bpe

    tokens = ["<|endoftext|>"] + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he"]
    hf = random_transformers_model("gpt_oss", shape={**TINY, **FAMILIES["gpt_oss"], "vocab_size": len(tokens),
                                                     "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.mul_(10.0)
    model = from_transformers(hf)
    model.tokenizer = Tokenizer(byte_level_bpe(tokens, merges, special_ids=[0]), bos_token_id=0, eos_token_id=0,
                                pad_token_id=0, add_special_tokens=False)
    return hf, model


TEXT = ("The experts route each token to two of four feed-forward networks, and every head keeps a learned "
        "sink logit that takes its share of the softmax. ") * 6


def test_roles_show_the_declared_sinks_beside_the_measured_sink_role():
    from headcount.analysis import roles

    hf, model = _with_tokenizer()
    result = roles(model, TEXT, max_tokens=64, window=32, only=["sink"], progress=False)
    declared = result.to_json()["sink"]["declared"]
    sinks = [layer.self_attn.sinks.detach() for layer in hf.model.layers]
    assert [[round(x, 3) for x in row] for row in declared["logits"]] == [[round(float(x), 3) for x in s] for s in sinks]
    assert len(declared["weight"]) == 2 and all(0.0 < w < 1.0 for row in declared["weight"] for w in row)
    # the share a sink takes, from transformers' own eager weights (their sink column dropped): ours agree
    ids = torch.tensor([model.tokenizer.encode(TEXT)[:32]])
    with torch.no_grad():
        theirs = hf(input_ids=ids, output_attentions=True).attentions
        ours = model(ids, need_weights=True).weights
    for t, o in zip(theirs, ours):
        assert (t - o).abs().max() < 1e-5
        assert (1 - t.sum(-1)).min() >= -1e-6 and (1 - t.sum(-1)).mean() > 0.01  # the sinks take a share


def test_importance_and_retraining_free_prune_run_on_a_moe_model():
    from headcount.analysis import importance
    from headcount.surgery import prune

    _, model = _with_tokenizer()
    scores = importance(model, TEXT, window=32, max_windows=2, progress=False)
    assert torch.isfinite(torch.as_tensor(scores.scores)).all()
    ids = torch.tensor([model.tokenizer.encode(TEXT)[:32]])
    result = prune(model, {0: [1], 1: [2, 3]}, compensate="lstsq", calibration=TEXT, calibration_windows=2,
                   window=32, progress=False)
    assert [layer.attn.n_heads for layer in model.layers] == [3, 2]
    assert [tuple(layer.attn.sinks.shape) for layer in model.layers] == [(3,), (2,)]
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    assert result is not None


def test_generate_tp_over_3_ranks_equals_one_process():
    """Heads split over 3 gloo ranks (4 = 2 + 1 + 1, each with its heads' sinks), every expert's hidden units
    split alike, the router replicated: logits and greedy tokens as in one process."""
    from moe_tp_worker import tp_worker  # a module of its own: the ranks import it without transformers

    from headcount import distributed as runtime
    from headcount.parallel.transfer import share

    refs, payloads = {}, {}
    ids, mask = _ids()
    for family in ("gpt_oss",):  # experts with biases and sinks (the dense MLP's split is test_parallel's)
        _, model = _pair(family)
        with torch.no_grad():
            refs[family] = (model(ids, attention_mask=mask).logits[mask.bool()],
                            generate(model, ids[0, :PROMPT].tolist(), 8, stop_at_eos=False).new_ids)
        payloads[family] = share(model)
    results = runtime.spawn(tp_worker, 3, payloads, _ids(), PROMPT, timeout_s=120)
    for rank, r in enumerate(results):
        for family, (logits, tokens) in refs.items():
            assert (torch.tensor(r[family]["logits"]) - logits).abs().max() < 1e-5, (rank, family)
            assert r[family]["tokens"] == tokens
        assert r["gpt_oss"]["sinks"] == [[2, 1, 1][rank]] * 2


def test_merge_kv_keeps_every_query_heads_sink():
    """K/V merging changes KV heads only: each query head keeps its sink; the merged model runs."""
    from headcount.surgery import merge_kv

    _, model = _with_tokenizer()
    sinks = [layer.attn.sinks.detach().clone() for layer in model.layers]
    merge_kv(model, 1, local_steps=0, uptrain_steps=0, calibration=TEXT, n_windows=1, window=32, progress=False)
    assert [layer.attn.n_kv_heads for layer in model.layers] == [1, 1]
    assert all(torch.equal(layer.attn.sinks.detach(), s) for layer, s in zip(model.layers, sinks))
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([model.tokenizer.encode(TEXT)[:32]])).logits).all()


def test_faithfulness_and_rank_run_past_the_sliding_window():
    """faithfulness's adversarial search on a prompt longer than GPT-OSS's window (8 < 16): the batch's cache
    is filled by a forward (a sliding cache holds only its window, so copying it would lose positions)."""
    from headcount.analysis import faithfulness, rank

    _, model = _with_tokenizer()
    text = "".join(chr(c) for c in range(33, 127)) * 3  # 94 distinct byte tokens
    result = faithfulness(model, text, layers=[0], n_examples=1, length=16, steps=2, progress=False)
    heads = result.to_json()["heads"]
    assert len(heads) == 4 and all(isinstance(v, float) and v == v for h in heads for v in h.values()
                                   if isinstance(v, float))  # no NaN
    assert rank(model, text, max_windows=1, progress=False) is not None


def test_pruned_gpt_oss_exports_with_its_sinks_and_pruned_olmoe_is_refused(tmp_path):
    from headcount.surgery import prune

    _, model = _pair("gpt_oss")
    prune(model, {0: [1, 3], 1: [0, 2]}, compensate="none", progress=False)  # one head per KV group left
    export_transformers(model, tmp_path / "g")
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "g"), dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    assert again.model.layers[0].self_attn.sinks.shape == (2,)
    ids, _ = _ids()
    with torch.no_grad():
        assert (again(input_ids=ids).logits - model(ids).logits).abs().max() <= 1e-4
    _, olmoe = _pair("olmoe")
    prune(olmoe, {0: [0, 1], 1: [2, 3]}, mode="group", compensate="none", progress=False)
    with pytest.raises(ValueError, match="OlmoeForCausalLM sizes its q/k norms by hidden_size"):
        export_transformers(olmoe, tmp_path / "o")
    assert not (tmp_path / "o").exists()
