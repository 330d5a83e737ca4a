"""uptrain: a short fine-tune lowers the calibration loss; only the chosen parameters move; bad input."""

import copy

import pytest
import torch

from headcount.models import Decoder, DecoderConfig
from headcount.surgery import merge_kv, uptrain
from headcount.surgery.merging.stream import calibration_batches, calibration_loss
from headcount.surgery.merging.uptraining import PROBE_WINDOWS


def _tiny():
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                        max_position=64)
    return Decoder(cfg).eval()


def _windows():
    # a learnable stream: a fixed random sequence of 16 tokens repeated
    base = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(2))
    return base.repeat(8)[:8 * 16].view(8, 16)


def test_uptrain_lowers_calibration_loss_and_trains_only_attention():
    model = _tiny()
    merge_kv(model, 1, method="mean", progress=False)
    windows = _windows()
    batches = calibration_batches(model, windows)
    before = calibration_loss(model, batches)
    # the probe: the first PROBE_WINDOWS windows, the same before and after, measured independently here
    probe = calibration_batches(model, windows[:PROBE_WINDOWS])
    probe_before = calibration_loss(model, probe)
    frozen = {n: p.clone() for n, p in model.named_parameters() if ".attn." not in n}
    result = uptrain(model, 20, lr=5e-3, calibration=windows, batch_size=2, window=16, progress=False)
    after = calibration_loss(model, batches)
    assert after < before - 0.3
    assert result.loss_last < result.loss_first
    assert result.probe_before == pytest.approx(probe_before, rel=1e-5)
    assert result.probe_after == pytest.approx(calibration_loss(model, probe), rel=1e-5)
    assert len(result.losses) == 20 and result.tokens == 20 * 2 * 16
    assert result.probe_tokens == PROBE_WINDOWS * 16
    # a forward and a backward (two forwards) per token, and the probe's two forwards of its tokens
    assert result.token_forwards == 3 * result.tokens + 2 * result.probe_tokens
    assert result.trainable_params == sum(p.numel() for n, p in model.named_parameters() if ".attn." in n)
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
        assert p.requires_grad  # restored
    assert not model.training


def test_uptrain_with_a_teacher_moves_towards_it():
    teacher = _tiny()
    student = copy.deepcopy(teacher)
    merge_kv(student, 1, method="mean", progress=False)
    windows = _windows()
    ids = windows[:4]

    def kl():
        with torch.no_grad():
            p = torch.log_softmax(teacher(ids).logits, -1)
            q = torch.log_softmax(student(ids).logits, -1)
            return float(torch.nn.functional.kl_div(q, p, log_target=True, reduction="batchmean"))

    def kl_per_token():  # the probe's measure: KL(teacher || student) per predicted token of the first windows
        with torch.no_grad():
            x = windows[:PROBE_WINDOWS, :-1]
            p = torch.log_softmax(teacher(x).logits, -1).flatten(0, 1)
            q = torch.log_softmax(student(x).logits, -1).flatten(0, 1)
            return float((p.exp() * (p - q)).sum(-1).mean())

    before, probe_before = kl(), kl_per_token()
    result = uptrain(student, 12, lr=5e-3, calibration=windows, batch_size=2, window=16, teacher=teacher,
                     progress=False)
    assert result.objective == "kl_to_teacher"
    # and the teacher's forward; the probe runs both models on its tokens, twice
    assert result.token_forwards == 4 * 12 * 2 * 16 + 2 * 2 * result.probe_tokens
    assert kl() < 0.7 * before
    assert result.probe_before == pytest.approx(probe_before, rel=1e-4)
    assert result.probe_after == pytest.approx(kl_per_token(), rel=1e-4) and result.probe_after < result.probe_before


@pytest.mark.parametrize("kwargs,error,match", [
    ({"steps": 0}, ValueError, "steps"),
    ({"lr": -1.0}, ValueError, "lr"),
    ({"trainable": "mlp"}, ValueError, "trainable"),
    ({"trainable": [7]}, ValueError, "trainable"),
    ({"batch_size": 0}, ValueError, "batch_size"),
])
def test_uptrain_bad_input(kwargs, error, match):
    model = _tiny()
    args = {"steps": 2, "lr": 1e-3, "calibration": _windows(), "window": 16, "progress": False, **kwargs}
    steps = args.pop("steps")
    with pytest.raises(error, match=match):
        uptrain(model, steps, **args)
