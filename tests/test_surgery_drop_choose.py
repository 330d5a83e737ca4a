"""drop_order and drop_attention (surgery/dropping/) against independent truths: the similarity of each attention
sublayer's input and output read off a copy whose MLP in that layer is zeroed (so the layer's output IS x + a), the
loss score from full forwards of a copy whose o_proj is zeroed; the edit drops exactly the order's cheapest layers."""

import copy

import pytest
import torch
import torch.nn.functional as F

from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery.dropping import DropOrder, drop_attention, drop_order
from headcount.surgery.dropping.drop import layer_count

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"llama": {}, "sandwich": {"norm": "rms_float", "post_norms": True, "mlp": "gated_gelu_tanh"},
            "granite": {"residual_multiplier": 0.7}}


def tiny(variant: str = "llama", n_layers: int = 4, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=53, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=40,
                        max_position=64, **VARIANTS[variant])
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for i, layer in enumerate(model.layers):  # attention of very different sizes, so the order is not a tie
            layer.attn.o_proj.weight.mul_(0.25 * (1 + 3 * ((i * 7) % n_layers)))
            for name, p in layer.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model


def windows(n: int = 4, t: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 53, (n, t), generator=torch.Generator().manual_seed(seed))


def true_similarity(model, ids, i) -> float:
    """cos(x, x + a) at layer i: with that layer's MLP zeroed, the layer maps x to x + a exactly."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        ref.layers[i].mlp.down_proj.weight.zero_()
    seen = {}
    h = ref.layers[i].register_forward_hook(lambda m, args, kwargs, out: seen.update(x=args[0], y=out[0]),
                                            with_kwargs=True)
    with torch.no_grad():
        ref(ids)
    h.remove()
    return float(F.cosine_similarity(seen["x"].double(), seen["y"].double(), dim=-1).mean())


def lm_loss(model, ids) -> float:
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_similarity_order_is_the_cosine_of_each_attention_input_and_output(variant):
    model = tiny(variant)
    ids = windows()
    order = drop_order(model, calibration=ids)
    truth = {i: true_similarity(model, ids, i) for i in range(4)}
    for i in range(4):
        assert order.scores[i] == pytest.approx(truth[i], abs=1e-6)
    assert order.layers == sorted(truth, key=lambda i: -truth[i])  # most similar (least changed) first
    assert order.by == "similarity" and order.n_layers == 4 and order.calibration_tokens == ids.numel()


def test_loss_order_is_the_loss_of_dropping_each_layer_alone():
    model = tiny()
    ids = windows()
    order = drop_order(model, by="loss", calibration=ids)
    base = lm_loss(model, ids)
    assert order.base_loss == pytest.approx(base, abs=1e-4)
    for i in range(4):
        zeroed = copy.deepcopy(model)
        with torch.no_grad():
            zeroed.layers[i].attn.o_proj.weight.zero_()
        assert order.scores[i] == pytest.approx(lm_loss(zeroed, ids) - base, abs=1e-4)
    assert order.layers == sorted(range(4), key=lambda i: order.scores[i])
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in tiny().parameters())  # untouched


@pytest.mark.parametrize("n,fraction,count", [(4, 0.25, 1), (4, 0.5, 2), (4, 0.6, 2), (8, 0.3125, 3), (24, 0.25, 6),
                                              (24, 0.01, 1)])
def test_fraction_counts_layers_round_half_up_at_least_one(n, fraction, count):
    assert layer_count(n, fraction) == count


def test_drop_attention_takes_the_orders_cheapest_layers_and_counts_the_kv_cache():
    model = tiny()
    given = DropOrder("loss", [2, 0, 3, 1], {0: 0.2, 1: 0.9, 2: 0.1, 3: 0.5}, n_layers=4)
    result = drop_attention(model, fraction=0.5, order=given)
    assert result.dropped == result.layers == [0, 2] and model.dropped_layers == (0, 2)
    assert result.by == "loss" and result.order_seconds == 0.0
    per_layer = 2 * 2 * 8 * 4  # K and V, 2 K/V heads of 8, fp32
    assert (result.kv_bytes_per_token_before, result.kv_bytes_per_token_after) == (4 * per_layer, 2 * per_layer)
    assert result.params_after == sum(p.numel() for p in model.parameters()) < result.params_before
    data = result.to_json()
    assert data["dropped"] == [0, 2] and data["kv_bytes_per_token_after"] == 2 * per_layer
    # the same order again: the layers that still have attention, cheapest first (3 before 1)
    again = drop_attention(model, fraction=0.25, order=given)
    assert again.dropped == [3]


def test_named_layers_and_bad_input_change_nothing():
    model = tiny()
    assert drop_attention(model, layers=[3]).dropped == [3] and model.dropped_layers == (3,)
    for kwargs, message in [({}, "exactly one"), ({"fraction": 0.5, "layers": [1]}, "exactly one"),
                            ({"fraction": 1.0}, r"fraction: expected a number in \(0, 1\)"),
                            ({"fraction": 0.0}, r"fraction: expected"), ({"layers": [4]}, r"0\.\.3"),
                            ({"layers": [3]}, "already dropped"), ({"layers": [0, 1, 2]}, "all 4 layers"),
                            ({"fraction": 0.9}, "keep at least one"), ({"layers": [1], "by": "cos"}, "by: expected"),
                            ({"fraction": 0.25, "order": DropOrder("loss", [0], {0: 0.0}, n_layers=5)},
                             "5 layers")]:
        with pytest.raises(ValueError, match=message):
            drop_attention(model, **kwargs)
        assert model.dropped_layers == (3,)


def test_an_encoder_is_refused():
    from headcount.models.encoder import Encoder, EncoderConfig

    enc = Encoder(EncoderConfig(vocab_size=30, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_position=16))
    with pytest.raises(ValueError, match="drop-attention edits decoders"):
        drop_order(enc)
