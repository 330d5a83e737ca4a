"""Data-parallel scoring (group=): two gloo ranks score windows r::2 and all-reduce the sums, so each rank
returns the single-process scores."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from headcount.analysis.head_importance import importance
from headcount.models import Decoder, DecoderConfig, Encoder, EncoderConfig


pytestmark = pytest.mark.usefixtures("one_thread_for_tiny_models")


def _models():
    torch.manual_seed(0)
    dec = Decoder(DecoderConfig(vocab_size=40, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32,
                                max_position=32), dtype=torch.float64).eval()
    torch.manual_seed(1)
    enc = Encoder(EncoderConfig(vocab_size=40, d_model=24, n_layers=2, n_heads=3, d_ff=32, max_position=32),
                  dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 40, (5, 8), generator=g)  # 5 windows: ranks get 3 and 2
    sent = torch.randint(1, 40, (5, 7), generator=g)
    mask = torch.ones_like(sent)
    mask[2, 4:] = 0
    return dec, enc, ids, [(sent, mask)]


CASES = [("dec", "gradient"), ("dec", "ablation"), ("dec", "reconstruction"), ("enc", "gradient")]


def _score(group):
    dec, enc, ids, sentences = _models()
    out = {}
    for which, method in CASES:
        model, windows = (dec, ids) if which == "dec" else (enc, sentences)
        s = importance(model, method=method, windows=windows, group=group, progress=False, batch_size=2)
        out[(which, method)] = (s.scores, s.n_tokens)
    return out


def _worker(rank, world, path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}/store", rank=rank, world_size=world)
    try:
        torch.save(_score("auto"), f"{path}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_equal_one_process(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    single = _score(None)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for key in CASES:
            scores, n = got[key]
            torch.testing.assert_close(scores, single[key][0], rtol=1e-6, atol=1e-12, msg=str(key))
            assert n == single[key][1]


def test_auto_without_an_initialised_group_is_single_process():
    dec, _, ids, _ = _models()
    a = importance(dec, method="gradient", windows=ids, group="auto", progress=False)
    b = importance(dec, method="gradient", windows=ids, progress=False)
    assert torch.equal(a.scores.nan_to_num(), b.scores.nan_to_num())
