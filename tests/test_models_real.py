"""The embedded real models against transformers: minilm (BertModel, eager) and smollm2
(LlamaForCausalLM on the same dequantized weights), generation, perplexity, the GGUF cache.

Marked slow but run by default. The smollm2 tests share the user cache ($HEADCOUNT_CACHE or
~/.cache/headcount), so the dequantization is paid once per machine; only the cache tests use a
temporary cache.
"""

import json
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import Decoder, Encoder, evaluate_perplexity, generate, load, packed  # noqa: E402
from headcount.models import zoo  # noqa: E402
from headcount.models.formats.hf import to_transformers  # noqa: E402

pytestmark = pytest.mark.slow


def _installed(name: str) -> bool:
    try:
        zoo.package_dir(zoo.ZOO[name])
        return True
    except zoo.ModelNotFoundError:
        return False


needs_minilm = pytest.mark.skipif(not _installed("minilm"), reason=zoo.ZOO["minilm"].pip_command)
needs_smollm2 = pytest.mark.skipif(not _installed("smollm2"), reason=zoo.ZOO["smollm2"].pip_command)


# smollm2: conftest's session fixture (loaded once for every module that reads it; nothing here changes a weight)
@pytest.fixture(scope="module")
def smollm2_hf(smollm2):
    return to_transformers(smollm2, attn_implementation="sdpa")


# --------------------------------------------------------------------------------------------- MiniLM
@needs_minilm
def test_minilm_matches_transformers_on_padded_batch():
    from safetensors.torch import load_file

    ours = load("minilm")
    assert isinstance(ours, Encoder)
    c = ours.config
    assert (c.n_layers, c.n_heads, c.d_model, ours.layers[0].attn.head_dim) == (6, 12, 384, 32)
    d = zoo.minilm_dir()
    cfg = transformers.BertConfig(**json.loads((d / "config.json").read_text()))
    cfg._attn_implementation = "eager"
    hf = transformers.BertModel(cfg).eval()
    missing, unexpected = hf.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
    assert not missing, missing

    texts = ["Multi-head attention runs several heads in parallel.", "Short one.",
             "Each head writes to its own slice of the output, which W_O then mixes back together."]
    ids, mask = ours.tokenizer.batch(texts)
    assert ids[0, 0].item() == 101 and not mask[1].all()  # [CLS] ... and a padded row
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long())
        out = ours(ids, mask)
    diff = (out.last_hidden_state - ref.last_hidden_state).abs()
    assert diff.max().item() <= 1e-4, diff.max().item()  # every position, padding rows included
    assert diff[mask].max().item() <= 1e-5  # real tokens: ~2e-6 (padding rows are ill-conditioned)
    assert (out.pooler_output - ref.pooler_output).abs().max() <= 1e-4
    emb = ours.embed_sentences(["a cat sat on the mat", "a cat was sitting on a mat", "tax law of 1998"])
    sims = emb @ emb.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # a working sentence encoder


# -------------------------------------------------------------------------------------------- SmolLM2
@needs_smollm2
def test_smollm2_shape(smollm2):
    assert isinstance(smollm2, Decoder)
    c = smollm2.config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_model) == (30, 9, 3, 64, 576)
    assert c.tie_embeddings and smollm2.lm_head.weight is smollm2.embed.weight
    assert smollm2.layers[0].attn.kv_head_of == (0, 0, 0, 1, 1, 1, 2, 2, 2)
    text = "Grouped-query attention: 9 query heads, 3 KV heads.\n\nÜnïcödé ok."
    assert smollm2.tokenizer.decode(smollm2.tokenizer.encode(text)) == text


@needs_smollm2
def test_smollm2_logits_match_transformers(smollm2, smollm2_hf):
    ids, mask = smollm2.tokenizer.batch(["The quick brown fox jumps over the lazy dog because",
                                         "In Python, a list comprehension"])
    with torch.inference_mode():
        ref = smollm2_hf(input_ids=ids, attention_mask=mask.long()).logits
        out = smollm2(ids, attention_mask=mask).logits
        with packed(smollm2):  # the oneDNN path generate() and perplexity() use
            fast = smollm2(ids, attention_mask=mask).logits
    real = mask.unsqueeze(-1).expand_as(out)
    diff = (out - ref).abs()[real].max().item()
    assert diff <= 1e-3, diff
    diff_packed = (fast - ref).abs()[real].max().item()
    assert diff_packed <= 1e-3, diff_packed


@needs_smollm2
def test_smollm2_greedy_generation_matches_transformers(smollm2, smollm2_hf):
    prompt = smollm2.tokenizer.encode("The three accounts of multi-head attention are")
    # 32 tokens, the exactness benchmark's greedy length (NEW_TOKENS): every step after the prompt is a cached
    # decode step, so more steps repeat the same path
    ours = generate(smollm2, prompt, 32, stop_at_eos=False)
    with torch.inference_mode():
        ref = smollm2_hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                  max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=2)
    assert ours.new_ids == ref[0, len(prompt):].tolist()
    assert len(ours.new_ids) == 32


@needs_smollm2
def test_smollm2_perplexity_matches_transformers(smollm2, smollm2_hf):
    from headcount.data import default_corpus
    from headcount.models.evaluation import token_stream, windows

    texts = default_corpus().texts("held_out")
    result = evaluate_perplexity(smollm2, texts, window=256, max_tokens=600, batch_size=2)
    stream = token_stream(smollm2, texts)[:600]
    total, n = 0.0, 0
    with torch.inference_mode():
        for w in windows(stream, 256):  # 256, 256, 88 tokens; each window's first token unscored
            x = torch.tensor([w])
            total += smollm2_hf(input_ids=x, labels=x).loss.double().item() * (len(w) - 1)
            n += len(w) - 1
    assert (result.n_windows, result.n_scored) == (3, 597) and n == 597
    ref = math.exp(total / n)
    assert abs(result.perplexity - ref) / ref <= 1e-4, (result.perplexity, ref)
    assert 5 < result.perplexity < 40  # real weights read correctly: garbage would be in the thousands


@needs_smollm2
def test_smollm2_dequantization_matches_transformers_gguf_loader(smollm2):
    """An independent check of the hand-written loader (incl. undoing llama.cpp's q/k permutation)."""
    pytest.importorskip("accelerate")
    gguf_path = zoo.smollm2_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                           dtype=torch.float32)
    sd = hf.state_dict()
    nq, nkv = 9 * 64, 3 * 64
    for i in (0, 17, 29):
        qkv = smollm2.layers[i].attn.qkv_proj.weight
        p = f"model.layers.{i}.self_attn."
        assert torch.equal(qkv[:nq], sd[p + "q_proj.weight"])
        assert torch.equal(qkv[nq:nq + nkv], sd[p + "k_proj.weight"])
        assert torch.equal(qkv[nq + nkv:], sd[p + "v_proj.weight"])
        assert torch.equal(smollm2.layers[i].mlp.down_proj.weight, sd[f"model.layers.{i}.mlp.down_proj.weight"])
    assert torch.equal(smollm2.embed.weight, sd["model.embed_tokens.weight"])


@needs_smollm2
def test_smollm2_cache_is_built_once_and_rebuilt_when_damaged(tmp_path, capsys):
    from headcount.models.formats.gguf import MARKER

    model = load("smollm2", cache_dir=tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER} <= {p.name for p in entry.iterdir()}
    assert "dequantizing" in capsys.readouterr().err
    weights = entry / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    load("smollm2", cache_dir=tmp_path)
    assert weights.stat().st_mtime_ns == stamp and "dequantizing" not in capsys.readouterr().err

    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # damage the cache: it is rebuilt, with a note
    again = load("smollm2", cache_dir=tmp_path)
    err = capsys.readouterr().err
    assert "damaged" in err and "truncated" in err and "rebuilding" in err
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        torch.testing.assert_close(again(ids).logits, model(ids).logits)


@needs_smollm2
def test_truncated_gguf_names_file_and_tensor(tmp_path):
    from headcount.models.formats.gguf import GGUFError, read_gguf

    bad = tmp_path / "cut.gguf"
    with open(zoo.smollm2_gguf(), "rb") as f:
        bad.write_bytes(f.read(50_000_000))
    with pytest.raises(GGUFError) as e:
        read_gguf(bad)
    assert "cut.gguf: truncated: tensor 'blk." in str(e.value)


@needs_smollm2
def test_cli_generate_and_perplexity():
    from typer.testing import CliRunner

    from headcount.cli import app

    r = CliRunner().invoke(app, ["generate", "Once upon a time", "-n", "8"])
    assert r.exit_code == 0, r.output
    assert len(r.stdout.strip()) > 0
    r = CliRunner().invoke(app, ["perplexity", "--max-tokens", "300", "--window", "128", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["n_windows"] == 3 and 1 < out["perplexity"] < 100
    r = CliRunner().invoke(app, ["generate", "hello", "-n", "9000"])
    assert r.exit_code == 2 and "past the model's context of 8192" in r.stderr
