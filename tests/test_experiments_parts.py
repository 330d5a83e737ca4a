"""The experiments' parts against independent truths: principal angles vs scipy, the schedule, the
byte corpus split, results as JSON, threads."""

import json
import math

import pytest
import torch
from hypothesis import given, strategies as st

from headcount.experiments.results import ExperimentResult, SweepRow, mean_std


@given(d=st.integers(3, 9), k=st.integers(1, 3), m=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_principal_angles_match_scipy(d, k, m, seed):
    from scipy.linalg import subspace_angles
    from headcount.experiments.write_address import principal_angles
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(d, k, generator=gen, dtype=torch.float64)
    b = torch.randn(d, m, generator=gen, dtype=torch.float64)
    expected = torch.tensor(sorted(subspace_angles(a.numpy(), b.numpy())), dtype=torch.float64)
    torch.testing.assert_close(principal_angles(a, b), expected, atol=1e-6, rtol=0)


def test_warmup_cosine_schedule():
    from headcount.experiments.train import warmup_cosine
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, steps=100, warmup=10)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 89 / 90)))
    assert all(x >= y for x, y in zip(lrs[9:], lrs[10:]))


def test_byte_corpus_windows_and_unigram():
    from headcount.data import default_corpus
    from headcount.experiments.small import ByteCorpus
    corpus = ByteCorpus.load()
    assert bytes(corpus.held_out.to(torch.uint8).tolist()) == default_corpus().held_out_text.encode("utf-8")
    w = corpus.held_out_windows(16, max_windows=5)
    assert w.shape == (5, 17) and torch.equal(w[1, 0], corpus.held_out[16]) and torch.equal(w[0, 16], w[1, 0])
    counts = torch.bincount(corpus.calibration, minlength=256).double() + 1
    expected = -(counts / counts.sum()).log()[corpus.held_out].mean()
    assert corpus.unigram_nll() == pytest.approx(float(expected))
    batch = corpus.batch(torch.Generator().manual_seed(0), 3, 8)
    assert batch.shape == (3, 9) and batch.max() < 256


def test_check_heads():
    from headcount.experiments.small import check_heads
    assert check_heads([1, 2, 4], 64) == (1, 2, 4)
    with pytest.raises(ValueError, match="3 heads do not divide d_model=64"):
        check_heads([1, 3], 64)
    with pytest.raises(ValueError, match="positive"):
        check_heads([0], 64)


def test_result_json_round_trip():
    row = SweepRow(n_heads=2, head_dim=32, ppl_mean=10.0, ppl_std=0.5, ppl_seeds=[9.5, 10.5], params=10,
                   seconds_per_step=0.1)
    result = ExperimentResult("heads-sweep", "claim", True, {"heads": (2,)}, [row], {"x": math.nan}, ["note"], 1.5)
    data = json.loads(json.dumps(result.to_json()))
    assert data["results"][0]["ppl_mean"] == 10.0 and data["config"]["heads"] == [2] and data["details"]["x"] is None
    back = ExperimentResult.from_json(data)
    assert back.rows() == data["results"] and back.experiment == "heads-sweep"
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert mean_std([4.0]) == (4.0, 0.0)


def test_threads_are_restored():
    from headcount.experiments.train import available_cpus, cpu_threads
    before = torch.get_num_threads()
    with cpu_threads(1) as used:
        assert used == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    assert 1 <= available_cpus()


def test_available_cpus_counts_idle_cpu_time_not_this_process(monkeypatch):
    """The idle share of CPU time now (this process asleep while measured) decides; the load average only
    where /proc/stat cannot be read."""
    import os

    from headcount.experiments import train

    share = train._idle_share(0.05)
    assert share is None or 0.0 <= share <= 1.0
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(train, "_idle_share", lambda interval=0.25: 0.0)
    assert train.available_cpus() == 1  # never fewer than one
    monkeypatch.setattr(train, "_idle_share", lambda interval=0.25: 1.0)
    assert train.available_cpus() == cpus
    monkeypatch.setattr(train, "_idle_share", lambda interval=0.25: None)
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus - 1.0, 0.0, 0.0))
    assert train.available_cpus() == 1
