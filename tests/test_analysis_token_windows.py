"""analysis.batches.token_windows: the perplexity definition's full windows (evaluation.windows), BOS-opened
where the tokenizer adds one (Gemma 3), checked against the stream cut by hand."""

import pytest
import torch

from headcount.analysis.batches import token_windows
from headcount.models.decoder import Decoder, DecoderConfig


class _Tok:
    """Each character one token (its code point); BOS 1 when add_special_tokens."""

    def __init__(self, bos: bool):
        self.add_special_tokens, self.bos_token_id = bos, 1

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _model(bos: bool):
    model = Decoder(DecoderConfig(vocab_size=200, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=8,
                                  max_position=64))
    model.tokenizer = _Tok(bos)
    return model


@pytest.mark.parametrize("bos", [False, True])
def test_windows_are_the_stream_cut_by_hand(bos):
    text = "abcdefghijklmnopqrstuvwxyz" * 2
    stream = [ord(c) for c in text]
    rows = token_windows(_model(bos), text, window=8)
    step = 7 if bos else 8
    expected = [([1] if bos else []) + stream[i:i + step] for i in range(0, len(stream) - step + 1, step)]
    assert torch.equal(rows, torch.tensor(expected))
    assert torch.equal(token_windows(_model(bos), text, window=8, max_windows=2), torch.tensor(expected[:2]))


def test_too_little_text_names_the_window():
    with pytest.raises(ValueError, match="less than one window of 8"):
        token_windows(_model(True), "abcdef", window=8)
