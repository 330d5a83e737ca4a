"""Randomly initialised transformers models of every supported family, converted to headcount:
same outputs (BERT 1e-4, decoder fp32 logits 1e-3; in practice ~1e-6), cached decoding, hooks."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount import MultiHeadAttention  # noqa: E402
from headcount.models import Decoder, Encoder, from_transformers, generate  # noqa: E402
from headcount.models.formats.hf import to_transformers, to_transformers_state_dict  # noqa: E402
from headcount.models.rotary import RotaryEmbedding, apply_rotary_reference  # noqa: E402

VOCAB = 96


def _hf(model_cls, config, attn="eager"):
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # some inits leave biases / norms at 0 / 1: make every tensor matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64, type_vocab_size=2)
    return _hf(transformers.BertModel, cfg)


def gpt2(head=True):
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return _hf(transformers.GPT2LMHeadModel if head else transformers.GPT2Model, cfg)


def llama(tie=False, bias=False, kv=2):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=kv, intermediate_size=96, max_position_embeddings=128,
                                   rope_theta=10000.0, tie_word_embeddings=tie, attention_bias=bias)
    return _hf(transformers.LlamaForCausalLM, cfg, attn="sdpa")


def qwen2():
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128,
                                   tie_word_embeddings=False, use_sliding_window=False)
    return _hf(transformers.Qwen2ForCausalLM, cfg, attn="sdpa")


def _ids(batch=2, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


# ---------------------------------------------------------------------------------------------- BERT
def test_bert_padded_batch_matches():
    hf = bert()
    ours = from_transformers(hf)
    assert isinstance(ours, Encoder) and isinstance(ours.layers[0].attn, MultiHeadAttention)
    ids = _ids(3, 10)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        out = ours(ids, mask, types)
    assert (out.last_hidden_state - ref.last_hidden_state).abs().max() <= 1e-4
    assert (out.pooler_output - ref.pooler_output).abs().max() <= 1e-4


def test_bert_weights_and_gates():
    ours = from_transformers(bert())
    ids = _ids(1, 9)
    with torch.no_grad():
        out = ours(ids, need_weights=True)
        assert len(out.weights) == 2 and out.weights[0].shape == (1, 4, 9, 9)
        torch.testing.assert_close(out.weights[1].sum(-1), torch.ones(1, 4, 9))
        same = ours(ids, head_gates=torch.ones(2, 4)).last_hidden_state
        gated = ours(ids, head_gates=torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])).last_hidden_state
    torch.testing.assert_close(same, out.last_hidden_state)
    assert (gated - out.last_hidden_state).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------- GPT-2
@pytest.mark.parametrize("head", [True, False], ids=["GPT2LMHeadModel", "GPT2Model"])
def test_gpt2_matches(head):
    hf = gpt2(head)
    ours = from_transformers(hf)
    assert ours.config.family == "gpt2" and ours.pos_embed is not None
    ids = _ids(2, 16)
    with torch.no_grad():
        ref = hf(input_ids=ids)
        out = ours(ids)
    if head:
        assert (out.logits - ref.logits).abs().max() <= 1e-3
        assert (out.logits - ref.logits).abs().max() <= 1e-5  # what it really is
    else:
        assert (out.hidden_states - ref.last_hidden_state).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------- Llama / Qwen2
CASES = {
    "llama-gqa": lambda: llama(),
    "llama-mqa-tied": lambda: llama(tie=True, kv=1),
    "llama-bias": lambda: llama(bias=True, kv=4),
    "qwen2": qwen2,
}


@pytest.mark.parametrize("case", list(CASES))
def test_decoder_logits_match(case):
    hf = CASES[case]()
    ours = from_transformers(hf)
    cfg = hf.config
    assert ours.layers[0].attn.n_kv_heads == cfg.num_key_value_heads
    assert ours.config.tie_embeddings == cfg.tie_word_embeddings
    if case == "qwen2":
        assert ours.layers[0].attn.qkv_proj.bias is not None and ours.layers[0].attn.o_proj.bias is None
    ids = _ids(2, 20)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        out = ours(ids).logits
    assert (out - ref).abs().max() <= 1e-3
    assert (out - ref).abs().max() <= 1e-5


def test_qkv_fusion_layout():
    """Rows of qkv_proj are [Q heads | K heads | V heads], each projection unchanged."""
    hf = qwen2()
    ours = from_transformers(hf)
    a, w = hf.model.layers[1].self_attn, ours.layers[1].attn.qkv_proj
    torch.testing.assert_close(w.weight[:64], a.q_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(w.weight[64:96], a.k_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(w.weight[96:], a.v_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(w.bias[64:96], a.k_proj.bias, rtol=0, atol=0)


def test_round_trip_state_dict():
    hf = llama()
    ours = from_transformers(hf)
    _, sd = to_transformers_state_dict(ours)
    for k, v in hf.state_dict().items():
        torch.testing.assert_close(sd[k], v, rtol=0, atol=0)
    back = to_transformers(ours)
    ids = _ids(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, hf(input_ids=ids).logits)


def test_decoder_padded_batch_matches():
    hf = llama()
    ours = from_transformers(hf)
    ids = _ids(2, 12)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = ours(ids, attention_mask=mask).logits
    assert (out[0] - ref[0]).abs().max() <= 1e-5
    assert (out[1, :8] - ref[1, :8]).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_cached_decoding_equals_full_forward(family):
    ours = from_transformers(llama() if family == "llama" else gpt2())
    ids = _ids(2, 14)
    with torch.no_grad():
        full = ours(ids).logits
        cache = ours.new_cache(2, 20)
        parts = [ours(ids[:, :9], cache=cache).logits]  # prefill
        parts += [ours(ids[:, t:t + 1], cache=cache).logits for t in range(9, 12)]  # one token at a time
        parts.append(ours(ids[:, 12:], cache=cache).logits)  # two at once, with cache
    assert cache[0].length == 14
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_last_only_and_context_limit():
    ours = from_transformers(llama())
    ids = _ids(1, 10)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, last_only=True).logits, ours(ids).logits[:, -1:])
    with pytest.raises(ValueError, match="context of 128"):
        ours(_ids(1, 129))
    with pytest.raises(ValueError, match="past the model's context"):
        ours.new_cache(1, 500)


def test_greedy_generation_matches_transformers():
    hf = llama()
    ours = from_transformers(hf)
    prompt = [5, 17, 42, 8, 33]
    ours_ids = generate(ours, prompt, 24, stop_at_eos=False).new_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                          max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    assert ours_ids == ref[0, 5:].tolist()


def test_sampling_is_seeded_and_validated():
    ours = from_transformers(llama())
    a = generate(ours, [1, 2, 3], 12, temperature=0.9, top_k=10, seed=7, stop_at_eos=False).new_ids
    b = generate(ours, [1, 2, 3], 12, temperature=0.9, top_k=10, seed=7, stop_at_eos=False).new_ids
    assert a == b and len(a) == 12
    with pytest.raises(ValueError, match="temperature"):
        generate(ours, [1], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        generate(ours, [1], 2, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="context of 128"):
        generate(ours, [1] * 100, 40)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(ours, [VOCAB + 5], 2)


def test_decoder_hooks_weights_and_gates():
    ours = from_transformers(llama())
    ids = _ids(1, 7)
    with torch.no_grad():
        plain = ours(ids).logits
        out = ours(ids, need_weights=True)
        assert len(out.weights) == 2 and out.weights[0].shape == (1, 4, 7, 7)
        assert torch.all(out.weights[0].triu(1) == 0)  # causal
        torch.testing.assert_close(out.logits, plain, rtol=1e-5, atol=1e-5)
        gates = torch.ones(2, 4)
        torch.testing.assert_close(ours(ids, head_gates=gates).logits, plain)
        gates[0, 2] = 0.0
        assert (ours(ids, head_gates=gates).logits - plain).abs().max() > 1e-4
        per_layer = [None, torch.tensor([1.0, 1.0, 0.0, 1.0])]
        assert (ours(ids, head_gates=per_layer).logits - plain).abs().max() > 1e-4
    with pytest.raises(ValueError, match="n_layers=2"):
        ours(ids, head_gates=torch.ones(3, 4))


def test_packed_weights_same_results_and_scoped():
    from headcount.models import packed
    from headcount.models.packing import available, is_packed

    hf = llama(tie=True)
    ours = from_transformers(hf)
    assert ours.lm_head.weight is ours.embed.weight  # tied
    ids = _ids(2, 9)
    with torch.no_grad():
        plain = ours(ids).logits
        with packed(ours):
            assert is_packed(ours) == available()
            with packed(ours):  # nested scopes reuse the packing
                inner = ours(ids).logits
            assert is_packed(ours) == available()
            fast = ours(ids).logits
            # a replaced weight (what prune_heads does) is noticed: plain F.linear for that layer
            lin = ours.layers[0].mlp.down_proj
            lin.weight = torch.nn.Parameter(lin.weight * 0.5)
            changed = ours(ids).logits
        assert not is_packed(ours) and "forward" not in lin.__dict__
        after = ours(ids).logits
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(inner, fast)
    torch.testing.assert_close(changed, after, rtol=1e-4, atol=1e-4)
    with packed(ours):  # gradients go through plain nn.Linear
        ours(ids).logits.sum().backward()
    assert ours.layers[1].mlp.gate_up_proj.weight.grad is not None


def test_rotary_matches_textbook_formula():
    rope = RotaryEmbedding(16, 64, theta=500.0)
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    q2, k2 = rope.hook(3, 5)(q, k)
    positions = torch.arange(3, 8)
    torch.testing.assert_close(q2, apply_rotary_reference(q, positions, 500.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k2, apply_rotary_reference(k, positions, 500.0), rtol=1e-5, atol=1e-5)
    q3, _ = rope.hook(position_ids=torch.arange(3, 8).expand(2, 5))(q, k)
    torch.testing.assert_close(q3, q2)
    with pytest.raises(ValueError, match="context of 64"):
        rope.hook(60, 5)


def test_rotary_tables_grow_and_stay_fp32():
    rope = RotaryEmbedding(8, 10_000, theta=10000.0)
    assert rope.cos.shape[0] == RotaryEmbedding.INITIAL_POSITIONS
    q = torch.randn(1, 1, 2, 8)
    out, _ = rope.hook(9_000, 2)(q, q)
    assert rope.cos.shape[0] >= 9_002
    torch.testing.assert_close(out, apply_rotary_reference(q, torch.arange(9_000, 9_002), 10000.0),
                               rtol=1e-4, atol=1e-4)
    rope.to(torch.bfloat16)
    assert rope.cos.dtype == torch.float32


def test_bf16_decoder_runs():
    ours = from_transformers(llama()).to(torch.bfloat16)
    with torch.no_grad():
        logits = ours(_ids(1, 6)).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert isinstance(ours, Decoder)


def test_packing_is_bounded_and_partial_packing_gives_the_same_results():
    """max_bytes packs Linears in module order until the next would pass it (the default bound keeps the
    packed copies under PACK_FIXED + PACK_OF_WEIGHTS x the weights); the output does not change."""
    from headcount.models import packed
    from headcount.models.packing import available

    if not available():
        pytest.skip("oneDNN packing ops are not available in this torch build")
    ours = from_transformers(llama(tie=True))
    ids = _ids(2, 9)
    linears = [m for m in ours.modules() if isinstance(m, torch.nn.Linear)]
    first = linears[0].weight.numel() * 4
    with torch.no_grad():
        plain = ours(ids).logits
        with packed(ours, max_bytes=first):  # room for the first Linear only
            patched = [lin for lin in linears if "forward" in lin.__dict__]
            part = ours(ids).logits
    assert patched == linears[:1]
    torch.testing.assert_close(part, plain, rtol=1e-4, atol=1e-4)
