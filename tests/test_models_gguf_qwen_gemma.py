"""gemma3-270m and qwen2.5-coder-0.5b: the transformers checkpoint directory headcount writes from their
GGUF files (config.json, model.safetensors, tokenizer.json) against transformers' own GGUF loader.

transformers' loader (`from_pretrained(dir, gguf_file=...)`) parses every metadata field of the file
with gguf.GGUFReader, which takes 70-190 s per model on a shared 2-core machine (most of it decoding
the 262,144-token vocabulary field by field): too slow for the suite. So its results (config, a
fingerprint of every tensor of its state dict, token ids of varied text, logits on 64 tokens) are
stored in tests/data/gguf_transformers_reference.json, written by running this file:

    python tests/test_models_gguf_qwen_gemma.py        # regenerates the reference (minutes)

and the suite checks the cache against them, with transformers loading the cache directory itself
(seconds). HEADCOUNT_LIVE_GGUF=1 runs the same comparisons against transformers' GGUF loader live.

The caches are built in the user cache ($HEADCOUNT_CACHE or ~/.cache/headcount), once per machine.
Tests skip, naming the pip command, when a model's packages are not installed (`make install`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import zoo  # noqa: E402

pytestmark = pytest.mark.slow

REFERENCE = Path(__file__).with_name("data") / "gguf_transformers_reference.json"
MODELS = ("gemma3-270m", "qwen2.5-coder-0.5b")
LIVE = os.environ.get("HEADCOUNT_LIVE_GGUF") == "1"

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))  # 5\n",
    "    indented\t\ttabs   and   runs of spaces    \n\n\n  trailing   ",
    "Café naïve façade — “quotes” ‘single’ … ½ ¾ ß Æ Ω ∑ ∫ √ ≤ ≥",
    "日本語のテキストと中文字符，한국어 문장도 섞여 있습니다。",
    "Emoji: 🤖🚀👩‍💻🇫🇷 ❤️ 👍🏽",
    "numbers 1234567890 3.14159 -42 1e-10 0xFF 1,000,000",
    "<bos>x<eos> <|im_start|>user\nhi<|im_end|> <start_of_turn>model\n<end_of_turn>",
    "",
    " leading and trailing spaces ",
    "https://example.com/path?q=1&r=2#frag user@example.org",
    "x" * 50 + " " + "ab" * 30 + "\r\n\r\n" + "\u00a0\u2009\u3000 odd spaces",
]
PROMPT = ("def fibonacci(n: int) -> int:\n"
          "    \"\"\"Return the n-th Fibonacci number, counting from fibonacci(0) == 0.\"\"\"\n"
          "    a, b = 0, 1\n"
          "    for _ in range(n):\n"
          "        a, b = b, a + b\n"
          "    return a\n\n\n"
          "The function above runs in linear time; a closed form uses the golden ratio, but floating "
          "point rounding makes it wrong for large n, so the loop is what people ship.")
N_TOKENS = 64
TOP = 5
CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_activation", "hidden_act",
               "max_position_embeddings", "rms_norm_eps", "rope_parameters", "query_pre_attn_scalar",
               "sliding_window", "layer_types", "final_logit_softcapping", "attn_logit_softcapping",
               "use_bidirectional_attention", "use_sliding_window", "tie_word_embeddings", "attention_bias",
               "bos_token_id", "eos_token_id", "pad_token_id")


def _needs(name):
    return pytest.mark.skipif(not zoo.installed(name), reason=f"{name}: {zoo.ZOO[name].pip_command}")


def _reference() -> dict:
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} is missing: python {Path(__file__).name} writes it")
    return json.loads(REFERENCE.read_text())


def _config(cfg) -> dict:
    d = cfg.to_dict()
    return {k: d.get(k) for k in CONFIG_KEYS if k in d}


def _same_config(cfg, ref: dict) -> None:
    """Every field transformers' GGUF loader sets is equal; a field we add (head_dim on qwen2) agrees
    with what transformers computes without it."""
    ours = _config(cfg)
    assert {k: ours.get(k) for k in ref} == ref
    assert cfg.head_dim == cfg.hidden_size // cfg.num_attention_heads or "head_dim" in ref


def _probe_ids(vocab: int) -> list[int]:
    return list(range(0, vocab, vocab // 32))


def fingerprint(logits: torch.Tensor) -> dict:
    """[T, V] float32 logits -> what the reference keeps: top-5 ids and values, logsumexp, and the
    values at 32 fixed ids, per position."""
    top = logits.topk(TOP, dim=-1)
    probe = _probe_ids(logits.shape[-1])
    return {"top_ids": top.indices.tolist(), "top_values": top.values.tolist(), "probe_ids": probe,
            "probe_values": logits[:, probe].tolist(), "lse": torch.logsumexp(logits.double(), -1).tolist()}


def check_fingerprint(logits: torch.Tensor, ref: dict, atol: float) -> None:
    """Causal: logits on the first n tokens are the first n rows of the reference's."""
    logits = logits.float()
    n = logits.shape[0]
    ref = {k: (v if k == "probe_ids" else v[:n]) for k, v in ref.items()}
    top_ref = torch.tensor(ref["top_ids"])
    # the reference's top ids hold the reference's top values here too (robust to near ties in order)
    torch.testing.assert_close(logits.gather(-1, top_ref), torch.tensor(ref["top_values"]), atol=atol, rtol=0)
    assert torch.equal(logits.argmax(-1), top_ref[:, 0]), "greedy tokens differ from transformers' GGUF load"
    torch.testing.assert_close(logits[:, ref["probe_ids"]], torch.tensor(ref["probe_values"]), atol=atol, rtol=0)
    torch.testing.assert_close(torch.logsumexp(logits.double(), -1), torch.tensor(ref["lse"], dtype=torch.float64),
                               atol=atol, rtol=0)


def digest(t: torch.Tensor) -> str:
    """BLAKE2b of a tensor's float32 bytes: equal digests, equal tensors."""
    return hashlib.blake2b(t.detach().float().contiguous().numpy(), digest_size=16).hexdigest()


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def _from_cache(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def _digests(model) -> dict[str, str]:
    seen: dict[int, str] = {}  # a tied lm_head is the embedding: hashed once
    out = {}
    for k, v in model.state_dict().items():
        if v.data_ptr() not in seen:
            seen[v.data_ptr()] = digest(v)
        out[k] = seen[v.data_ptr()]
    return out


def _transformers_on_cache(name: str, reference: dict, n_tokens: int = N_TOKENS) -> dict:
    """transformers loads headcount's checkpoint directory: its config, its state dict's digests, its
    logits on the reference's first n_tokens tokens (the model itself is dropped: one real model in
    memory at a time)."""
    directory = zoo.checkpoint_dir(name)
    model = _from_cache(directory)
    out = {"dir": directory, "type": type(model).__name__, "config": model.config, "digests": _digests(model),
           "logits": _hf_logits(model, reference[name]["input_ids"][:n_tokens])}
    del model
    return out


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def reference():
    return _reference()


@pytest.fixture(scope="module")
def gemma(reference):
    return _transformers_on_cache("gemma3-270m", reference, n_tokens=16)


@pytest.fixture(scope="module")
def qwen(reference):
    return _transformers_on_cache("qwen2.5-coder-0.5b", reference)


def _stored(directory: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return set(f.keys())


# -------------------------------------------------------------------------------------- gemma3
@_needs("gemma3-270m")
def test_gemma3_config_is_what_transformers_reads_from_the_gguf(gemma, reference):
    cfg = json.loads((gemma["dir"] / "config.json").read_text())
    # the facts the issue states, written out (none left to a class default)
    assert cfg["model_type"] == "gemma3_text" and cfg["architectures"] == ["Gemma3ForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (18, 640, 4, 1, 256, 262144)
    assert cfg["sliding_window"] == 512 and cfg["sliding_window_pattern"] == 6
    assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert cfg["rope_theta"] == 1e6 and cfg["rope_local_base_freq"] == 1e4
    assert cfg["rope_parameters"] == {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert cfg["query_pre_attn_scalar"] == 256 and cfg["hidden_activation"] == "gelu_pytorch_tanh"
    assert cfg["final_logit_softcapping"] is None and cfg["attn_logit_softcapping"] is None
    assert cfg["tie_word_embeddings"] is True and cfg["add_bos_token"] is True
    # transformers reads the directory into the config its GGUF loader builds from the file
    assert gemma["type"] == "Gemma3ForCausalLM"
    _same_config(gemma["config"], reference["gemma3-270m"]["config"])


@_needs("gemma3-270m")
def test_gemma3_weights_equal_transformers_gguf_loader(gemma, reference):
    """Every tensor equals transformers' GGUF load, byte for byte: norms written as transformers' w
    where the GGUF holds 1 + w (for the q/k norms too), the tied embedding stored once."""
    assert gemma["digests"] == reference["gemma3-270m"]["digests"]
    assert _stored(gemma["dir"]) == set(gemma["digests"]) - {"lm_head.weight"}


@_needs("gemma3-270m")
def test_gemma3_norms_are_the_gguf_values_minus_one(gemma):
    from safetensors import safe_open

    from headcount.models.formats.gguf import GGUFFile

    path, _ = zoo.packaged_gguf("gemma3-270m")
    g = GGUFFile(path)
    with safe_open(str(gemma["dir"] / "model.safetensors"), "np") as f:
        for gguf_name, hf_name in (("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
                                   ("blk.17.post_ffw_norm.weight", "model.layers.17.post_feedforward_layernorm.weight"),
                                   ("output_norm.weight", "model.norm.weight")):
            stored = g.tensor(g.by_name[gguf_name])
            assert np.array_equal(f.get_tensor(hf_name), stored - np.float32(1)), hf_name


@_needs("gemma3-270m")
def test_gemma3_logits_equal_transformers_gguf_loader(gemma, reference):
    check_fingerprint(gemma["logits"], reference["gemma3-270m"]["logits"], atol=1e-4)


@_needs("gemma3-270m")
def test_gemma3_tokenizer_ids_equal_transformers(reference):
    from headcount.models.tokenizer import Tokenizer

    directory = zoo.checkpoint_dir("gemma3-270m")
    ref = reference["gemma3-270m"]["tokens"]
    cfg = json.loads((directory / "config.json").read_text())
    ours = Tokenizer.from_file(directory / "tokenizer.json", bos_token_id=cfg["bos_token_id"],
                               add_special_tokens=cfg["add_bos_token"])
    for text in TEXTS:
        assert ours.encode(text) == ref[text], text  # <bos> first: Gemma adds it
        assert ours.encode(text, add_special_tokens=False) == ref[text][1:], text
    assert ref[TEXTS[0]][0] == 2 and ref[""] == [2]
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in directory.iterdir()}


# --------------------------------------------------------------------------------------- qwen2
@_needs("qwen2.5-coder-0.5b")
def test_qwen2_config_is_what_transformers_reads_from_the_gguf(qwen, reference):
    cfg = json.loads((qwen["dir"] / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"]) == (24, 896, 14, 2, 64)
    assert cfg["tie_word_embeddings"] is False  # this GGUF stores output.weight (Q8_0) apart from the embedding
    assert cfg["add_bos_token"] is False and cfg["use_sliding_window"] is False
    assert qwen["type"] == "Qwen2ForCausalLM"
    _same_config(qwen["config"], reference["qwen2.5-coder-0.5b"]["config"])


@_needs("qwen2.5-coder-0.5b")
def test_qwen2_weights_equal_transformers_gguf_loader(qwen, reference):
    """Byte for byte, q/k/v biases included, q/k rows not permuted."""
    assert qwen["digests"] == reference["qwen2.5-coder-0.5b"]["digests"]
    assert _stored(qwen["dir"]) == set(qwen["digests"])


@_needs("qwen2.5-coder-0.5b")
def test_qwen2_logits_equal_transformers_gguf_loader(qwen, reference):
    check_fingerprint(qwen["logits"], reference["qwen2.5-coder-0.5b"]["logits"], atol=1e-4)


@_needs("qwen2.5-coder-0.5b")
def test_qwen2_tokenizer_ids_equal_transformers(reference):
    from headcount.models.tokenizer import Tokenizer

    directory = zoo.checkpoint_dir("qwen2.5-coder-0.5b")
    ref = reference["qwen2.5-coder-0.5b"]["tokens"]
    ours = Tokenizer.from_file(directory / "tokenizer.json", add_special_tokens=False)
    for text in TEXTS:
        assert ours.encode(text) == ref[text], text  # no BOS: Qwen2 adds none
        assert ours.encode(text, add_special_tokens=True) == ref[text], text
    assert ref[""] == []
    assert (directory / "chat_template.jinja").is_file()


@_needs("qwen2.5-coder-0.5b")
def test_qwen2_headcount_load_matches_transformers(qwen, reference):
    """headcount.models.load("qwen2.5-coder-0.5b") (headcount's Decoder, family qwen2) against
    transformers on the same weights, and against transformers' GGUF load, on 64 tokens."""
    from headcount.models import Decoder, load

    model = load("qwen2.5-coder-0.5b")
    assert isinstance(model, Decoder) and model.name == "qwen2.5-coder-0.5b"
    ref = reference["qwen2.5-coder-0.5b"]
    ids = ref["input_ids"]
    assert len(ids) == N_TOKENS
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    assert (logits - qwen["logits"]).abs().max().item() <= 1e-3
    check_fingerprint(logits, ref["logits"], atol=1e-3)
    assert model.tokenizer.encode(TEXTS[1]) == ref["tokens"][TEXTS[1]]
    assert model.tokenizer.encode(PROMPT)[:N_TOKENS] == ids


# ------------------------------------------------- tiny random models, written as llama.cpp would
def _bytes_to_unicode() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


def write_like_llama_cpp(hf_model, path: Path, arch: str, **fields) -> Path:
    """A transformers model as llama.cpp's convert_hf_to_gguf.py writes it (F32): its names, its
    metadata keys, and for gemma3 every RMSNorm weight stored as 1 + w; qwen2 / gemma3 q/k rows are
    not permuted. `fields` override metadata (None removes a key)."""
    import gguf

    c = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    p = f"{arch}."
    meta = {
        p + "block_count": c.num_hidden_layers, p + "context_length": c.max_position_embeddings,
        p + "embedding_length": c.hidden_size, p + "feed_forward_length": c.intermediate_size,
        p + "attention.head_count": c.num_attention_heads, p + "attention.head_count_kv": c.num_key_value_heads,
        p + "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
    }
    if arch == "qwen2":
        meta[p + "rope.freq_base"] = float(c.rope_parameters["rope_theta"])
        tokens = _bytes_to_unicode() + ["\u0120t", "he", "<|endoftext|>"]
        meta.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
                     "tokenizer.ggml.token_type": [1] * (len(tokens) - 1) + [3],
                     "tokenizer.ggml.merges": ["\u0120 t", "h e"],
                     "tokenizer.ggml.eos_token_id": len(tokens) - 1, "tokenizer.ggml.bos_token_id": len(tokens) - 1,
                     "tokenizer.ggml.padding_token_id": len(tokens) - 1, "tokenizer.ggml.add_bos_token": False})
    else:
        meta.update({p + "rope.freq_base": float(c.rope_parameters["full_attention"]["rope_theta"]),
                     p + "attention.key_length": c.head_dim, p + "attention.value_length": c.head_dim,
                     p + "attention.sliding_window": c.sliding_window})
        pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "  "]
        tokens = pieces + [f"<0x{i:02X}>" for i in range(256)]
        meta.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
                     "tokenizer.ggml.scores": [0.0] * len(tokens),
                     "tokenizer.ggml.token_type": [3, 3, 3, 2] + [1] * (len(pieces) - 4) + [6] * 256,
                     "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
                     "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
                     "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False})
    assert len(tokens) == c.vocab_size
    meta.update(fields)
    for key, value in meta.items():
        if value is not None:
            w.add_key_value(key, value, *_gguf_type(value))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm",
             "post_attention_layernorm": "post_attention_norm" if arch == "gemma3" else "ffn_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
    for name, t in hf_model.state_dict().items():
        a = t.detach().float().numpy().copy()
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            out = "output.weight"
        else:
            _, _, i, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            out = f"blk.{i}.{names[module]}.{kind}"
        if arch == "gemma3" and out.endswith("norm.weight"):
            a = a + np.float32(1.0)
        w.add_tensor(out, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_type(value):
    import gguf

    T = gguf.GGUFValueType
    if isinstance(value, bool):
        return (T.BOOL,)
    if isinstance(value, int):
        return (T.UINT32,)
    if isinstance(value, float):
        return (T.FLOAT32,)
    if isinstance(value, str):
        return (T.STRING,)
    sub = T.STRING if isinstance(value[0], str) else T.FLOAT32 if isinstance(value[0], float) else T.INT32
    return (T.ARRAY, sub)


def _randomised(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * (0.02 if "embed" in name else 0.3))
    return model.eval()


def tiny_qwen2():
    cfg = transformers.Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=1e6, tie_word_embeddings=False, attn_implementation="eager")
    return _randomised(transformers.Qwen2ForCausalLM(cfg))


def tiny_gemma3():
    cfg = transformers.Gemma3TextConfig(vocab_size=268, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                        query_pre_attn_scalar=32, sliding_window=8, max_position_embeddings=128,
                                        attn_implementation="eager")
    return _randomised(transformers.Gemma3ForCausalLM(cfg))


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    """(original transformers model, its GGUF, transformers on headcount's checkpoint directory) per arch."""
    from headcount.models.formats.gguf import cached_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch, make in (("qwen2", tiny_qwen2), ("gemma3", tiny_gemma3)):
        hf = make()
        path = write_like_llama_cpp(hf, root / f"tiny-{arch}.gguf", arch)
        directory = cached_checkpoint(path, root=root / "cache")
        out[arch] = (hf, path, directory, _from_cache(directory))
    return out


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_tiny_checkpoint_reproduces_the_model_llama_cpp_converted(tiny_pairs, arch):
    """A random transformers model, written to GGUF the way llama.cpp writes it, comes back through
    headcount's checkpoint directory with the same logits (gemma3: norms stored as 1 + w, 20 tokens
    past its 8-token window, 5 local layers to 1 global)."""
    hf, _, directory, back = tiny_pairs[arch]
    ids = torch.randint(4, hf.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
    for key in ("layer_types", "sliding_window", "num_key_value_heads", "head_dim", "query_pre_attn_scalar",
                "rope_parameters", "tie_word_embeddings", "intermediate_size"):
        if hasattr(hf.config, key):  # transformers' Qwen2Config has no head_dim: ours states d / n_heads
            assert getattr(back.config, key) == getattr(hf.config, key), key


def test_tiny_gemma3_norms_are_written_in_transformers_convention(tiny_pairs):
    from safetensors.torch import load_file

    hf, _, directory, _ = tiny_pairs["gemma3"]
    ours = load_file(str(directory / "model.safetensors"))
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight":
            assert name not in ours  # tied: stored once
            continue
        torch.testing.assert_close(ours[name], t, atol=1e-6, rtol=0)


def test_tiny_tokenizers(tiny_pairs):
    from headcount.models.tokenizer import Tokenizer

    for arch, bos in (("qwen2", []), ("gemma3", [2])):
        _, path, directory, _ = tiny_pairs[arch]
        cfg = json.loads((directory / "config.json").read_text())
        ours = Tokenizer.from_file(directory / "tokenizer.json", add_special_tokens=cfg["add_bos_token"])
        ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        for text in ("the head", "ab a  abc", "", "x\u00e9\u4e2d"):
            assert ours.encode(text) == ref(text).input_ids, (arch, text)
        assert ours.encode("ab")[: len(bos)] == bos


# ---------------------------------------------------------------------------------- bad input
def test_other_architecture_is_refused_before_hashing(tmp_path, monkeypatch):
    from headcount.models import load
    from headcount.models.formats import gguf as g

    path = write_like_llama_cpp(tiny_qwen2(), tmp_path / "m.gguf", "qwen2")
    data = bytearray(path.read_bytes())
    i = data.index(b"qwen2")  # general.architecture's value, the first key: "qwen2" -> "qwen9"
    data[i + 4:i + 5] = b"9"
    path.write_bytes(bytes(data))

    def forbidden(*a, **k):
        raise AssertionError("hashed")

    monkeypatch.setattr(g, "file_sha256", forbidden)
    with pytest.raises(g.GGUFError) as e:
        load(path, cache_dir=tmp_path / "cache")
    msg = str(e.value)
    assert "unsupported architecture 'qwen9'" in msg and "llama, qwen2, gemma3" in msg and "\n" not in msg
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("change, match", [
    (dict(drop="blk.1.attn_k.bias"), "tensor 'blk.1.attn_k.bias' is missing"),
    (dict(fields={"qwen2.attention.head_count_kv": 1}), "tensor 'blk.0.attn_k.weight' has shape [32, 64], the "
                                                        "metadata implies [16, 64]"),
    (dict(extra="blk.0.ffn_gate_inp.weight"), "unexpected tensor 'blk.0.ffn_gate_inp.weight' for a qwen2 model"),
    (dict(fields={"qwen2.rope.scaling.type": "yarn"}), "rotary scaling"),
    (dict(cut=True), "truncated: tensor 'output.weight'"),
])
def test_bad_gguf_is_one_line_and_leaves_nothing(tmp_path, change, match):
    import gguf

    from headcount.models.formats.gguf import GGUFError, cached_checkpoint

    hf = tiny_qwen2()
    path = write_like_llama_cpp(hf, tmp_path / "m.gguf", "qwen2", **change.get("fields", {}))
    if "drop" in change or "extra" in change:
        r = gguf.GGUFReader(str(path))
        w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "qwen2")
        for key, f in r.fields.items():
            if not key.startswith(("GGUF.", "general.architecture")):
                w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
        for t in r.tensors:
            if t.name != change.get("drop"):
                w.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed([int(x) for x in t.shape]))))
        if "extra" in change:
            w.add_tensor(change["extra"], np.zeros((4, 64), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        path = tmp_path / "b.gguf"
    if change.get("cut"):
        path.write_bytes(path.read_bytes()[:-1000])
    root = tmp_path / "cache"
    with pytest.raises(GGUFError, match=re.escape(match)) as e:
        cached_checkpoint(path, root=root)
    assert "\n" not in str(e.value)
    assert [p for p in root.iterdir()] == [] if root.exists() else True


# ------------------------------------------------------------- live: transformers' GGUF loader
@pytest.mark.skipif(not LIVE, reason="HEADCOUNT_LIVE_GGUF=1 runs transformers' GGUF loader live (minutes)")
@pytest.mark.parametrize("name", MODELS)
def test_live_against_transformers_gguf_loader(name):
    """Everything above, against transformers' GGUF loader run now: full logits, every tensor,
    AutoTokenizer(dir, gguf_file=...) against AutoTokenizer on the cache directory."""
    if not zoo.installed(name):
        pytest.skip(zoo.ZOO[name].pip_command)
    gguf_path, _ = zoo.packaged_gguf(name)
    ref = reference_for(name, gguf_path)
    ours = _transformers_on_cache(name, {name: ref})
    assert ours["digests"] == ref["digests"]
    assert (ours["logits"] - ref["_logits"]).abs().max().item() <= 1e-5
    _same_config(ours["config"], ref["config"])
    tok = transformers.AutoTokenizer.from_pretrained(str(ours["dir"]))
    for text in TEXTS:
        assert tok(text).input_ids == ref["tokens"][text], text


# ----------------------------------------------------------------------------- the reference
def reference_for(name: str, gguf_path: Path) -> dict:
    """transformers' own GGUF loader on the assembled file: config, tensor digests, token ids of
    TEXTS, logits on the first 64 tokens of PROMPT."""
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokens = {text: tok(text).input_ids for text in TEXTS}
    ids = tok(PROMPT).input_ids[:N_TOKENS]
    assert len(ids) == N_TOKENS
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                           dtype=torch.float32, attn_implementation="eager").eval()
    logits = _hf_logits(hf, ids)
    return {"config": _config(hf.config), "tokens": tokens, "input_ids": ids, "logits": fingerprint(logits),
            "_logits": logits, "digests": _digests(hf)}


def write_reference() -> None:
    out = {"_about": "transformers' GGUF loader (from_pretrained(dir, gguf_file=...)) on the GGUF files of "
                     "the zoo models, written by tests/test_models_gguf_qwen_gemma.py",
           "transformers": transformers.__version__}
    for name in MODELS:
        gguf_path, sha = zoo.packaged_gguf(name)
        ref = reference_for(name, gguf_path)
        ref["gguf_sha256"] = sha
        ours = _transformers_on_cache(name, {name: ref})
        print(f"{name}: transformers on the cache directory vs its GGUF loader: logits max abs diff "
              f"{(ours['logits'] - ref['_logits']).abs().max().item():.3g}, tensors equal: "
              f"{ours['digests'] == ref['digests']}", file=sys.stderr)
        del ref["_logits"]
        out[name] = ref
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {REFERENCE}", file=sys.stderr)


if __name__ == "__main__":
    write_reference()
