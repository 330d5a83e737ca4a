"""export_gguf on qwen2 and gemma3 models: the architecture chosen (qwen2 as itself where llama.cpp's qwen2 graph
holds the heads, else deci with q/k/v biases; gemma3 as itself, per-layer counts padded with zero heads), round
trips through headcount.models.load with the same logits, the metadata llama.cpp reads, what `headcount export`
prints, and bad input. Tiny random models from transformers configs (as tests/test_models_gguf_qwen_gemma.py),
tokenizers from tiny GGUF vocabularies; llama.cpp itself runs them in tools/llamacpp_archs.py."""

import math
import os

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from headcount.cli import app  # noqa: E402
from headcount.head_surgery import merge_kv_heads  # noqa: E402
from headcount.models import from_transformers, load  # noqa: E402
from headcount.models.formats.gguf_deci import choose_architecture, export_gguf, plan_gguf_export  # noqa: E402
from headcount.models.formats.gguf_own import swa_period  # noqa: E402

runner = CliRunner()


# ------------------------------------------------------------------------------------------ fixtures
def _vocab_file(path, kind):
    """A GGUF holding only a tokenizer of the kind the real models ship: the one tools/llamacpp_archs.py runs in
    llama.cpp (qwen2: byte-level BPE, pre-tokenizer qwen2; gemma3: SentencePiece with byte pieces, add_bos)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from llamacpp_archs import tokenizer_gguf

    tokenizer_gguf(path, kind)
    return path


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    return {kind: _vocab_file(root / f"{kind}.gguf", kind) for kind in ("qwen2", "gemma3")}


def _randomised(hf, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in hf.named_parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * (0.02 if "embed" in name else 0.3))
    return hf.eval()


def qwen2():
    """Qwen2.5-shaped: GQA 4 query / 2 KV heads of 16 on d_model 64, q/k/v biases, tied embeddings."""
    cfg = transformers.Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=1e6, tie_word_embeddings=True)
    return from_transformers(_randomised(transformers.Qwen2ForCausalLM(cfg))).eval()


def gemma3(**overrides):
    """Gemma 3-shaped: 6 layers (5 sliding-window layers of 8 then a global one), 4 query heads / 1 KV head of 32
    on d_model 64, q/k norms, sandwich norms, tied embeddings."""
    kw = dict(vocab_size=268, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
              max_position_embeddings=128)
    cfg = transformers.Gemma3TextConfig(**{**kw, **overrides})
    return from_transformers(_randomised(transformers.Gemma3ForCausalLM(cfg))).eval()


def ids(vocab_size, t=24, seed=1):
    return torch.randint(4, vocab_size - 1, (2, t), generator=torch.Generator().manual_seed(seed))


def assert_same_logits(back, model, x):
    with torch.no_grad():
        want, got = model(x).logits, back(x).logits
    assert (got - want).abs().max().item() <= 1e-5


def meta(path, key):
    return gguf.GGUFReader(str(path)).fields[key].contents()


def _prune(model, layers):
    for i, heads in layers.items():
        model.layers[i].attn.prune_heads(heads)
    return model


# ------------------------------------------------------------------------------------------ qwen2
QWEN2_CASES = {  # name: (surgery, architecture llama.cpp gets)
    "unmodified": (lambda m: m, "qwen2"),
    "kv merged to 1": (lambda m: [merge_kv_heads(l.attn, 1) for l in m.layers] and m, "qwen2"),
    "query per layer": (lambda m: _prune(m, {0: [1], 2: [0, 3]}), "deci"),  # groups 1/2, 2/2, 1/1
    "query uniform": (lambda m: _prune(m, {i: [2] for i in range(3)}), "deci"),  # 3 x 16 != d_model 64
}


@pytest.mark.parametrize("case", list(QWEN2_CASES))
def test_qwen2_round_trip_and_architecture(tmp_path, vocab, case):
    surgery, arch = QWEN2_CASES[case]
    model = surgery(qwen2())
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["qwen2"])
    assert meta(path, "general.architecture") == arch == choose_architecture(model)[0]
    back = load(path, cache_dir=tmp_path / "cache")
    assert [l.attn.n_heads for l in back.layers] == [l.attn.n_heads for l in model.layers]
    assert_same_logits(back, model, ids(259))
    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert {f"blk.{i}.attn_{p}.bias" for i in range(3) for p in "qkv"} <= names  # the biases travel
    if arch == "qwen2":
        assert meta(path, "qwen2.attention.head_count") == 4
        assert meta(path, "qwen2.attention.head_count_kv") == model.layers[0].attn.n_kv_heads
        assert "output.weight" not in names  # tied, as Qwen2.5's own file
    else:
        assert meta(path, "deci.attention.head_count") == [l.attn.n_heads for l in model.layers]
        assert meta(path, "deci.attention.key_length") == 16


def test_qwen2_with_o_bias_goes_to_deci(tmp_path, vocab):
    model = qwen2()
    with torch.no_grad():
        model.layers[1].attn.o_proj.bias = torch.nn.Parameter(torch.randn(64) * 0.1)
    arch, why = choose_architecture(model)
    assert arch == "deci" and "layer 1's o_proj has a bias" in why
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["qwen2"])
    assert_same_logits(load(path), model, ids(259))


# ------------------------------------------------------------------------------------------ gemma3
@pytest.mark.parametrize("case", ["unmodified", "query uniform"])
def test_gemma3_round_trip_and_metadata(tmp_path, vocab, case):
    model = gemma3()
    if case == "query uniform":
        _prune(model, {i: [1] for i in range(6)})
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["gemma3"])
    heads = model.layers[0].attn.n_heads
    expect = {"general.architecture": "gemma3", "gemma3.attention.head_count": heads,
              "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 32,
              "gemma3.attention.value_length": 32, "gemma3.attention.sliding_window": 8,
              "gemma3.attention.sliding_window_pattern": 6, "gemma3.block_count": 6,
              "gemma3.embedding_length": 64, "gemma3.feed_forward_length": 96}
    reader = gguf.GGUFReader(str(path))
    for key, value in expect.items():
        assert reader.fields[key].contents() == value, key
    assert reader.fields["gemma3.rope.freq_base"].contents() == pytest.approx(1e6)
    assert reader.fields["gemma3.rope.freq_base_swa"].contents() == pytest.approx(1e4)
    tensors = {t.name: t for t in reader.tensors}
    # RMSNorm weights are llama.cpp's 1 + w: what headcount holds (transformers' w + 1)
    norm = np.asarray(tensors["blk.2.post_ffw_norm.weight"].data)
    assert np.array_equal(norm, model.layers[2].post_mlp_norm.weight.detach().numpy())
    assert tensors["blk.0.attn_q.weight"].shape.tolist() == [64, heads * 32]  # ggml order: [in, out]
    back = load(path, cache_dir=tmp_path / "cache")
    assert [l.attn.sliding_window for l in back.layers] == [8] * 5 + [None]
    assert_same_logits(back, model, ids(268, t=24))  # 24 tokens: past the 8-token window


def test_gemma3_scaling_and_all_local_layers(tmp_path, vocab):
    """Linear rotary scaling on the global layers and a pattern of only sliding-window layers (period 0)."""
    model = gemma3(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                   layer_types=["sliding_attention"] * 6)
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["gemma3"])
    assert meta(path, "gemma3.attention.sliding_window_pattern") == 0
    assert meta(path, "gemma3.rope.scaling.type") == "linear" and meta(path, "gemma3.rope.scaling.factor") == 2.0
    back = load(path, cache_dir=tmp_path / "cache")
    assert_same_logits(back, model, ids(268, t=24))


def test_swa_period_is_llama_cpp_pattern():
    assert swa_period([True] * 5 + [False]) == 6
    assert swa_period([True, False] * 3) == 2
    assert swa_period([True] * 4) == 0
    assert swa_period([False] * 3) == 1
    assert swa_period([False, True, True]) is None  # global first: llama.cpp cannot say it


def test_gemma3_plan_counts_window_layers_apart():
    model = _prune(gemma3(), {i: [0] for i in range(6)})
    plan = plan_gguf_export(model)
    assert plan["architecture"] == "gemma3" and plan["kv_heads_written"] == [1] * 6 and not plan["grows"]
    assert plan["sliding_window"] == 8 and plan["sliding_layers"] == 5
    assert plan["kv_bytes_per_token_llama_cpp"] == plan["kv_bytes_per_token_model"] == 2 * 1 * 32 * 2  # 1 global
    assert plan["kv_bytes_window_llama_cpp"] == 5 * 2 * 32 * 2 * 8
    assert plan["params_written"] == plan["params_model"] == sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------ bad input
def test_gemma3_per_layer_heads_are_padded_with_zero_heads(tmp_path, vocab):
    """llama.cpp's gemma3 builds every layer with one head count: the removed query heads are written as exact
    zero heads (the same logits), and the plan says llama.cpp saves no compute for them."""
    model = _prune(gemma3(), {1: [1], 3: [0, 2]})
    plan = plan_gguf_export(model)
    assert plan["query_heads_written"] == [4] * 6 and plan["zero_query_heads"] == 3
    assert "saves no compute" in plan["reason"] and "--uniform" in plan["reason"]
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["gemma3"])
    assert meta(path, "gemma3.attention.head_count") == 4
    assert_same_logits(load(path, cache_dir=tmp_path / "cache"), model, ids(268, t=24))


@pytest.mark.parametrize("change, match", [
    ("o_bias", "o_proj has a bias"),
    ("scale", "softmax_scale"),
    ("pattern", "not periodic"),
])
def test_gemma3_bad_input(tmp_path, vocab, change, match):
    model = gemma3(**({"layer_types": ["full_attention"] + ["sliding_attention"] * 5} if change == "pattern" else {}))
    if change == "o_bias":
        model.layers[0].attn.o_proj.bias = torch.nn.Parameter(torch.ones(64))
    elif change == "scale":
        for layer in model.layers:
            layer.attn.softmax_scale = 24 ** -0.5
    with pytest.raises(ValueError, match=match) as e:
        export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["gemma3"])
    assert "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())


def test_qwen2_sliding_window_refused(tmp_path, vocab):
    model = qwen2()
    model.config.sliding_window = 16
    with pytest.raises(ValueError, match="sliding_window=16; llama.cpp's deci graph has none"):
        export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab["qwen2"])


# ------------------------------------------------------------------------------------------ the command
def test_cli_export_says_which_architecture_and_why(tmp_path, vocab, monkeypatch):
    """A model loaded from a qwen2 GGUF, pruned per layer and saved, exported by `headcount export`: deci, and
    the printout names why and what llama.cpp will hold; the file reloads with the model's logits."""
    from headcount.surgery import save

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    source = export_gguf(qwen2(), tmp_path / "src.gguf", tokenizer_from=vocab["qwen2"])
    model = _prune(load(source), {0: [1], 2: [0, 3]})
    save(model, tmp_path / "pruned")
    out = tmp_path / "pruned.gguf"
    r = runner.invoke(app, ["export", "--model", str(tmp_path / "pruned"), "--to", "gguf", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "llama.cpp deci GGUF" in r.output
    assert "why deci: llama.cpp's qwen2 cannot hold it (layer 0 keeps 3 query heads x 16 = 48 != d_model 64" in r.output
    plan = plan_gguf_export(model)
    assert f"KV cache {plan['kv_bytes_per_token_llama_cpp']:,} bytes/token" in r.output
    assert plan["kv_heads_written"] == [3, 2, 2] and plan["grows"]  # groups 1/2: one KV head per query head
    assert_same_logits(load(out), model, ids(259))
    gemma = tmp_path / "gemma.gguf"
    export_gguf(gemma3(), gemma, tokenizer_from=vocab["gemma3"])
    r = runner.invoke(app, ["export", "--model", str(gemma), "--to", "gguf", "--out", str(tmp_path / "g.gguf")])
    assert r.exit_code == 0, r.output
    assert "llama.cpp gemma3 GGUF" in r.output and "on the 1 full-attention layers" in r.output
    assert "for the 5 sliding-window layers once 8 tokens fill their window" in r.output
    assert math.isclose(os.path.getsize(tmp_path / "g.gguf"), os.path.getsize(gemma), rel_tol=0.01)


def test_cli_exports_per_layer_gemma3_saying_no_compute_is_saved(tmp_path, vocab, monkeypatch):
    from headcount.surgery import save

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    source = export_gguf(gemma3(), tmp_path / "src.gguf", tokenizer_from=vocab["gemma3"])
    save(_prune(load(source), {1: [1]}), tmp_path / "pruned")
    out = tmp_path / "pruned.gguf"
    r = runner.invoke(app, ["export", "--model", str(tmp_path / "pruned"), "--to", "gguf", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "llama.cpp gemma3 GGUF" in r.output and "1 query heads are written as exact zeros" in r.output
    assert "saves no compute" in r.output and out.is_file()


def test_gemma3_f16_equals_the_model_with_weights_rounded_to_f16(tmp_path, vocab):
    model = _prune(gemma3(), {i: [2] for i in range(6)})
    path = export_gguf(model, tmp_path / "m.gguf", dtype="f16", tokenizer_from=vocab["gemma3"])
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.attn_q_norm.weight"] == "F32"
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    assert_same_logits(load(path, cache_dir=tmp_path / "cache"), model, ids(268))
