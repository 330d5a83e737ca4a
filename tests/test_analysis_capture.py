"""capture(): the same weights as need_weights on tiny models (rotary GQA decoder, encoder), one layer at
a time, hooks removed afterwards, and clear errors."""

import pytest
import torch

from headcount.analysis.capturing import capture
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.encoder import Encoder, EncoderConfig


def tiny_decoder():
    torch.manual_seed(0)
    return Decoder(DecoderConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48,
                                 max_position=64)).eval()


def tiny_encoder():
    torch.manual_seed(0)
    return Encoder(EncoderConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_position=64)).eval()


def no_hooks(model):
    return all(not layer.attn._forward_hooks and not layer.attn._forward_pre_hooks for layer in model.layers)


@pytest.mark.parametrize("make", [tiny_decoder, tiny_encoder])
def test_capture_matches_need_weights(make):
    model = make()
    ids = torch.randint(0, 40, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    with torch.no_grad():
        if isinstance(model, Decoder):
            want = model(ids, attention_mask=mask, need_weights=True).weights
        else:
            want = model(ids, mask, need_weights=True).weights
    got = list(capture(model, (ids, mask)))
    assert [layer for layer, _ in got] == list(range(len(model.layers)))
    for (layer, w), ref in zip(got, want):
        assert w.shape == ref.shape == (2, 4, 12, 12)
        torch.testing.assert_close(w, ref, atol=1e-5, rtol=1e-4)
    # summaries form: one forward, a callback per layer
    sums = capture(model, (ids, mask), layers=[0, -1], summaries=lambda layer, w: w.sum(-1))
    assert sorted(sums) == [0, len(model.layers) - 1]
    torch.testing.assert_close(sums[0], want[0].sum(-1), atol=1e-5, rtol=1e-4)
    assert no_hooks(model)


def test_rotary_weights_are_causal_rows_summing_to_one():
    model = tiny_decoder()
    ids = torch.randint(0, 40, (1, 10))
    for _, w in capture(model, ids):
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 10))
        assert torch.all(w.triu(1) == 0)


def test_generator_closed_early_cleans_up():
    model = tiny_decoder()
    gen = capture(model, torch.randint(0, 40, (1, 8)))
    layer, w = next(gen)
    assert layer == 0
    gen.close()
    assert no_hooks(model)
    assert len(list(capture(model, torch.randint(0, 40, (1, 8)), layers=[2]))) == 1


def test_one_layer_alive_at_a_time():
    """The forward waits for the consumer: when layer i is handed over, layer i+1 has not run."""
    model = tiny_decoder()
    ran = []
    handles = [layer.attn.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, layer in
               enumerate(model.layers)]
    try:
        for layer, _ in capture(model, torch.randint(0, 40, (1, 8))):
            assert max(ran) == layer
    finally:
        for h in handles:
            h.remove()


def test_bad_input():
    model = tiny_decoder()
    with pytest.raises(ValueError, match="out of range"):
        list(capture(model, torch.randint(0, 40, (1, 8)), layers=[3]))
    with pytest.raises(ValueError, match="cannot return attention weights|layers\\[i\\].attn"):
        capture(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), summaries=lambda l, w: 0)
    with pytest.raises(ValueError, match="input_ids"):
        capture(model, torch.zeros(8), summaries=lambda l, w: 0)
    err = RuntimeError("boom")

    def fail(layer, w):
        raise err

    with pytest.raises(RuntimeError, match="boom"):
        capture(model, torch.randint(0, 40, (1, 8)), summaries=fail)
    assert no_hooks(model)
