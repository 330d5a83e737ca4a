"""`prune` with its defaults over 2 ranks equals one process (the saved model's every tensor within 1e-5 relative
max): a tiny random decoder with a byte-level tokenizer, saved and loaded as `headcount prune --model DIR` loads it,
so the default calibration path ("mixed" text -> windows), the reconstruction order, protect="auto" and the lstsq
refit all run as the command runs them under torchrun. One variant carries a massive activation in layer 0, so the
protected layers are not empty and every rank must find the same ones.

Workers are module-level functions: headcount.distributed.spawn starts them in fresh processes."""

import numpy as np
import pytest
import torch
from conftest import tiny_byte_decoder

from headcount import distributed
from headcount.models import load
from headcount.surgery import prune_to, save

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: the single process on one thread, as each rank

# (compensate, a massive activation built into layer 0?)
CASES = (("lstsq", False), ("mean", False), ("lstsq", True))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("dp_prune") / "tiny"
    save(tiny_byte_decoder(max_position=128), path)
    return str(path)


def _prune_all(path: str, group=None) -> list[dict]:
    out = []
    for compensate, outlier in CASES:
        model = load(path)
        if outlier:  # one channel of layer 0's MLP output 20,000 times larger: the residual's outlier forms there
            with torch.no_grad():
                model.layers[0].mlp.down_proj.weight[5].mul_(2e4)
        result = prune_to(model, 0.25, compensate=compensate, calibration_windows=4, progress=False, group=group)
        # numpy, not tensors: a tensor sent back from a spawned rank lives in shared memory that dies with it
        out.append({"removed": result.removed, "protected": result.protected,
                    "weights": {k: v.detach().double().numpy().copy() for k, v in model.state_dict().items()}})
    return out


def _rank(path: str) -> list[dict]:
    return _prune_all(path, group="auto")


def test_two_ranks_equal_one_process_with_the_commands_defaults(saved):
    one = _prune_all(saved)
    ranks = distributed.spawn(_rank, 2, saved, timeout_s=120)
    assert one[2]["protected"] == [0] and one[0]["protected"] == []  # the outlier variant protects layer 0
    for case, truth in zip(CASES, one):
        assert truth["removed"], case
        for rank in ranks:
            got = rank[CASES.index(case)]
            assert got["removed"] == truth["removed"] and got["protected"] == truth["protected"], case
            assert got["weights"].keys() == truth["weights"].keys()
            for name, want in truth["weights"].items():
                diff = np.abs(got["weights"][name] - want).max() if want.size else 0.0
                assert diff <= 1e-5 * max(np.abs(want).max(), 1e-30), (case, name, diff)
