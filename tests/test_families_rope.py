"""The rotary families: Llama with rope types llama3 / yarn / dynamic, Qwen2 with YaRN, Phi-3 (fused
qkv_proj / gate_up_proj, LongRoPE, partial rotary), SmolLM3 (NoPE layers), Granite (multipliers), each a random
small config built with transformers' own config class (no download), against transformers: logits, 32 greedy
tokens, cached decoding = a full forward, save + reload bit-identical, export loadable by transformers. Then the
hub-id resolution, sharded bf16 checkpoints, and bad input."""

import copy
import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import CheckpointError, ModelNotFoundError, from_transformers, load  # noqa: E402
from headcount.models.exactness import ROPE_FAMILIES, _greedy, random_transformers_model  # noqa: E402
from headcount.models.formats.hf import export_transformers, from_state_dict, load_checkpoint  # noqa: E402
from headcount.models.formats.native import save  # noqa: E402

FAMILIES = list(ROPE_FAMILIES)
VOCAB = 512


def _ids(batch, length, seed):
    return torch.randint(3, 509, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These models are tiny: one thread is ~20x faster than two fighting over a shared CPU (the suite's)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pairs():
    """family -> (transformers model, headcount model), built once per module."""
    return {}


def _pair(pairs, family):
    if family not in pairs:
        hf = random_transformers_model(family)
        pairs[family] = (hf, from_transformers(hf))
    return pairs[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_greedy_and_cache_match_transformers(pairs, family):
    hf, ours = _pair(pairs, family)
    ids = _ids(2, 48, 1)  # past original_max_position_embeddings (32) where the rope type has one
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = ours(ids, attention_mask=mask).logits
    assert (out - ref)[mask.bool()].abs().max().item() <= 1e-4
    # 32 greedy tokens after 24 (a LongRoPE model crosses its 32-token boundary while decoding: both sides
    # run the whole sequence again there)
    greedy = _greedy(ours, hf, ids[0, :24].tolist(), 32)  # neither side stops at eos
    assert greedy["greedy_equal"] and greedy["greedy_tokens"] == 32 and greedy["distinct_tokens"] > 3
    # cached decoding (prefill 40, then one token at a time) = one full forward over the same 48 tokens, in
    # float64 so that "equal" is not blurred by float32 rounding of differently shaped matmuls
    seq, wide = ids[:1], copy.deepcopy(ours).double()
    cache = wide.new_cache(1, 48)
    with torch.no_grad():
        full = wide(seq).logits[0]
        steps = [wide(seq[:, :40], cache=cache).logits[0]]
        steps += [wide(seq[:, t:t + 1], cache=cache).logits[0] for t in range(40, 48)]
    assert (torch.cat(steps) - full).abs().max().item() <= 1e-9


@pytest.mark.parametrize("family", FAMILIES)
def test_save_reload_and_export(pairs, family, tmp_path):
    hf, ours = _pair(pairs, family)
    ids = _ids(1, 40, 3)
    save(ours, tmp_path / "saved")
    back = load(tmp_path / "saved")
    assert back.config == ours.config
    theirs = ours.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in back.state_dict().items())
    with torch.no_grad():
        assert torch.equal(back(ids).logits, ours(ids).logits)
        ref = hf(ids).logits
    export_transformers(ours, tmp_path / "hf")
    reread = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(reread).__name__ == type(hf).__name__
    with torch.no_grad():
        assert (reread(ids).logits - ref).abs().max().item() <= 1e-4
        assert (load_checkpoint(tmp_path / "hf")(ids).logits - ref).abs().max().item() <= 1e-4
    # `headcount cost PATH` on the exported config.json: its parameter count is the model's numel
    from typer.testing import CliRunner

    from headcount.cli import app

    result = CliRunner().invoke(app, ["cost", str(tmp_path / "hf" / "config.json"), "--json"])
    assert result.exit_code == 0, result.output
    cost = json.loads(result.output[result.output.index("{"):])
    assert cost["params"]["total"] == sum(p.numel() for p in ours.parameters())


def test_what_each_family_switches_on(pairs):
    """The switches are really on (the families are not silently the default Llama)."""
    _, phi3 = _pair(pairs, "phi3")
    assert phi3.rotary.rope_type == "longrope" and phi3.rotary.rotary_dim == 12 and phi3.config.head_dim == 16
    _, smol = _pair(pairs, "smollm3")
    assert [layer.use_rope for layer in smol.layers] == [True, False, True, False]
    _, granite = _pair(pairs, "granite")
    c = granite.config
    assert (c.embedding_multiplier, c.residual_multiplier, c.logits_scaling) == (6.0, 0.5, 4.0)
    assert granite.layers[0].attn.softmax_scale == 0.1
    assert [layer.attn.sliding_window for layer in smol.layers] == [None, 16, None, 16]
    for family, kind in (("llama rope llama3", "llama3"), ("qwen2 rope yarn", "yarn"), ("llama rope dynamic", "dynamic")):
        assert _pair(pairs, family)[1].rotary.rope_type == kind


def test_yarn_and_longrope_scale_cos_and_sin_as_transformers_does(pairs):
    """attention_factor (yarn's 0.1 ln(factor) + 1, longrope's sqrt(1 + ln(factor) / ln(original_max))) on the
    tables, and longrope's short / long factors, against transformers' rotary module."""
    for family in ("qwen2 rope yarn", "phi3"):
        hf, ours = _pair(pairs, family)
        x = torch.zeros(1, 1, 64)
        for end in (20, 48):  # below and past original_max_position_embeddings = 32
            pos = torch.arange(end)[None]
            cos, sin = hf.model.rotary_emb(x, pos)
            r = ours.rotary
            want_cos = cos[0]
            got_cos = r._long_tables(end)[0][:end] if (r._long_inv_freq is not None and end > r.switch_at) \
                else r.cos[:end]
            assert torch.equal(got_cos, want_cos), family
            assert r.attention_factor == hf.model.rotary_emb.attention_scaling


# ------------------------------------------------------------------------------------------- loading
def _tiny_hf(tmp_path, dtype=torch.float32, shard=None, **config):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64, **config)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    d = tmp_path / "ckpt"
    model.save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
    return d, model


def test_hub_id_resolves_to_the_local_cache(tmp_path, monkeypatch):
    d, hf = _tiny_hf(tmp_path)
    repo = tmp_path / "hfhome" / "hub" / "models--acme--tiny-llama"
    snap = repo / "snapshots" / "0123abcd"
    snap.parent.mkdir(parents=True)
    d.rename(snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "snapshots" / "old").mkdir()  # another revision: refs/main picks
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    ours = load("acme/tiny-llama")
    assert ours.name == "acme/tiny-llama"
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max().item() <= 1e-5
    with pytest.raises(ModelNotFoundError, match="models--acme--absent"):
        load("acme/absent")


def test_sharded_bf16_checkpoint_stays_bf16(tmp_path):
    d, hf = _tiny_hf(tmp_path, torch.bfloat16, shard="20KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    ours = load(d, dtype=torch.bfloat16)
    assert ours.embed.weight.dtype == torch.bfloat16
    sd = hf.state_dict()
    q = sd["model.layers.1.self_attn.q_proj.weight"]
    assert torch.equal(ours.layers[1].attn.qkv_proj.weight[:q.shape[0]], q)  # bit-identical, no fp32 round trip
    assert torch.equal(ours.lm_head.weight, sd["lm_head.weight"])


# ---------------------------------------------------------------------------------------- bad input
def _config(family, **changes):
    hf = random_transformers_model(family)
    return {**hf.config.to_dict(), **changes}, hf.state_dict()


@pytest.mark.parametrize("family,rope,field", [
    ("llama rope llama3", {"rope_type": "ntk-by-parts", "factor": 2.0}, "rope_type"),
    ("llama rope llama3", {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "low_freq_factor"),
    ("qwen2 rope yarn", {"rope_type": "yarn", "original_max_position_embeddings": 32}, "factor"),
    ("llama rope dynamic", {"rope_type": "dynamic"}, "factor"),
    ("phi3", {"rope_type": "longrope", "short_factor": [1.0] * 6}, "long_factor"),
    ("phi3", {"rope_type": "longrope", "short_factor": [1.0] * 5, "long_factor": [1.0] * 6}, "short_factor"),
    ("qwen2 rope yarn", {"rope_type": "yarn", "factor": 4.0, "low_freq_factor": 1.0}, "low_freq_factor"),
])
def test_rope_fields_missing_or_unknown_are_named(family, rope, field):
    cfg, sd = _config(family, rope_parameters=rope)
    with pytest.raises(CheckpointError, match=rf"rope_parameters\.{field}"):
        from_state_dict(cfg, sd)


def test_cli_bad_rope_and_absent_hub_id_one_line_exit_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from headcount.cli import app

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    d, _ = _tiny_hf(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}
    (d / "config.json").write_text(json.dumps(cfg))
    for model, fragment in ((str(d), "rope_parameters.low_freq_factor"),
                            ("acme/absent", str(tmp_path / "hfhome" / "hub" / "models--acme--absent"))):
        result = CliRunner().invoke(app, ["perplexity", "--model", model])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.output, result.output
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert not (tmp_path / "hfhome").exists()


def test_bench_exactness_families_flag(monkeypatch):
    """`headcount bench exactness --families` runs the random-family rows only (these families among them)."""
    from typer.testing import CliRunner

    from headcount.cli import app
    from headcount.models import exactness

    assert set(ROPE_FAMILIES) <= set(exactness.RANDOM_FAMILIES)
    monkeypatch.setattr(exactness, "random_families", lambda: [{"family": "stub"}])
    result = CliRunner().invoke(app, ["bench", "exactness", "--families", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):]) == {"families": [{"family": "stub"}]}
    result = CliRunner().invoke(app, ["bench", "exactness", "--families", "--models", "minilm"])
    assert result.exit_code == 2 and "--families" in result.output


def test_pruned_export(pairs, tmp_path):
    """A pruned model (2 of 4 query heads, one GQA group, per layer) exports: a rope-type Llama loads back in
    transformers equal to headcount's. A LongRoPE Phi-3 (Phi3Config sizes the factor lists by
    hidden_size // num_attention_heads) is written with its removed heads as zero heads: per-layer counts and
    uneven groups included, transformers alone gives the pruned model's logits, short and long factors."""
    for family in ("llama rope llama3", "phi3", "phi3 per layer"):
        model = copy.deepcopy(_pair(pairs, family.split()[0] if family.startswith("phi3") else family)[1])
        if family == "phi3 per layer":  # layer 0: a whole group (1 KV head left); 1: one head (uneven); 2: none
            model.layers[0].attn.prune_heads([0, 1])
            model.layers[1].attn.prune_heads([1])
        else:
            for layer in model.layers:
                layer.attn.prune_heads([0, 1])
        export_transformers(model, tmp_path / family)
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / family).eval()
        for length in (24, 40):  # LongRoPE: short factors, then long ones past original_max (32)
            ids = _ids(1, length, 4)
            with torch.no_grad():
                assert (back(ids).logits - model(ids).logits).abs().max().item() <= 1e-4, (family, length)
        if family.startswith("phi3"):
            assert back.config.num_attention_heads == 4


def test_merge_kv_on_partial_rotary_and_nope_layers(pairs):
    """merge-kv's default (aware) fit on Phi-3's partial rotary (turning pairs + unturned dims fitted apart)
    and on SmolLM3 (its NoPE layers fitted without the rotary constraint): it runs, and its logits on held-out
    tokens stay nearer the original's than the mean merge's (tests/test_families_merge.py has the exact cases)."""
    from headcount.surgery import merge_kv

    for family in ("phi3", "smollm3"):
        original = _pair(pairs, family)[1]
        aware, mean = copy.deepcopy(original), copy.deepcopy(original)
        merge_kv(aware, 1, local_steps=0, uptrain_steps=0, calibration=_ids(4, 64, 5), progress=False)
        merge_kv(mean, 1, method="mean", progress=False)
        assert all(layer.attn.n_kv_heads == 1 for model in (aware, mean) for layer in model.layers)
        ids = _ids(2, 48, 6)
        with torch.no_grad():
            want = original(ids).logits
            err_aware = float((aware(ids).logits - want).pow(2).mean())
            err_mean = float((mean(ids).logits - want).pow(2).mean())
        assert err_aware < err_mean, (family, err_aware, err_mean)
