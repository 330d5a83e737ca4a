"""export_gguf: pruned / merged models with per-layer head counts as llama.cpp `deci` GGUF files, read back
by headcount.models.load with the same logits; the metadata and tensor names checked with gguf's own reader
and name tables; bad input (Python and `headcount export --to gguf`)."""

import copy
import math
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import gguf
from headcount.cli import app
from headcount.models import Decoder, DecoderConfig, load
from headcount.models.tokenizer import Tokenizer, byte_level_bpe
from headcount.surgery import export_gguf, merge_kv, prune, save

runner = CliRunner()
HD = 8


# ------------------------------------------------------------------------------------------ fixtures
def _vocab():
    from tokenizers import pre_tokenizers

    tokens = ["<|endoftext|>"] + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
    return tokens, ["Ġ t", "h e", "Ġt he"]


@pytest.fixture(scope="module")
def vocab_gguf(tmp_path_factory):
    """A GGUF file holding only a tiny byte-level BPE tokenizer (the fields the shipped smollm2 GGUF has)."""
    tokens, merges = _vocab()
    path = tmp_path_factory.mktemp("vocab") / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template("{{ messages }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny(n_layers=2, n_heads=9, n_kv=3, d_model=48, o_bias=False, seed=0):
    """A random float32 Llama decoder on the tiny vocabulary, with its tokenizer."""
    tokens, merges = _vocab()
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=len(tokens), d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                        head_dim=HD, d_ff=64, max_position=64, o_bias=o_bias, rope_theta=10000.0, norm_eps=1e-5,
                        tie_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for layer in model.layers:  # sharper attention than the default init: head order matters
            layer.attn.qkv_proj.weight.mul_(3.0)
            layer.attn_norm.weight.uniform_(0.5, 1.5)
    model.tokenizer = Tokenizer(byte_level_bpe(tokens, merges, special_ids=[0]), bos_token_id=0, eos_token_id=0,
                                pad_token_id=0, add_special_tokens=False)
    return model


def ids(n=2, t=20, seed=7):
    return torch.randint(0, len(_vocab()[0]), (n, t), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(x).logits


def assert_same_logits(back, model, x):
    """float32: equal to 1e-5 of the logits' scale (the reordered query heads sum o_proj's columns in another
    order); float64 (both models converted): equal to 1e-10, so the written weights are exact."""
    want = logits(model, x)
    assert (logits(back, x) - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    back64, model64 = copy.deepcopy(back).double(), copy.deepcopy(model).double()
    assert (logits(back64, x) - logits(model64, x)).abs().max().item() < 1e-10


def expected_kv(kv_head_of):
    """Written KV heads, computed here independently: n_heads / gcd of the group sizes."""
    sizes = Counter(kv_head_of).values()
    return len(kv_head_of) // math.gcd(*sizes)


def read_back(path):
    return gguf.GGUFReader(str(path))


def field(reader, key):
    return reader.fields[key].contents()


def deci_names(n_layers):
    """Every tensor base name gguf's own tables give the deci architecture (no names made up here)."""
    names = set()
    for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.DECI]:
        template = gguf.TENSOR_NAMES[t]
        names |= {template.format(bid=i) for i in range(n_layers)} if "{bid}" in template else {template}
    return names


# ------------------------------------------------------------------------------------------ round trips
UNEVEN_QUERY = {0: [1, 2], 1: [0, 4, 5, 8]}  # layer 0: groups 1, 3, 3; layer 1: groups 2, 1, 2
GROUP = {0: [3, 4, 5]}  # layer 0 loses its middle KV group: 6 heads / 2 KV; layer 1 keeps 9 / 3


@pytest.mark.parametrize("case", ["query", "group", "merge"])
def test_round_trip_f32_equal_logits_and_metadata(tmp_path, vocab_gguf, case):
    model = tiny(o_bias=case == "query")
    x = ids()
    if case == "query":  # mean compensation gives o_proj a bias: written as blk.N.attn_output.bias
        prune(model, UNEVEN_QUERY, mode="query", compensate="mean", calibration=ids(4, 24, seed=1), progress=False)
        assert model.layers[0].attn.kv_head_of == (0, 1, 1, 1, 2, 2, 2)
        assert model.layers[1].attn.kv_head_of == (0, 0, 1, 2, 2)
    elif case == "group":
        prune(model, GROUP, mode="group", compensate="none", progress=False)
        assert [l.attn.n_heads for l in model.layers] == [6, 9]
    else:  # 3 -> 2 KV heads, the old heads 0 and 2 sharing one: uneven (6, 3) and non-contiguous
        merge_kv(model, 2, local_steps=0, uptrain_steps=0, layers=[0], grouping=[[0, 2], [1]],
                 calibration=ids(4, 24, seed=1), progress=False)
        assert model.layers[0].attn.kv_head_of == (0, 0, 0, 1, 1, 1, 0, 0, 0)
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab_gguf)
    back = load(path)
    assert isinstance(back, Decoder)
    assert_same_logits(back, model, x)

    # the per-layer arrays, read with gguf's reader (not headcount's)
    r = read_back(path)
    assert field(r, "general.architecture") == "deci"
    heads = [l.attn.n_heads for l in model.layers]
    kv = [expected_kv(l.attn.kv_head_of) for l in model.layers]
    assert field(r, "deci.attention.head_count") == heads
    assert field(r, "deci.attention.head_count_kv") == kv
    assert r.fields["deci.attention.head_count"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]
    assert field(r, "deci.attention.key_length") == HD and field(r, "deci.attention.value_length") == HD
    assert field(r, "deci.rope.dimension_count") == HD and field(r, "deci.block_count") == 2
    assert [l.attn.n_heads for l in back.layers] == heads and [l.attn.n_kv_heads for l in back.layers] == kv
    if case == "query":
        assert kv == [7, 5]  # groups 1, 3, 3 and 2, 1, 2: gcd 1 -> one KV head per query head
    elif case == "merge":
        assert kv == [3, 3]  # groups 6, 3 -> gcd 3: KV head 0 written twice
    # the tokenizer travels: same fields as the source, same encoding
    src = read_back(vocab_gguf)
    for key in [k for k in src.fields if k.startswith("tokenizer.")]:
        assert field(r, key) == field(src, key), key
    text = "the thermometer 1234"
    assert back.tokenizer.encode(text) == model.tokenizer.encode(text)


def test_tensor_names_and_shapes_follow_llama_cpp_deci(tmp_path, vocab_gguf):
    model = tiny(o_bias=True)
    prune(model, UNEVEN_QUERY, mode="query", compensate="none", progress=False)
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab_gguf)
    r = read_back(path)
    allowed = deci_names(2)
    written = {t.name for t in r.tensors}
    for name in written:
        base, _, kind = name.rpartition(".")
        assert base in allowed and kind in ("weight", "bias"), name
    tn = gguf.TENSOR_NAMES
    required = {tn[gguf.MODEL_TENSOR.TOKEN_EMBD], tn[gguf.MODEL_TENSOR.OUTPUT_NORM]} | {
        tn[t].format(bid=i) for i in range(2) for t in (
            gguf.MODEL_TENSOR.ATTN_NORM, gguf.MODEL_TENSOR.ATTN_Q, gguf.MODEL_TENSOR.ATTN_K, gguf.MODEL_TENSOR.ATTN_V,
            gguf.MODEL_TENSOR.ATTN_OUT, gguf.MODEL_TENSOR.FFN_NORM, gguf.MODEL_TENSOR.FFN_GATE,
            gguf.MODEL_TENSOR.FFN_UP, gguf.MODEL_TENSOR.FFN_DOWN)}
    assert {n + ".weight" for n in required} <= written
    assert tn[gguf.MODEL_TENSOR.OUTPUT] + ".weight" not in written  # tied: llama.cpp reuses token_embd
    # ggml shapes (ne0 = input width first), as llama.cpp's create_tensor asks for the deci layers
    shapes = {t.name: [int(s) for s in t.shape] for t in r.tensors}
    for i, attn in enumerate(l.attn for l in model.layers):
        nh, nkv = attn.n_heads, expected_kv(attn.kv_head_of)
        assert shapes[f"blk.{i}.attn_q.weight"] == [48, nh * HD]
        assert shapes[f"blk.{i}.attn_k.weight"] == [48, nkv * HD]
        assert shapes[f"blk.{i}.attn_v.weight"] == [48, nkv * HD]
        assert shapes[f"blk.{i}.attn_output.weight"] == [nh * HD, 48]
        assert shapes[f"blk.{i}.attn_output.bias"] == [48]


def test_q_and_k_rows_use_llama_cpp_permutation(tmp_path, vocab_gguf):
    """attn_q / attn_k hold convert_hf_to_gguf.py's LlamaModel.permute of the q/k rows (written out here)."""
    def hf_permute(w, n_head):  # convert_hf_to_gguf.py, LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    model = tiny()
    prune(model, {0: [0, 1, 2]}, mode="group", compensate="none", progress=False)  # uniform 6 / 2: no reorder
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab_gguf)
    r = read_back(path)
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    w = model.layers[0].attn.qkv_proj.weight.detach().numpy()
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"], hf_permute(w[:6 * HD], 6))
    np.testing.assert_array_equal(t["blk.0.attn_k.weight"], hf_permute(w[6 * HD:8 * HD], 2))
    np.testing.assert_array_equal(t["blk.0.attn_v.weight"], w[8 * HD:])


def test_f16_equals_the_model_with_weights_rounded_to_f16(tmp_path, vocab_gguf):
    """f16 stores each 2-D weight rounded to float16; everything else is exact. So the loaded model must equal
    the original with those weights rounded (to 1e-5), and differs from the unrounded one by the rounding only."""
    model = tiny()
    prune(model, UNEVEN_QUERY, mode="query", compensate="none", progress=False)
    path = export_gguf(model, tmp_path / "m16.gguf", dtype="f16", tokenizer_from=vocab_gguf)
    r = read_back(path)
    assert field(r, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_F16)
    types = {t.name: t.tensor_type for t in r.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    x = ids()
    back = load(path)
    want = logits(rounded, x)
    assert (logits(back, x) - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    # against the unrounded model: float16's relative step 2^-11 in every weight; logits here are O(1)
    want = logits(model, x)
    err = (logits(back, x) - want).abs().max().item()
    assert 0 < err < 2e-2 * want.abs().max().item()


def test_uniform_model_exports_unchanged_counts(tmp_path, vocab_gguf):
    model = tiny()
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab_gguf)
    r = read_back(path)
    assert field(r, "deci.attention.head_count") == [9, 9] and field(r, "deci.attention.head_count_kv") == [3, 3]
    assert_same_logits(load(path), model, ids())


# ------------------------------------------------------------------------------------------ the CLI
def bad(args, match):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in result.output, result.output


def test_cli_export_follows_the_source_gguf_through_a_save(tmp_path, vocab_gguf):
    """A model loaded from a GGUF, pruned and saved: `headcount export --to gguf` finds the tokenizer source
    through the save's recorded name, and --force replaces; the written file loads with equal logits."""
    model = tiny()
    first = export_gguf(model, tmp_path / "first.gguf", tokenizer_from=vocab_gguf)
    loaded = load(first)
    prune(loaded, {1: [2, 3]}, mode="query", compensate="none", progress=False)
    save(loaded, tmp_path / "saved")
    out = tmp_path / "out.gguf"
    result = runner.invoke(app, ["export", "--model", str(tmp_path / "saved"), "--to", "gguf", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert_same_logits(load(out), loaded, ids())
    assert field(read_back(out), "deci.attention.head_count") == [9, 7]
    before = out.read_bytes()
    bad(["export", "--model", str(tmp_path / "saved"), "--to", "gguf", "--out", str(out)], "already exists")
    assert out.read_bytes() == before
    result = runner.invoke(app, ["export", "--model", str(tmp_path / "saved"), "--to", "gguf-f16", "--out", str(out),
                                 "--force"])
    assert result.exit_code == 0, result.output
    assert field(read_back(out), "general.file_type") == int(gguf.LlamaFileType.MOSTLY_F16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.gguf", "out.gguf", "saved"]


def test_cli_bad_input_writes_nothing(tmp_path):
    model = tiny()
    prune(model, {0: [1]}, mode="query", compensate="none", progress=False)
    save(model, tmp_path / "m")  # no GGUF behind it: no tokenizer metadata to copy
    m = str(tmp_path / "m")
    bad(["export", "--model", m, "--to", "gguf", "--out", str(tmp_path / "o.gguf")], "tokenizer")
    bad(["export", "--model", m, "--to", "onnx", "--out", str(tmp_path / "o.gguf")], "--to")
    bad(["export", "--model", m, "--to", "gguf"], "--out")
    bad(["export", "--model", m, "--to", "gguf", "--out", str(tmp_path / "o.bin")], "--out")
    (tmp_path / "d.gguf").mkdir()
    bad(["export", "--model", m, "--to", "gguf", "--out", str(tmp_path / "d.gguf"), "--force"], "directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.gguf", "m"]


# ------------------------------------------------------------------------------------------ bad input
def test_python_bad_input(tmp_path, vocab_gguf):
    model = tiny()
    with pytest.raises(ValueError, match="dtype"):
        export_gguf(model, tmp_path / "a.gguf", dtype="q8_0", tokenizer_from=vocab_gguf)
    with pytest.raises(ValueError, match="no GGUF file to copy the tokenizer"):
        export_gguf(model, tmp_path / "a.gguf")
    gpt2 = Decoder(DecoderConfig(vocab_size=len(_vocab()[0]), d_model=32, n_layers=1, n_heads=4, d_ff=64,
                                 norm="layer", mlp="gelu_tanh", position="learned", family="gpt2"))
    with pytest.raises(ValueError, match="family='gpt2'"):
        export_gguf(gpt2, tmp_path / "a.gguf", tokenizer_from=vocab_gguf)
    small = tiny()
    small.config.vocab_size = 100  # a tokenizer that does not fit the embedding
    with pytest.raises(ValueError, match="tokens, the model's embedding 100 rows"):
        export_gguf(small, tmp_path / "a.gguf", tokenizer_from=vocab_gguf)
    (tmp_path / "b.gguf").write_bytes(b"keep")
    with pytest.raises(ValueError, match="already exists"):
        export_gguf(model, tmp_path / "b.gguf", tokenizer_from=vocab_gguf)
    assert (tmp_path / "b.gguf").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.gguf"]


def _deci_header(path, heads, kv_heads, block_count=None):
    tokens, merges = _vocab()
    w = gguf.GGUFWriter(str(path), "deci")
    w.add_block_count(len(heads) if block_count is None else block_count)
    w.add_embedding_length(48)
    w.add_context_length(64)
    w.add_feed_forward_length(64)
    w.add_head_count(heads)
    if kv_heads is not None:
        w.add_head_count_kv(kv_heads)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("heads,kv_heads,match", [
    ([9, 0], [3, 2], "layer 1 has head_count 0 with head_count_kv 2"),  # (0, 0) is an attention-free block
    ([9, 6], [3, 0], "linear attention"),
    ([9, 7], [3, 2], "not a multiple"),
    ([9], [3], "has 1 entries; block_count is 2"),
])
def test_reader_refuses_deci_files_headcount_cannot_build(tmp_path, heads, kv_heads, match):
    from headcount.models.formats.gguf import GGUFError

    path = tmp_path / "x.gguf"
    if len(heads) == 1:  # block_count says 2, the arrays hold 1
        _deci_header(path, heads, None, block_count=2)
    else:
        _deci_header(path, heads, kv_heads)
    with pytest.raises(GGUFError, match=match):
        load(path)


def test_reader_names_a_tensor_of_the_wrong_shape(tmp_path, vocab_gguf):
    from headcount.models.formats.gguf import GGUFError

    model = tiny()
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab_gguf)
    r = read_back(path)
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "deci")
    for key, f in r.fields.items():
        if key.startswith(("GGUF.", "general.architecture")):
            continue
        value = f.contents()
        if key == "deci.attention.head_count_kv":
            value = [9, 3]  # layer 0 now claims MHA: attn_k has 3 heads' rows, not 9
        w.add_key_value(key, value, f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape(list(reversed([int(s) for s in t.shape]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_k\.weight.*layer 0: head_count 9, head_count_kv 9"):
        load(tmp_path / "bad.gguf")


# ------------------------------------------------------------------------------------------ smollm2
def test_smollm2_pruned_unevenly_round_trips_with_its_own_tokenizer_fields(tmp_path, smollm2):
    """The real model: uneven query pruning in two layers, f16 export (half the bytes of f32), load back.
    The source GGUF's tokenizer fields are copied (found through model.name == "smollm2")."""
    model = copy.deepcopy(smollm2)
    prune(model, {0: [0, 1], 5: [4], 29: [2, 5, 8]}, mode="query", compensate="none", progress=False)
    path = export_gguf(model, tmp_path / "smol.gguf", dtype="f16")
    r = read_back(path)
    assert field(r, "deci.attention.head_count")[:6] == [7, 9, 9, 9, 9, 8]
    assert field(r, "deci.attention.head_count_kv")[:6] == [7, 3, 3, 3, 3, 8]  # groups (1,3,3) and (3,2,3)
    assert field(r, "deci.attention.head_count_kv")[29] == 3  # groups (2,2,2): uniform
    from headcount.models.zoo import smollm2_gguf
    src = read_back(smollm2_gguf())
    for key in [k for k in src.fields if k.startswith("tokenizer.")]:
        assert field(r, key) == field(src, key), key
    back = load(path)
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    x, _ = model.tokenizer.batch(["The heads that remain still attend."])
    want = logits(rounded, x)  # the same float32 weights: measured bit-identical here (diff 0.0)
    assert (logits(back, x) - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    assert back.tokenizer.encode("Hello 2024 world") == model.tokenizer.encode("Hello 2024 world")


# ------------------------------------------------------------------- what the target runtime will hold
def test_plan_gguf_export_counts_copied_kv_heads_before_writing():
    """Layer 0 pruned to groups of 3, 2, 3 query heads: llama.cpp needs equal contiguous groups, so with
    g = gcd(3, 2, 3) = 1 every query head gets its own KV head (8 written, 3 held); layer 1 is untouched."""
    from headcount.models.formats.gguf_deci import plan_gguf_export

    model = tiny()
    prune(model, {0: [4]}, compensate="none")  # query head 4 reads KV head 1: groups 3, 2, 3
    plan = plan_gguf_export(model)
    assert plan["kv_heads_model"] == [3, 3] and plan["kv_heads_written"] == [8, 3]
    assert plan["kv_heads_copied"] == 5 and plan["grows"] is True
    assert plan["kv_bytes_per_token_llama_cpp"] == 2 * (8 + 3) * HD * 2  # K and V, f16
    assert plan["kv_bytes_per_token_model"] == 2 * (3 + 3) * HD * 2
    assert plan["params_written"] - plan["params_model"] == 2 * 5 * HD * model.config.d_model


def test_plan_gguf_export_uniform_prune_keeps_the_cache():
    from headcount.models.formats.gguf_deci import plan_gguf_export

    model = tiny()
    prune(model, {0: [0, 3, 6]}, compensate="none")  # one head of every group: groups 2, 2, 2
    plan = plan_gguf_export(model)
    assert plan["kv_heads_written"] == plan["kv_heads_model"] == [3, 3] and plan["grows"] is False


def test_general_name_is_the_model_name_not_a_local_path(tmp_path, vocab_gguf):
    from headcount.models.formats.gguf_deci import display_name

    model = tiny()
    model.name = str(tmp_path / "deep" / "saves" / "pruned-20")
    assert display_name(model) == "pruned-20"
    model.name = str(tmp_path / "model.gguf")
    assert display_name(model) == "model"
    path = export_gguf(model, tmp_path / "out.gguf", tokenizer_from=vocab_gguf)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.name"].contents() == "model"
