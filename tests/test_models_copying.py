"""attention_copy: the attention modules are the copy's own, everything else is shared; pruning the copy
leaves the original's outputs unchanged."""

import torch

from headcount.models import Decoder, DecoderConfig, attention_copy
from headcount.surgery import prune


def test_attention_copy_shares_everything_but_attention_and_edits_stay_in_the_copy():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=40, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32,
                                  max_position=32)).eval()
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    twin = attention_copy(model)
    assert twin.embed.weight is model.embed.weight and twin.layers[0].mlp is not model.layers[0].mlp
    assert twin.layers[0].mlp.down_proj.weight is model.layers[0].mlp.down_proj.weight
    assert all(a is not b for a, b in zip(twin.layers[1].attn.parameters(), model.layers[1].attn.parameters()))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, before, rtol=0, atol=0)
    prune(twin, {0: [1], 1: [0, 3]}, calibration=ids, progress=False)
    assert twin.layers[1].attn.n_heads == 2 and model.layers[1].attn.n_heads == 4
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
        assert not torch.allclose(twin(ids).logits, before)
