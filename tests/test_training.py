"""The training toolkit (headcount.training) against independent truths: the schedule against its closed form
written out here, the time budget on a fake clock, back-off against the weights saved by hand, the optimizer
against torch's AdamW + clip + LambdaLR called directly, layer checkpointing against the same backward without."""

import math

import pytest
import torch

from headcount.training.best import BACK_OFF, HOLD, NEW_BEST, STOP, BestWeights
from headcount.training.budget import TimeBudget
from headcount.training.checkpointing import layer_checkpointing
from headcount.training.optimizer import Optimizer
from headcount.training.schedule import WarmupCosine, warmup_cosine


def closed_form(step, warm, total, floor, peak_in_warmup):
    """Linear ramp to the peak, then half a cosine period from the peak down to the floor, flat after `total`."""
    if step < warm:
        ramp = warm if peak_in_warmup else warm + 1
        return (step + 1) / ramp
    p = min(1.0, (step - warm) / max(1, total - warm))
    return floor + (1 - floor) * (1 + math.cos(math.pi * p)) / 2


@pytest.mark.parametrize("warm,total,floor,peak", [(0, 10, 0.0, False), (5, 100, 0.0, False), (10, 100, 0.1, True),
                                                    (3, 4, 0.0, False), (7, 7, 0.2, True)])
def test_schedule_values_are_the_closed_form(warm, total, floor, peak):
    values = [warmup_cosine(s, warm, total, floor=floor, peak_in_warmup=peak) for s in range(total + 3)]
    assert values == pytest.approx([closed_form(s, warm, total, floor, peak) for s in range(total + 3)], abs=1e-15)
    assert max(values) == pytest.approx(1.0) and values[-1] == pytest.approx(floor, abs=1e-15)
    if warm:  # the peak: at the warm-up's last step with peak_in_warmup, else first at `warm`
        assert values[warm - 1] == pytest.approx(1.0 if peak else warm / (warm + 1))
    assert values[warm] == pytest.approx(1.0)


def test_schedule_through_lambdalr_and_shortened():
    schedule = WarmupCosine(40, share=0.1)
    assert schedule.warm == 4
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    lrs = []
    for step in range(12):
        if step == 3:
            schedule.shorten(12)  # int(0.1 * 12) = 1 warm-up step from now on
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    # step 3's lr was set at the end of step 2, on the plan of 40 steps; the shorter plan from step 4 on
    assert lrs[:4] == pytest.approx([2.0 * (s + 1) / 5 for s in range(4)])
    assert lrs[4:] == pytest.approx([2.0 * closed_form(s, 1, 12, 0.0, False) for s in range(4, 12)])
    assert schedule(12) == 0.0
    with pytest.raises(ValueError, match="share"):
        WarmupCosine(10, share=1.5)
    with pytest.raises(ValueError, match="warm, share"):
        WarmupCosine(10)
    with pytest.raises(ValueError, match="total"):
        schedule.shorten(13)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("max_seconds,expected", [(10.0, 10), (1.0, 4), (None, 50), (1e6, 50)])
def test_the_time_budget_stops_a_loop(max_seconds, expected):
    clock = FakeClock()
    budget = TimeBudget(max_seconds, clock=clock)
    schedule = WarmupCosine(50, share=0.1)
    budget.start()
    step, factors = 0, []
    while step < schedule.total:
        budget.fit(step, schedule)
        factors.append(schedule(step))
        clock.now += 1.0  # each step takes one second
        if step == 1:
            with budget.paused():
                clock.now += 30.0  # a measurement: not the run's time
        step += 1
    assert step == expected and schedule.total == expected
    assert budget.elapsed() == pytest.approx(expected)
    assert schedule(expected) == 0.0 and factors[-1] > 0.0  # the re-sized cosine ends at the floor
    with pytest.raises(ValueError, match="max_seconds"):
        TimeBudget(0)


def test_back_off_restores_the_best_weights_and_halves_the_peak_lr():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3, 4))
    schedule = WarmupCosine(20, warm=2)
    opt = Optimizer([w], lr=0.1, schedule=schedule)
    best = BestWeights([w], patience=2)
    assert best.observe(0, 1.0) == NEW_BEST
    saved = w.detach().clone()
    for _ in range(3):
        (w ** 2).sum().backward()
        opt.step()
    assert not torch.equal(w, saved) and opt.adamw.state
    assert best.observe(3, 1.5) == BACK_OFF
    best.restore()
    peak = opt.back_off(0.5, 3)
    assert torch.equal(w, saved)
    assert peak == pytest.approx(0.05) and not opt.adamw.state
    assert opt.adamw.param_groups[0]["lr"] == pytest.approx(0.05 * closed_form(3, 2, 20, 0.0, False))
    assert best.observe(5, 0.5) == NEW_BEST and best.step == 5
    assert best.observe(6, 0.7) == BACK_OFF and best.observe(7, 0.6) == STOP
    assert BestWeights([w], patience=3).observe(0, math.nan, final=True) == HOLD


def test_the_optimizer_is_adamw_clip_and_schedule():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5)), None
    b = torch.nn.Parameter(a.detach().clone())
    data = torch.randn(6, 5)
    ours = Optimizer([a], lr=0.3, schedule=WarmupCosine(6, warm=2), weight_decay=0.01, clip=0.5)
    adamw = torch.optim.AdamW([b], lr=0.3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(adamw, lambda s: closed_form(s, 2, 6, 0.0, False))
    for x in data:
        (a * x).sum().pow(2).backward()
        ours.step()
        assert a.grad is None
        (b * x).sum().pow(2).backward()
        torch.nn.utils.clip_grad_norm_([b], 0.5)
        adamw.step()
        adamw.zero_grad()
        scheduler.step()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="lr"):
        Optimizer([a], lr=0.0)


def test_layer_checkpointing_gives_the_same_gradients():
    from conftest import tiny_byte_decoder

    model = tiny_byte_decoder()
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    runs = []

    def grads(checkpointed: bool):
        model.zero_grad(set_to_none=True)
        calls = []
        hooks = [layer.attn.register_forward_hook(lambda *a: calls.append(1)) for layer in model.layers]
        with layer_checkpointing(model.layers[1:], on=checkpointed):
            out = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()
        for h in hooks:
            h.remove()
        runs.append(len(calls))
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, recomputed = grads(False), grads(True)
    assert runs == [2, 3]  # the checkpointed layer's attention ran again in backward
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], rtol=1e-6, atol=1e-8, msg=name)
    assert not any("gradient_checkpointing" in vars(layer) for layer in model.layers)  # flags back to the default
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        with layer_checkpointing([torch.nn.Linear(2, 2)]):
            pass


def test_heal_and_uptrain_are_cut_to_a_budget_below_one_step():
    """max_seconds far below a step's time: after three timed steps both runs plan the least steps (4) and
    stop there, their schedules re-sized (the run still ends on its planned steps, not an interrupted one)."""
    from headcount.models.copying import attention_copy
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.surgery import heal, prune, uptrain

    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                        max_position=64)
    teacher = Decoder(cfg).eval()
    windows = torch.randint(0, 64, (24, 32), generator=torch.Generator().manual_seed(1))
    model = attention_copy(teacher)
    prune(model, {0: [1, 2]}, compensate="none")
    r = heal(model, teacher, steps=40, tokens=24 * 32, calibration=windows, window=32, batch_size=2,
             validation_windows=4, lr=1e-3, patience=40, held_out=False, progress=False, max_seconds=1e-9)
    assert (r.planned_steps, r.steps, len(r.train_losses)) == (4, 4, 4)
    u = uptrain(model, 40, lr=1e-3, calibration=windows, batch_size=2, window=32, progress=False, max_seconds=1e-9)
    assert (u.steps, len(u.losses)) == (4, 4)
