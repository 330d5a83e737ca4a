"""export_gguf's second exact layout for unevenly grouped GQA layers: groups="pad" fills every group of a layer up
to its largest with zero query heads, so the layer keeps its own K/V heads (llama.cpp's KV cache stays the
model's) where groups="copy" (the default) writes K/V copies. Checked: the padded file read back by headcount and
run by llama.cpp gives the pruned model's logits; its KV heads per layer are the model's; "auto" picks per layer
the smaller KV cache by a formula over the group sizes; padded_group_layout is exact on random groupings; the CLI's
--groups, including a bad value (exit 2)."""

import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from headcount.cli import app
from headcount.models import Decoder, DecoderConfig, load
from headcount.models.formats.gguf_deci import export_gguf, plan_gguf_export
from headcount.models.formats.gguf_write import group_layout, layer_layout, padded_group_layout
from headcount.surgery import prune, save

gguf = pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from llamacpp_archs import tiny as arch_tiny, tokenizer_gguf  # noqa: E402

runner = CliRunner()
HD = 8
# layer 0: groups 6, 5 (qwen2.5-0.5b's 14 / 2 shape, pruned); layer 1: 3, 5; layer 2 untouched (6, 6)
UNEVEN = {0: [6], 1: [0, 1, 2, 6]}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """A tokenizer-only GGUF (byte-level BPE, qwen2's pre-tokenizer: one llama.cpp reads) and its size."""
    path = tmp_path_factory.mktemp("vocab") / "qwen2.gguf"
    return path, tokenizer_gguf(path, "qwen2")


def llama(vocab_size: int, n_heads=12, n_kv=2, seed=0) -> Decoder:
    """A random float32 Llama decoder with an o_proj bias (what mean compensation fits)."""
    cfg = DecoderConfig(vocab_size=vocab_size, d_model=64, n_layers=3, n_heads=n_heads, n_kv_heads=n_kv,
                        head_dim=HD, d_ff=64, max_position=64, o_bias=True, rope_theta=10000.0, norm_eps=1e-5)
    g = torch.Generator().manual_seed(seed)
    model = Decoder(cfg).eval()
    with torch.no_grad():  # sharper attention than the default init: a head read from the wrong KV head shows
        for name, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=g) + 0.5 if name.endswith("norm.weight")
                    else torch.randn(p.shape, generator=g) * 0.3)
    return model


def ids(vocab_size, n=2, t=20, seed=7):
    return torch.randint(4, vocab_size - 1, (n, t), generator=torch.Generator().manual_seed(seed))


def group_sizes(kv_head_of) -> list[int]:
    return list(Counter(int(k) for k in kv_head_of).values())


def pruned_llama(vocab_size):
    model = llama(vocab_size)
    prune(model, UNEVEN, mode="query", compensate="mean", calibration=ids(vocab_size, 4, 24, seed=1), progress=False)
    assert [sorted(group_sizes(l.attn.kv_head_of)) for l in model.layers] == [[5, 6], [3, 5], [6, 6]]
    return model


def pruned_qwen2(vocab_size):
    model = arch_tiny("qwen2", vocab_size)  # 3 layers x 4 query heads over 2 KV heads, q/k/v biases
    prune(model, {0: [1], 2: [2]}, mode="query", compensate="none", progress=False)  # groups 1, 2 and 2, 1
    return model


def fields(path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: np.asarray(t.data) for t in r.tensors}


# ------------------------------------------------------------------------------------------ the padded file
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_padded_file_reads_back_with_the_models_logits_and_kv_heads(tmp_path, vocab, family):
    tok, n_vocab = vocab
    model = pruned_llama(n_vocab) if family == "llama" else pruned_qwen2(n_vocab)
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=tok, groups="pad")
    meta, tensors = fields(path)
    assert meta["general.architecture"] == "deci"
    sizes = [group_sizes(l.attn.kv_head_of) for l in model.layers]
    # each layer keeps its KV heads; its query heads become groups x the largest group
    assert meta["deci.attention.head_count_kv"] == [l.attn.n_kv_heads for l in model.layers]
    assert meta["deci.attention.head_count"] == [len(s) * max(s) for s in sizes]
    dh = model.config.head_dim
    for i, s in enumerate(sizes):  # the zero heads: zero o_proj columns (and zero Q rows), one per missing query
        nh = len(s) * max(s)
        out_cols = tensors[f"blk.{i}.attn_output.weight"].reshape(-1, nh, dh)
        q_rows = tensors[f"blk.{i}.attn_q.weight"].reshape(nh, dh, -1)
        zero = [h for h in range(nh) if not np.abs(out_cols[:, h]).any()]
        assert len(zero) == nh - sum(s) and all(not np.abs(q_rows[h]).any() for h in zero)
    back = load(path)
    assert [l.attn.n_kv_heads for l in back.layers] == [l.attn.n_kv_heads for l in model.layers]
    x = ids(n_vocab)
    with torch.no_grad():  # the truth: the pruned model in memory
        want, got = model(x).logits, back(x).logits
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


def test_uniform_layers_and_the_default_are_unchanged(tmp_path, vocab):
    """A uniform model: the same bytes in every mode. An uneven one: no groups= is groups="copy"."""
    tok, n_vocab = vocab
    model = llama(n_vocab)
    files = [export_gguf(model, tmp_path / f"{g}.gguf", tokenizer_from=tok, groups=g).read_bytes()
             for g in ("copy", "pad", "auto")]
    assert files[0] == files[1] == files[2]
    uneven = pruned_llama(n_vocab)
    default = export_gguf(uneven, tmp_path / "default.gguf", tokenizer_from=tok)
    copy = export_gguf(uneven, tmp_path / "copy2.gguf", tokenizer_from=tok, groups="copy")
    assert default.read_bytes() == copy.read_bytes()
    assert fields(default)[0]["deci.attention.head_count_kv"] == [
        sum(s) // math.gcd(*s) for s in (group_sizes(l.attn.kv_head_of) for l in uneven.layers)]


# ------------------------------------------------------------------------------------------ llama.cpp
def test_llama_cpp_runs_the_padded_file_as_headcount_does(tmp_path, vocab):
    from llamacpp_archs import N_GREEDY, N_IDS, N_PROMPT, llama_cpp
    from llamacpp_compare import check_node

    reason = check_node()
    if reason:
        pytest.skip(f"llama.cpp is unavailable: {reason}")
    from headcount.models import generate

    tok, n_vocab = vocab
    model = pruned_qwen2(n_vocab)
    path = export_gguf(model, tmp_path / "pad.gguf", tokenizer_from=tok, groups="pad")
    assert fields(path)[0]["deci.attention.head_count_kv"] == [2, 2, 2]
    x = ids(n_vocab, 1, N_IDS, seed=1)[0].tolist()
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([x])).logits[0].double(), -1)
        want = [logp[j, x[j + 1]].item() for j in range(N_IDS - 1)]
        greedy = generate(model, x[:N_PROMPT], N_GREEDY, stop_at_eos=False).new_ids
    got = llama_cpp(path, x)  # f32 KV cache: the same math as headcount's fp32 model
    assert "error" not in got, got
    # float32 in both, summed in other orders: measured 1.1e-4 here, the same as the copy layout's file
    assert max(abs(a - b) for a, b in zip(want, got["logprobs"][0])) < 1e-3
    assert got["greedy"] == list(greedy)


# ------------------------------------------------------------------------------------------ choosing
def test_auto_picks_per_layer_the_smaller_kv_cache(vocab):
    """Against a formula over each layer's group sizes s: copy writes sum(s) / gcd(s) KV heads and sum(s) query
    heads, pad len(s) KV heads and len(s) * max(s) query heads; auto takes the fewer KV heads, then the fewer
    extra heads (each extra head, copied K+V or zero Q+O, costs 2 x head_dim x d_model parameters)."""
    _, n_vocab = vocab
    model = llama(n_vocab, n_heads=12, n_kv=3)
    rng = np.random.default_rng(0)
    plan = {i: sorted(rng.choice(12, size=int(rng.integers(0, 5)), replace=False).tolist()) for i in range(3)}
    prune(model, {i: h for i, h in plan.items() if h}, mode="query", compensate="none", progress=False)
    sizes = [group_sizes(l.attn.kv_head_of) for l in model.layers]
    copy_cost = [(sum(s) // math.gcd(*s), sum(s) // math.gcd(*s) - len(s)) for s in sizes]
    pad_cost = [(len(s), len(s) * max(s) - sum(s)) for s in sizes]
    auto = plan_gguf_export(model, groups="auto")
    assert {"pad", "uniform"} <= set(auto["layouts"])  # the seed gives both kinds of layer
    assert auto["kv_heads_written"] == [min(c, p)[0] for c, p in zip(copy_cost, pad_cost)]
    assert auto["layouts"] == ["uniform" if len(set(s)) == 1 else "pad" if p < c else "copy"
                               for s, c, p in zip(sizes, copy_cost, pad_cost)]
    assert auto["zero_query_heads_per_layer"] == [p[1] if kind == "pad" else 0
                                                  for p, kind in zip(pad_cost, auto["layouts"])]
    extra = sum(min(c, p)[1] for c, p in zip(copy_cost, pad_cost))
    assert auto["params_written"] - auto["params_model"] == 2 * extra * HD * model.config.d_model
    copy = plan_gguf_export(model)
    assert copy["kv_heads_written"] == [c[0] for c in copy_cost] and copy["zero_query_heads"] == 0
    assert copy["kv_heads_copied_per_layer"] == [c[0] - len(s) for c, s in zip(copy_cost, sizes)]
    assert auto["grows"] is False and auto["kv_bytes_per_token_llama_cpp"] == auto["kv_bytes_per_token_model"]


def test_qwen2_padding_goes_to_deci_and_gemma3_keeps_its_own_padding(vocab, tmp_path):
    """A qwen2 whose K/V merge left uneven groups but every query head fits llama.cpp's own qwen2 with copies;
    padded, its query heads no longer fill d_model, so deci. Gemma 3 pads its own way whatever groups says."""
    _, n_vocab = vocab
    cfg = DecoderConfig(vocab_size=n_vocab, d_model=6 * 32, n_layers=2, n_heads=6, n_kv_heads=3, head_dim=32,
                        d_ff=64, max_position=64, qkv_bias=True, family="qwen2")
    model = Decoder(cfg).eval()
    from headcount.surgery import merge_kv

    for i in range(2):  # 3 -> 2 KV heads, old heads 0 and 2 sharing one: groups 4, 2 in every layer
        merge_kv(model, 2, local_steps=0, uptrain_steps=0, layers=[i], grouping=[[0, 2], [1]],
                 calibration=ids(n_vocab, 2, 16), progress=False)
    assert all(sorted(group_sizes(l.attn.kv_head_of)) == [2, 4] for l in model.layers)
    copy = plan_gguf_export(model)
    assert copy["architecture"] == "qwen2" and copy["kv_heads_written"] == [3, 3]
    pad = plan_gguf_export(model, groups="pad")
    assert pad["architecture"] == "deci" and "d_model" in pad["reason"]
    assert pad["kv_heads_written"] == [2, 2] and pad["query_heads_written"] == [8, 8]

    gemma = arch_tiny("gemma3", n_vocab)
    prune(gemma, {1: [1], 3: [0, 2]}, mode="query", compensate="none", progress=False)
    plans = [plan_gguf_export(gemma, groups=g) for g in ("copy", "pad", "auto")]
    for p in plans:
        p.pop("groups")
    assert plans[0] == plans[1] == plans[2] and plans[0]["architecture"] == "gemma3"


# ------------------------------------------------------------------------------------------ the layout itself
@settings(max_examples=60)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=24))
def test_padded_group_layout_is_exact_on_any_grouping(kv_head_of):
    order, kv = padded_group_layout(kv_head_of)
    sizes = group_sizes(kv_head_of)
    assert kv == sorted(set(kv_head_of))  # each KV head some query reads, written once
    assert len(order) % len(kv) == 0
    m = len(order) // len(kv)
    assert m == max(sizes)
    assert sorted(h for h in order if h is not None) == list(range(len(kv_head_of)))  # every query head, once
    assert order.count(None) == len(kv) * m - len(kv_head_of)  # the rest are zero slots
    for j, h in enumerate(order):  # llama.cpp's broadcast: written query head j reads KV slot j // m
        if h is not None:
            assert kv[j // m] == kv_head_of[h]
    kind, _, _ = layer_layout(kv_head_of, "auto")
    assert kind == ("uniform" if len(set(sizes)) == 1 else "pad")
    if kind == "uniform":  # equal groups: padding adds nothing, and the layout is group_layout's
        assert (order, kv) == group_layout(kv_head_of)


# ------------------------------------------------------------------------------------------ the CLI
@pytest.fixture
def saved(tmp_path, vocab):
    """A pruned llama saved with a GGUF behind it (the tokenizer source `headcount export` follows)."""
    tok, n_vocab = vocab
    source = export_gguf(llama(n_vocab), tmp_path / "source.gguf", tokenizer_from=tok)
    model = load(source)
    prune(model, UNEVEN, mode="query", compensate="none", progress=False)
    save(model, tmp_path / "saved")
    return tmp_path / "saved", model


def test_cli_groups_pad_keeps_the_kv_cache_and_says_so(tmp_path, saved):
    path, model = saved
    out = tmp_path / "pad.gguf"
    result = runner.invoke(app, ["export", "--model", str(path), "--to", "gguf", "--out", str(out), "--groups", "pad"])
    assert result.exit_code == 0, result.output
    zero = sum(len(s) * max(s) - sum(s) for s in (group_sizes(l.attn.kv_head_of) for l in model.layers))
    assert f"{zero} zero query heads written" in result.output and "KV cache equal to the model's" in result.output
    assert "warning" not in result.output
    assert fields(out)[0]["deci.attention.head_count_kv"] == [l.attn.n_kv_heads for l in model.layers]
    result = runner.invoke(app, ["export", "--model", str(path), "--to", "gguf", "--out", str(tmp_path / "c.gguf")])
    assert result.exit_code == 0 and "--groups pad" in result.output  # the copies' warning names the way out


@pytest.mark.parametrize("args,words", [
    (["--to", "gguf", "--groups", "zero"], ["--groups", "copy, pad, auto", "'zero'"]),
    (["--to", "transformers", "--groups", "pad"], ["--groups", "gguf"]),
])
def test_cli_bad_groups_exits_2_in_one_line(tmp_path, saved, args, words):
    path, _ = saved
    out = tmp_path / ("o.gguf" if "gguf" in args else "o")
    result = runner.invoke(app, ["export", "--model", str(path), "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.output
    assert not out.exists()


def test_python_bad_groups():
    with pytest.raises(ValueError, match=r"groups: expected one of copy, pad, auto, got 'zeros'"):
        layer_layout([0, 0, 1], "zeros")
