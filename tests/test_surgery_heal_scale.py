"""Healing at scale (issue 26): data-parallel healing under torch.distributed (DDP over a gloo group of 2
spawned ranks reaches the single process's weights with the same global batch), and bf16 healing on fp32
master weights (a bf16 heal follows the fp32 heal; without the masters its small updates round away).

Workers are module-level functions: headcount.distributed.spawn starts them in fresh processes."""

import numpy as np
import pytest
import torch

from headcount import distributed
from headcount.models.copying import attention_copy
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery import heal, prune


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pair():
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                        max_position=64, rope_theta=10000.0, norm_eps=1e-5)
    teacher = Decoder(cfg).eval()
    with torch.no_grad():
        for p in teacher.parameters():
            if p.dim() == 2:
                p.mul_(2)
    model = attention_copy(teacher)
    prune(model, {0: [1, 2], 1: [0]}, compensate="none")
    return model, teacher


def _windows(n=16, t=32):
    return torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(1))


def _heal(group=None, params="attention") -> dict:
    model, teacher = _pair()
    r = heal(model, teacher, steps=6, tokens=16 * 32, calibration=_windows(), window=32, batch_size=4,
             validation_windows=4, eval_every=2, params=params, lr=3e-3, held_out=False, progress=False, group=group)
    # numpy, not tensors: a tensor sent back from a spawned rank lives in shared memory that dies with it
    return {"weights": {k: v.detach().double().numpy() for k, v in model.state_dict().items()},
            "val": [v for _, v in r.val_losses], "train": r.train_losses, "world": r.world_size,
            "best": r.best_step, "steps": r.steps}


PARAMS = ("attention",)  # lora runs the same DDP path (peft adapters are the trainable parameters); its import
# alone costs seconds per spawned rank


def _rank(_) -> dict:
    out = {params: _heal("auto", params) for params in PARAMS}
    try:  # every rank sees the same refusal before any collective
        model, teacher = _pair()
        heal(model, teacher, steps=2, tokens=16 * 32, calibration=_windows(), window=32, batch_size=1,
             validation_windows=4, held_out=False, progress=False, group="auto")
    except ValueError as e:
        out["too_many"] = str(e)
    return out


def test_two_ranks_reach_the_single_process_weights():
    ranks = distributed.spawn(_rank, 2, None, timeout_s=120)  # one spawn for every case: start-up is the cost
    start = _pair()[0].state_dict()
    for params in PARAMS:
        one = _heal(None, params)
        assert one["world"] == 1 and all(r[params]["world"] == 2 for r in ranks)
        assert one["best"] == one["steps"] == 6  # the weights compared are the last step's: every step counted
        moved = 0.0
        for rank in ranks:
            r = rank[params]
            assert r["best"] == one["best"] and r["steps"] == one["steps"]
            assert np.allclose(r["train"], one["train"], rtol=1e-5) and np.allclose(r["val"], one["val"], rtol=1e-5)
            for k, w in one["weights"].items():
                assert np.allclose(r["weights"][k], w, rtol=1e-5, atol=1e-6), (params, k)
                moved = max(moved, float(np.abs(w - start[k].double().numpy()).max()))
        assert moved > 1e-3, params  # the heal did move the weights the ranks agree on
    assert all("torchrun: 2 ranks but a step of 1 windows" in r["too_many"] for r in ranks)
