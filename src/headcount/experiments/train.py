"""The one training loop every experiment uses: headcount.training's AdamW + clip and its warm-up + cosine schedule
(to 10% of the peak, the warm-up ending at the peak), a tqdm bar.

    train(model, next_batch, loss_of, steps=..., lr=...) -> TrainLog(losses, seconds)

`next_batch(step)` returns whatever `loss_of(model, batch)` takes; `loss_of` returns a scalar loss.
The bar (stderr) shows the running loss (an exponential moving average over ~20 steps).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from headcount.arguments import positive_int
from headcount.training.optimizer import Optimizer
from headcount.training.schedule import WarmupCosine

Tensor = torch.Tensor


@dataclass
class TrainLog:
    """What a training run leaves behind: the loss of every step and the wall time."""

    losses: list[float]
    seconds: float

    @property
    def final_loss(self) -> float:
        """Mean loss over the last tenth of the steps (at least one step)."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(1, len(self.losses))


def resolve_config(name: str, quick: bool, defaults_quick: dict, defaults_full: dict, options: dict, *,
                   steps=None, seeds=None, seeds_key: str = "seeds") -> dict:
    """An experiment's settings: its quick or full defaults, overridden by known `options`, --steps
    and --seeds (stored under `seeds_key`); an unknown option is a ValueError naming the experiment."""
    cfg = dict(defaults_quick if quick else defaults_full)
    unknown = set(options) - set(cfg)
    if unknown:
        raise ValueError(f"{name}: unknown option(s) {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update(options)
    if steps is not None:
        cfg["steps"] = check_steps(steps)
    if seeds is not None:
        cfg[seeds_key] = seeds
    return cfg


def check_steps(steps) -> int:
    """A positive number of training steps; else a ValueError naming steps (a TypeError for a value that is not an
    int, with its type)."""
    return positive_int("steps", steps, expected="a positive whole number of training steps", type_error=TypeError)


def schedule(steps: int, warmup: int) -> WarmupCosine:
    """The experiments' schedule: linear warm-up over `warmup` steps (clamped to [1, steps]) reaching the peak at its
    last step, then cosine decay to 10% of the peak learning rate."""
    return WarmupCosine(steps, warm=max(1, min(warmup, steps)), floor=0.1, peak_in_warmup=True)


def warmup_cosine(optimizer: torch.optim.Optimizer, steps: int, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """schedule(steps, warmup) as torch's LambdaLR over `optimizer`."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(steps, warmup))


def train(model: nn.Module, next_batch: Callable[[int], object], loss_of: Callable[[nn.Module, object], Tensor], *,
          steps: int, lr: float = 3e-3, weight_decay: float = 0.0, warmup: int | None = None,
          clip: float | None = 1.0, desc: str = "train", progress: bool = True) -> TrainLog:
    """Train `model` in place for `steps` steps; only parameters with requires_grad are optimised."""
    check_steps(steps)
    optimizer = Optimizer([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay,
                          schedule=schedule(steps, steps // 20 if warmup is None else warmup), clip=clip)
    losses: list[float] = []
    running = None
    model.train()
    start = time.perf_counter()
    bar = _bar(steps, desc, progress)
    try:
        for step in range(steps):
            loss = loss_of(model, next_batch(step))
            loss.backward()
            optimizer.step()
            value = loss.item()
            if not math.isfinite(value):
                raise FloatingPointError(f"{desc}: the loss became {value} at step {step}")
            losses.append(value)
            running = value if running is None else 0.95 * running + 0.05 * value
            if bar is not None:
                bar.update(1)
                if step % 10 == 0 or step == steps - 1:
                    bar.set_postfix(loss=f"{running:.4f}", refresh=False)
    finally:
        if bar is not None:
            bar.close()
    model.eval()
    return TrainLog(losses, time.perf_counter() - start)


def _bar(steps: int, desc: str, progress: bool):
    if not progress:
        return None
    from tqdm import tqdm
    return tqdm(total=steps, desc=desc, leave=False, mininterval=0.5, dynamic_ncols=True)


def _idle_share(interval: float = 0.25) -> float | None:
    """The share of all CPUs' time spent idle over the next `interval` seconds (/proc/stat), or None. This
    process sleeps while it is measured, so its own earlier work does not count against it (the 1-minute
    load average would count it: a report that has just loaded its model saw 1 busy CPU of 2 that was its own)."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)

    try:
        idle0, total0 = sample()
        time.sleep(interval)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / (total1 - total0) if total1 > total0 else None


def available_cpus() -> int:
    """CPUs this process may use that other processes are not already keeping busy: the CPUs in its
    affinity mask times the share of CPU time that is idle right now (/proc/stat over 0.25 s; where that
    cannot be read, minus the 1-minute load average), at least 1. On a shared machine a second torch
    thread that has no idle core spends its time spin-waiting: measured here at load average 15-24,
    a small decoder's step took 5-10x longer with 2 threads than with 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    idle = _idle_share()
    if idle is not None:
        return max(1, min(cpus, int(cpus * idle + 0.5)))
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    return max(1, min(cpus, int(cpus - busy + 0.5)))


@contextlib.contextmanager
def cpu_threads(n: int = 2, *, exact: bool = False) -> Iterator[int]:
    """Run with min(n, available_cpus()) torch threads (exactly n with exact=True), restoring the
    previous setting afterwards."""
    before = torch.get_num_threads()
    threads = max(1, n if exact else min(n, available_cpus()))
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def seeded(seed: int) -> torch.Generator:
    """Seed torch's global generator (initialisation) and return a separate one for the data."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(10_000 + seed)
