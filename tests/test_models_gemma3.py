"""Gemma 3 against transformers on random small configs (no download): gemma3_text causal and
bidirectional, the language model of gemma3 (image + text), the writer, refusals.

One tiny config serves most tests: 6 layers (5 sliding-window layers of window 8, then 1 global),
4 query heads / 1 KV head (MQA) of head_dim 32 on d_model 64 (decoupled), query_pre_attn_scalar 24,
linear rotary scaling on the global layer, rope base 1e6 global / 1e4 local.
"""

import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import CheckpointError, Decoder, from_transformers, generate, load_checkpoint  # noqa: E402
from headcount.models.encoder import BidirectionalEncoder  # noqa: E402
from headcount.models.formats.hf import (export_transformers, from_state_dict, to_transformers,  # noqa: E402
                                         to_transformers_state_dict)

VOCAB = 128
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=1, head_dim=32, max_position_embeddings=256, sliding_window=8,
            query_pre_attn_scalar=24,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})


def _randomise(model, seed=0):
    """Weights that make every tensor matter and greedy decoding not collapse onto one token: norms
    (stored as w, multiplied by 1 + w) N(0, 0.3), the tied embedding N(0, 0.02), the rest N(0, 0.3)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.02 if "embed" in name else 0.3
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def gemma3(**overrides):
    cfg = transformers.Gemma3TextConfig(**{**TEXT, **overrides})
    cfg._attn_implementation = "sdpa"
    return _randomise(transformers.Gemma3ForCausalLM(cfg))


@pytest.fixture(scope="module")
def pair():
    hf = gemma3()
    return hf, from_transformers(hf)


def _ids(batch=2, length=40, seed=1):
    """Token ids from 3 up: 0 is Gemma's pad id, which generate() would mask out of a prompt."""
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_config_is_read_per_layer(pair):
    _, ours = pair
    assert isinstance(ours, Decoder) and ours.config.family == "gemma3"
    windows = [layer.attn.sliding_window for layer in ours.layers]
    assert windows == [8, 8, 8, 8, 8, None]  # every 6th layer global
    attn = ours.layers[0].attn
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (4, 1, 32)
    assert attn.softmax_scale == 24 ** -0.5 and attn.q_norm is not None and attn.k_norm is not None
    assert ours.rotary.theta == 1e6 and ours.rotary.linear_factor == 2.0 and ours.rotary_local.theta == 1e4
    assert ours.config.embed_scale == 64 ** 0.5 and ours.lm_head.weight is ours.embed.weight


def test_logits_match_on_a_padded_batch(pair):
    hf, ours = pair
    ids = _ids(2, 40)
    mask = torch.ones_like(ids)
    mask[1, 29:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = ours(ids, attention_mask=mask).logits
    assert (out - ref)[mask.bool()].abs().max().item() <= 1e-4


def test_greedy_past_the_window_equals_transformers_generate(pair):
    hf, ours = pair
    prompt = _ids(1, 12, seed=3)  # longer than the window of 8: the sliding caches have evicted keys
    want = hf.generate(prompt, max_new_tokens=24, do_sample=False)[0, 12:].tolist()
    got = generate(ours, prompt[0], 24).new_ids  # both stop at eos (id 1), and keep it
    assert got == want and len(got) >= 12 and len(set(got)) > 3


def test_cached_decoding_equals_a_full_forward(pair):
    _, ours = pair
    ids = _ids(1, 30, seed=4)
    with torch.no_grad():
        full = ours(ids).logits
        cache = ours.new_cache(1, 30)
        steps = [ours(ids[:, :10], cache=cache).logits]
        steps += [ours(ids[:, t:t + 1], cache=cache).logits for t in range(10, 30)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4
    assert cache[0].k.shape[2] == 8 and cache[5].k.shape[2] == 30  # local layers keep only the window


def test_embedding_scale_is_rounded_like_transformers_in_bf16(pair):
    hf, ours = pair
    ids = _ids(1, 16)
    model = to_transformers(ours).to(torch.bfloat16)
    ref = model.model.embed_tokens(ids)
    bf = from_transformers(model, dtype=torch.bfloat16)
    box = {}
    hook = bf.layers[0].register_forward_pre_hook(lambda m, args: box.setdefault("x", args[0]))
    with torch.no_grad():
        bf(ids)
    hook.remove()
    assert box["x"].dtype == torch.bfloat16 and torch.equal(box["x"], ref)


def test_writer_round_trip_and_export(pair, tmp_path):
    hf, ours = pair
    cfg, sd = to_transformers_state_dict(ours)
    theirs = hf.state_dict()
    for name, value in sd.items():  # norms written back as w = weight - 1
        assert (value - theirs[name]).abs().max().item() <= 1e-6, name
    assert cfg["model_type"] == "gemma3_text" and cfg["query_pre_attn_scalar"] == 24
    ids = _ids(1, 24)
    export_transformers(ours, tmp_path / "hf")
    back = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    reread = load_checkpoint(tmp_path / "hf")
    with torch.no_grad():
        ref = hf(ids).logits
        assert (to_transformers(ours)(ids).logits - ref).abs().max().item() <= 1e-4
        assert (back(ids).logits - ref).abs().max().item() <= 1e-4
        assert (reread(ids).logits - ref).abs().max().item() <= 1e-4
    assert [layer.attn.sliding_window for layer in reread.layers] == [8, 8, 8, 8, 8, None]


def test_checkpoint_saved_by_transformers_loads(pair, tmp_path):
    hf, _ = pair
    hf.save_pretrained(tmp_path / "ckpt")
    ours = load_checkpoint(tmp_path / "ckpt")
    ids = _ids(1, 20)
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("field,value", [("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0)])
def test_soft_capping_is_refused_by_name(pair, field, value):
    hf, _ = pair
    cfg = {**hf.config.to_dict(), field: value}
    with pytest.raises(CheckpointError, match=field):
        from_state_dict(cfg, hf.state_dict())


def test_unimplemented_rope_is_refused_by_name(pair):
    hf, _ = pair
    cfg = hf.config.to_dict()
    cfg["rope_parameters"] = {**cfg["rope_parameters"],
                              "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}
    with pytest.raises(CheckpointError, match="rope_parameters.full_attention: rotary scaling 'yarn'"):
        from_state_dict(cfg, hf.state_dict())


def test_older_config_spelling(pair):
    """rope_theta / rope_local_base_freq / rope_scaling / sliding_window_pattern and omitted defaults."""
    hf, ours = pair
    cfg = {k: v for k, v in hf.config.to_dict().items()
           if k not in ("rope_parameters", "layer_types", "head_dim", "rms_norm_eps", "tie_word_embeddings")}
    cfg.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"type": "linear", "factor": 2.0},
               sliding_window_pattern=6, head_dim=32)
    old = from_state_dict(cfg, hf.state_dict())
    assert old.config == ours.config


def test_gemma3_image_text_model_gives_its_language_model():
    text = {**TEXT, "num_hidden_layers": 3, "sliding_window_pattern": 3}
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                    image_token_index=127, boi_token_index=125, eoi_token_index=126)
    cfg._attn_implementation = "sdpa"
    hf = _randomise(transformers.Gemma3ForConditionalGeneration(cfg))
    with pytest.warns(UserWarning, match="vision tower"):
        ours = from_transformers(hf)
    ids = torch.randint(3, 120, (1, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        assert (ours(ids).logits - ref).abs().max().item() <= 1e-4
        # the older checkpoint layout: language_model.model.* (and vision_tower.* beside it)
        old = {k.replace("model.language_model.", "language_model.model.").replace("model.vision_tower.",
                                                                                    "vision_tower."): v
               for k, v in hf.state_dict().items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = from_state_dict(hf.config.to_dict(), old)
        assert (again(ids).logits - ref).abs().max().item() <= 1e-4


def test_bidirectional_gemma_is_an_encoder():
    cfg = transformers.Gemma3TextConfig(**{**TEXT, "use_bidirectional_attention": True, "sliding_window": 9})
    cfg._attn_implementation = "sdpa"
    hf = _randomise(transformers.Gemma3TextModel(cfg))
    ours = from_transformers(hf)
    assert isinstance(ours, BidirectionalEncoder) and not hasattr(ours, "lm_head")
    window = ours.layers[0].attn.sliding_window
    assert window == 9 // 2 + 1  # transformers: |p - j| < sliding_window // 2 + 1
    ids = _ids(2, 24)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        out = ours(ids, mask)
        assert (out.last_hidden_state - ref)[mask.bool()].abs().max().item() <= 1e-4
        weights = ours(ids[:1], need_weights=True).weights
    dist = (torch.arange(24)[:, None] - torch.arange(24)[None, :]).abs()
    assert weights[0][0, :, dist >= window].abs().max().item() == 0  # local: a band on both sides
    assert weights[5][0, :, torch.triu(torch.ones(24, 24, dtype=torch.bool), 1)].abs().min().item() > 0  # global
    back = to_transformers(ours)
    assert type(back).__name__ == "Gemma3TextModel" and back.config.sliding_window == window
    with torch.no_grad():
        assert (back(input_ids=ids).last_hidden_state - hf(input_ids=ids).last_hidden_state).abs().max() <= 1e-4
