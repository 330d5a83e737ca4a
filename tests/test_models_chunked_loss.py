"""The loss without a [T, vocab] logits tensor: chunked_nll / Decoder.loss / perplexity equal the
unchunked loss (1e-6 relative), gradients included, and lm_head never sees more than `chunk` positions."""

import math
import os

import pytest
import torch
import torch.nn.functional as F

from headcount.models import Decoder, DecoderConfig, evaluate_perplexity
from headcount.models import decoder as decoder_module
from headcount.models.decoder import chunked_nll

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB = 300


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                        max_position=128, tie_embeddings=False)
    return Decoder(cfg).eval()


def _ids(batch=3, length=50, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _full_nll(model, ids):
    with torch.no_grad():
        logits = model(ids).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none").view(ids.shape[0], -1)


@pytest.mark.parametrize("chunk", [1, 7, 64, None])
def test_chunked_equals_unchunked(model, chunk):
    ids = _ids()
    want = _full_nll(model, ids)
    with torch.no_grad():
        hidden = model(ids, compute_logits=False).hidden_states
        got = model.token_nll(hidden[:, :-1], ids[:, 1:], chunk=chunk)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert abs(got.double().sum() - want.double().sum()) / want.double().sum() <= 1e-6
    assert (got - want).abs().max().item() <= 1e-5


def test_loss_ignores_masked_targets_like_transformers(model):
    ids = _ids(2, 30)
    targets = ids[:, 1:].clone()
    targets[1, 20:] = -100  # padding, as transformers' labels
    with torch.no_grad():
        hidden = model(ids, compute_logits=False).hidden_states[:, :-1]
        logits = model.lm_head(hidden).float()
        want = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))  # mean over non-ignored
        got = model.loss(hidden, targets, chunk=5)
    assert abs(got.item() - want.item()) / want.item() <= 1e-6


def test_gradients_equal_unchunked(model):
    ids = _ids(2, 20)
    hidden = model(ids, compute_logits=False).hidden_states.detach()[:, :-1].requires_grad_(True)
    targets = ids[:, 1:]
    F.cross_entropy(model.lm_head(hidden).reshape(-1, VOCAB), targets.reshape(-1)).backward()
    want_h, want_w = hidden.grad.clone(), model.lm_head.weight.grad.clone()
    hidden.grad = None
    model.lm_head.weight.grad = None
    model.loss(hidden, targets, chunk=6).backward()
    assert (hidden.grad - want_h).abs().max().item() <= 1e-6
    assert (model.lm_head.weight.grad - want_w).abs().max().item() <= 1e-6
    model.zero_grad(set_to_none=True)


def test_perplexity_never_builds_the_full_logits(model, monkeypatch):
    ids = _ids(1, 120)[0].tolist()
    want_nll = float(_full_nll(model, torch.tensor([ids[:60], ids[60:]])).double().mean())
    monkeypatch.setattr(decoder_module, "LOGIT_ELEMENTS", 16 * VOCAB)  # 16 positions per lm_head call
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: rows.append(out.reshape(-1, VOCAB).shape[0]))
    try:
        result = evaluate_perplexity(model, ids, window=60, batch_size=2)
    finally:
        hook.remove()
    assert rows and max(rows) <= 16 and sum(rows) == 2 * 59
    assert result.n_scored == 118 and result.n_windows == 2 and result.window == 60
    assert abs(result.nll - want_nll) / want_nll <= 1e-6
    assert abs(result.perplexity - math.exp(want_nll)) / math.exp(want_nll) <= 1e-6


def test_gradient_chunks_are_a_quarter_of_the_inference_chunks(model, monkeypatch):
    """With gradients a chunk's backward holds about four [chunk, vocab] tensors: the default chunk is smaller."""
    monkeypatch.setattr(decoder_module, "LOGIT_ELEMENTS", 16 * VOCAB)
    monkeypatch.setattr(decoder_module, "LOGIT_ELEMENTS_GRAD", 4 * VOCAB)
    ids = _ids(2, 20)
    hidden = model(ids, compute_logits=False).hidden_states.detach()[:, :-1]
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: rows.append(out.reshape(-1, VOCAB).shape[0]))
    try:
        with torch.no_grad():
            plain = chunked_nll(hidden, ids[:, 1:], model.lm_head)
        assert max(rows) == 16
        rows.clear()
        leaf = hidden.clone().requires_grad_(True)
        graded = chunked_nll(leaf, ids[:, 1:], model.lm_head)
        graded.sum().backward()
    finally:
        hook.remove()
    assert max(rows) == 4  # the forward's chunks and their recomputation in the backward
    assert (graded.detach() - plain).abs().max().item() <= 1e-5
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_default_chunk_follows_the_vocabulary():
    head = torch.nn.Linear(8, 262_144, bias=False, device="meta")
    assert decoder_module.LOGIT_ELEMENTS // 262_144 == 128  # Gemma 3: 128 positions (128 MiB of fp32) a call
    with pytest.raises(ValueError, match="targets"):
        chunked_nll(torch.zeros(2, 3, 8, device="meta"), torch.zeros(2, 4, dtype=torch.long, device="meta"), head)


def test_matches_transformers_causal_lm_loss():
    transformers = pytest.importorskip("transformers")
    from headcount.models import from_transformers

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    ours = from_transformers(hf)
    ids = _ids(2, 40)
    with torch.no_grad():
        want = hf(input_ids=ids, labels=ids).loss.item()
        got = ours.loss(ours(ids, compute_logits=False).hidden_states[:, :-1], ids[:, 1:], chunk=9).item()
    assert abs(got - want) / want <= 1e-6
