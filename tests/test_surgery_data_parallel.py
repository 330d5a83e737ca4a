"""prune over ranks: the calibration windows split over a gloo group, the float64 sums
all-reduced, give the single process's result — the same heads, the refit o_proj to relative 1e-6.

Workers are module-level functions: headcount.distributed.spawn starts them in fresh processes."""

import numpy as np
import pytest
import torch

from headcount import distributed
from headcount.models import Decoder, DecoderConfig
from headcount.surgery import prune_to


def _tiny() -> Decoder:
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=8, d_ff=64,
                        max_position=64, rope_theta=10000.0, norm_eps=1e-5)
    return Decoder(cfg).eval()


def _windows() -> torch.Tensor:
    return torch.randint(0, 64, (8, 32), generator=torch.Generator().manual_seed(1))


def _prune(order: str, group=None) -> dict:
    model = _tiny()
    result = prune_to(model, 0.34, order=order, calibration=_windows(), progress=False, group=group)
    # numpy, not tensors: a tensor sent back from a spawned rank lives in shared memory that dies with it
    return {"removed": result.removed,
            "o_proj": [layer.attn.o_proj.weight.detach().double().numpy() for layer in model.layers],
            "bias": [layer.attn.o_proj.bias.detach().double().numpy() for layer in model.layers
                     if layer.attn.o_proj.bias is not None]}


def _rank(order: str) -> dict:
    from headcount.surgery.pruning.removal import _shard

    out = _prune(order, group="auto")
    mine = _shard(_tiny(), [(_windows()[i:i + 4], None) for i in (0, 4)], "auto")
    out["rows"] = sorted(row.tolist() for ids, _ in mine for row in ids)
    return out


ORDERS = ("reconstruction", "gradient")


def _rank_all(_) -> dict:
    return {order: _rank(order) for order in ORDERS}


@pytest.fixture(scope="module")
def by_rank() -> list[dict]:
    """One start of 2 ranks runs every order (starting fresh processes costs more than these tiny prunes); each
    order's test compares its own results."""
    return distributed.spawn(_rank_all, 2, None, timeout_s=120)


@pytest.mark.parametrize("order", ORDERS)
def test_two_ranks_equal_one_process(order, by_rank):
    one = _prune(order)
    ranks = [r[order] for r in by_rank]
    # each rank saw half of the windows, the two halves disjoint (so equality comes from the all-reduce)
    assert all(len(r["rows"]) == 4 for r in ranks)
    assert not {tuple(x) for x in ranks[0]["rows"]} & {tuple(x) for x in ranks[1]["rows"]}
    for r in ranks:
        assert r["removed"] == one["removed"]  # the same heads chosen on every rank
        assert len(r["o_proj"] + r["bias"]) == len(one["o_proj"] + one["bias"])
        for a, b in zip(r["o_proj"] + r["bias"], one["o_proj"] + one["bias"]):
            assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b)


def _too_many(_):
    model = _tiny()
    prune_to(model, 0.34, order="gradient", calibration=_windows()[:1], progress=False, group="auto")


def test_more_ranks_than_windows_is_a_clear_error():
    outcomes = distributed.spawn(_too_many, 2, None, timeout_s=60, raise_errors=False)
    assert all(o.error_type == "ValueError" for o in outcomes), outcomes
    assert all("2 ranks but only 1" in o.error for o in outcomes)
