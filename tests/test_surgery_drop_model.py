"""A decoder layer whose attention sublayer is dropped (models/dropped.py): against an independent truth, the same
model with that layer's o_proj zeroed (its attention output exactly zero), in one forward, with the KV cache, in
batched and continuous generation; saved and reloaded; its K/V bytes as the accounts count them."""

import copy
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.cost.edited import read_edited, totals
from headcount.models.continuous import generate_many
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.dropped import NoAttention, attention_layers, dropped_layers
from headcount.models.formats.native import save
from headcount.models.generation import generate
from headcount.models.zoo import load

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tiny_byte_decoder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {  # the block variants a dropped layer meets: pre-norm, sandwich norms, LayerNorm, parallel residual
    "llama": {},
    "gemma_like": {"norm": "rms_float", "mlp": "gated_gelu_tanh", "post_norms": True, "qk_norm": True,
                   "sliding_window": 4, "layer_types": ("sliding_attention", "full_attention", "sliding_attention")},
    "gpt2_like": {"norm": "layer", "mlp": "gelu_tanh", "position": "learned", "qkv_bias": True, "o_bias": True,
                  "mlp_bias": True},
    "neox_like": {"norm": "layer", "mlp": "gelu", "parallel_residual": True, "qkv_bias": True, "o_bias": True},
    "granite_like": {"residual_multiplier": 0.5},
}


def tiny(family: str = "llama", seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=40,
                        max_position=64, **FAMILIES[family])
    model = Decoder(cfg).eval()
    with torch.no_grad():  # norms and biases away from their initial values, so each one matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def zeroed(model: Decoder, layers) -> Decoder:
    """The truth: an unedited copy whose chosen layers' attention output is zero (o_proj weight and bias)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for i in layers:
            ref.layers[i].attn.o_proj.weight.zero_()
            if ref.layers[i].attn.o_proj.bias is not None:
                ref.layers[i].attn.o_proj.bias.zero_()
    return ref


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("layers", [(0,), (1,), (0, 2)])
def test_dropped_layer_equals_a_zero_attention_output(family, layers):
    model = tiny(family)
    ref = zeroed(model, layers)
    for i in layers:
        model.layers[i].drop_attention()
    assert model.dropped_layers == dropped_layers(model) == tuple(layers)
    assert attention_layers(model) == [i for i in range(3) if i not in layers]
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=1e-6)
        # the KV cache: prefill 5 tokens, then one at a time; the positions advance through a dropped layer 0
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :5], cache=cache).logits]
        steps += [model(ids[:, t:t + 1], cache=cache).logits for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, 1), ref(ids).logits, rtol=1e-5, atol=1e-5)
        assert all(cache[i].length == 12 for i in range(3))


def test_dropped_layer_has_no_weights_no_cache_and_a_clear_error():
    model = tiny()
    before = sum(p.numel() for p in model.parameters())
    attn_and_norm = sum(p.numel() for p in model.layers[1].attn.parameters()) + model.config.d_model
    model.layers[1].drop_attention()
    assert isinstance(model.layers[1].attn, NoAttention)
    assert sum(p.numel() for p in model.parameters()) == before - attn_and_norm
    assert not [n for n in model.state_dict() if n.startswith("layers.1.attn")]
    caches = model.new_cache(3, 20)
    assert caches[1].nbytes == 0 and caches[0].nbytes == 2 * 3 * 2 * 20 * 8 * 4
    with pytest.raises(AttributeError, match=r"layers\[1\]\.attn was dropped .* no 'o_proj'"):
        model.layers[1].attn.o_proj  # noqa: B018


def test_generation_batched_and_continuous_match_the_truth():
    model = tiny_byte_decoder()
    ref = zeroed(model, (0,))
    model.layers[0].drop_attention()
    prompts = ["the cat", "a much longer prompt than that", "x"]
    ours = [r.new_ids for r in generate(model, prompts, 8, stop_at_eos=False)]
    assert ours == [r.new_ids for r in generate(ref, prompts, 8, stop_at_eos=False)]
    assert generate(model, prompts[1], 8, stop_at_eos=False).new_ids == ours[1]
    many = generate_many(model, prompts, 8, batch_size=2, stop_at_eos=False)
    assert [r.new_ids for r in many] == [r.new_ids for r in generate_many(ref, prompts, 8, batch_size=2,
                                                                          stop_at_eos=False)]


def test_save_reload_and_the_accounts(tmp_path):
    model = tiny_byte_decoder()
    model.layers[1].drop_attention()
    save(model, tmp_path / "dropped")
    again = load(str(tmp_path / "dropped"))
    assert again.dropped_layers == (1,)
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    # KV bytes per token: the accounts of the saved layout == the caches the reloaded model allocates
    measured = sum(c.nbytes for c in again.new_cache(1, 1))
    counted = totals(read_edited(tmp_path / "dropped"), dtype="fp32")
    assert counted["kv_bytes_per_token"] == measured == 2 * 2 * 8 * 4  # one layer of 2 K/V heads x 8, fp32
    assert counted["params"] == sum(p.numel() for p in again.parameters())


def test_other_edits_and_analyses_skip_or_refuse_dropped_layers():
    from headcount.analysis import capture, importance
    from headcount.surgery import merge_kv, prune_to

    model = tiny()
    model.layers[1].drop_attention()
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(3))
    for call, message in [(lambda: prune_to(model, 0.25, calibration=ids, progress=False), "prune before dropping"),
                          (lambda: importance(model, ids), "score the model before dropping"),
                          (lambda: list(capture(model, ids)), r"layers\[1\]\.attn is NoAttention"),
                          (lambda: merge_kv(model, 1, layers=[1], calibration=ids, progress=False),
                           "layer 1's attention was dropped")]:
        with pytest.raises(ValueError, match=message):
            call()
    assert model.dropped_layers == (1,) and [l.attn.n_kv_heads for l in model.layers] == [2, 0, 2]
    # merging every layer merges the layers that have attention and leaves the dropped one as it is
    merge_kv(model, 1, calibration=ids, progress=False, uptrain_steps=0, local_steps=0)
    assert [l.attn.n_kv_heads for l in model.layers] == [1, 0, 1] and model.dropped_layers == (1,)
    assert sum(c.nbytes for c in model.new_cache(1, 1)) == 2 * (2 * 1 * 8 * 4)


@settings(max_examples=12)
@given(n_kv=st.integers(1, 3), group=st.integers(1, 3), head_dim=st.sampled_from([4, 8]),
       n_layers=st.integers(1, 4), data=st.data())
def test_dropping_any_layers_of_any_shape_equals_zero_attention(n_kv, group, head_dim, n_layers, data):
    dropped = data.draw(st.sets(st.integers(0, n_layers - 1), min_size=1), label="dropped")
    torch.manual_seed(n_kv * 100 + group * 10 + n_layers)
    cfg = DecoderConfig(vocab_size=31, d_model=16, n_layers=n_layers, n_heads=n_kv * group, n_kv_heads=n_kv,
                        head_dim=head_dim, d_ff=24, max_position=32)
    model = Decoder(cfg).eval()
    ref = zeroed(model, dropped)
    for i in dropped:
        model.layers[i].drop_attention()
    ids = torch.randint(0, 31, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=1e-6)
    per_layer = 2 * n_kv * head_dim * 4
    assert sum(c.nbytes for c in model.new_cache(1, 1)) == (n_layers - len(dropped)) * per_layer
