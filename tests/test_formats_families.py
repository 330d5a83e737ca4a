"""families.py's table: it covers every model_type the transformers reader knows, every entry's reader and
config keys exist, and every family it can write round-trips headcount -> transformers state dict ->
headcount on a tiny random config with the same config and the same weights (no transformers needed: the
reader is the writer's independent truth here; the exactness tests check both against transformers)."""

import pytest
import torch

from headcount.models.decoder import Decoder
from headcount.models.encoder import BidirectionalEncoder, Encoder
from headcount.models.formats import hf_config, hf_config_write
from headcount.models.formats.families import BY_MODEL_TYPE, FAMILIES, SUPPORTED, Family
from headcount.models.formats.hf import HF_CLASSES, from_state_dict, hf_classes, to_transformers_state_dict

# shared by every tiny config: 2 layers, 4 query / 2 KV heads of 8, untied, a small vocabulary
SHAPE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=2, pad_token_id=0)
# model_type (plus a variant) -> config fields beyond SHAPE that switch on what the family has
CONFIGS = {
    "bert": dict(type_vocab_size=2, hidden_act="gelu"),
    "llama": dict(attention_bias=True, mlp_bias=True),
    "qwen2": dict(use_sliding_window=True, sliding_window=8, max_window_layers=1),
    "qwen3": dict(head_dim=12),
    "mistral": dict(sliding_window=8),
    "gemma3_text": dict(head_dim=8, sliding_window=8, sliding_window_pattern=2, query_pre_attn_scalar=12),
    "gemma3_text bidirectional": dict(head_dim=8, sliding_window=8, sliding_window_pattern=2,
                                      use_bidirectional_attention=True),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[1],
                      norm_topk_prob=True),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=8),
    "phi3": dict(partial_rotary_factor=0.5, sliding_window=8),
    "smollm3": dict(no_rope_layer_interval=2, use_sliding_window=True, sliding_window=8),
    "granite": dict(embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=3.0,
                    attention_bias=True),
    "gemma2": dict(head_dim=8, sliding_window=8, query_pre_attn_scalar=12, attn_logit_softcapping=20.0,
                   final_logit_softcapping=15.0),
    "gpt_neox": dict(rotary_pct=0.5, use_parallel_residual=True),
    "olmo2": dict(),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64),  # read only: no transformers classes named
}


def test_table_covers_every_family_the_reader_knows():
    # every config reader belongs to an entry and every entry's reader exists
    assert {f.reader for f in FAMILIES.values() if not f.encoder} == set(hf_config._READERS)
    assert set(hf_config.SUPPORTED) == set(BY_MODEL_TYPE) == set(SUPPORTED)
    for kind in SUPPORTED:
        fam = BY_MODEL_TYPE[kind]
        assert kind in fam.model_types and FAMILIES[fam.name] is fam
        assert set(fam.keys) <= set(hf_config_write.CONFIG_KEYS), kind
        assert set(fam.norms) <= {"attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"}, kind
    # each family is read from a config.json of its model_type (gemma3's image + text type: test_models_gemma3),
    # and the writer's families all round-trip below
    cases = {case.split()[0] for case in CONFIGS}
    assert cases == set(SUPPORTED) - {"gemma3"}
    for case in CONFIGS:
        assert _tiny(case).config.family == BY_MODEL_TYPE[case.split()[0]].name
    assert set(HF_CLASSES) == {n for n, f in FAMILIES.items() if f.classes is not None and not f.encoder}


def test_table_covers_every_transformers_family_of_the_exactness_rows():
    """The random families checked against transformers (exactness.RANDOM_FAMILIES) are all in the table."""
    transformers = pytest.importorskip("transformers")
    from headcount.models import exactness

    for name, (cfg_cls, _, _) in exactness.RANDOM_FAMILIES.items():
        assert getattr(transformers, cfg_cls).model_type in BY_MODEL_TYPE, name


def test_table_classes_exist_in_transformers():
    transformers = pytest.importorskip("transformers")
    for fam in FAMILIES.values():
        for name in (*(fam.classes or ()), *([fam.bidirectional_class] if fam.bidirectional_class else [])):
            assert hasattr(transformers, name), (fam.name, name)


def test_family_entry_refuses_bad_rules():
    with pytest.raises(ValueError, match="attention_bias"):
        Family("x", ("x",), "llama", attention_bias="sometimes")
    with pytest.raises(ValueError, match="qkv"):
        Family("x", ("x",), "llama", qkv=("a", "b"))
    with pytest.raises(ValueError, match="mlp_bias"):
        Family("x", ("x",), "llama", mlp_bias="maybe")


def _tiny(case: str, seed: int = 0):
    """The headcount model of a tiny config.json of `case`, every parameter random (norms too, so Gemma's
    1 + w is exercised)."""
    kind = case.split()[0]
    cfg = {"model_type": kind, **SHAPE, **CONFIGS[case]}
    torch.manual_seed(seed)
    if BY_MODEL_TYPE[kind].encoder:
        model = Encoder(hf_config.encoder_config(cfg))
    else:
        dcfg = hf_config.decoder_config(cfg)
        model = Decoder(dcfg) if dcfg.causal else BidirectionalEncoder(dcfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


@pytest.mark.parametrize("case", sorted(c for c in CONFIGS if BY_MODEL_TYPE[c.split()[0]].classes is not None))
def test_round_trip_every_family(case):
    model = _tiny(case)
    fam = FAMILIES[model.config.family]
    hf, sd = to_transformers_state_dict(model)
    assert hf["architectures"] == [hf_classes(model)[1]] and hf["model_type"] == fam.model_types[0]
    back = from_state_dict(hf, sd, source=case)
    assert type(back) is type(model)
    assert back.config == model.config
    theirs = dict(back.named_parameters())
    assert set(theirs) == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        if fam.one_plus_norms and "norm" in name:  # stored as w - 1 in float32, read back as 1 + (w - 1)
            torch.testing.assert_close(theirs[name], p, rtol=0, atol=1e-6)
        else:
            assert torch.equal(theirs[name], p), name


@pytest.mark.parametrize("case", ["bert", "gpt_neox"])
def test_zero_head_families_pad_pruned_heads(case):
    """BERT and GPT-NeoX size heads by hidden_size / heads: a pruned layer comes back with every original head,
    the removed ones zero, and the same output as the pruned model."""
    pruned = _tiny(case)
    for layer, heads in ((0, [1]), (1, [0, 3])):
        pruned.layers[layer].attn.prune_heads(heads)
    hf, sd = to_transformers_state_dict(pruned)
    assert hf["num_attention_heads"] == SHAPE["num_attention_heads"]
    back = from_state_dict(hf, sd, source=case)
    ids = torch.randint(3, SHAPE["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = pruned(ids), back(ids)
    want = want.logits if hasattr(want, "logits") else want.last_hidden_state
    got = got.logits if hasattr(got, "logits") else got.last_hidden_state
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
