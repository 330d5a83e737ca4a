"""Process groups for head-parallel models: start-up from torchrun's environment, the weight-hash check,
timeouts, and a small launcher (`spawn`) for tests and benchmarks.

Everything is torch.distributed: gloo on CPU, NCCL on CUDA. torchrun sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; `init()` reads them. No rank may hang: the group is created with a timeout
(every collective that waits longer raises), errors that every rank can see for itself (a plan that
does not fit) raise before any collective, and the weight check all-gathers one digest per rank, so
every rank sees the same disagreement and raises the same error.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0
TORCHRUN_HINT = ("start every rank with torchrun, e.g. `torchrun --nproc-per-node 2 -m headcount.parallel.check "
                 "--model smollm2`, and call headcount.distributed.init() (or "
                 "torch.distributed.init_process_group) before sharding")


class NotInitializedError(RuntimeError, ValueError):
    """torch.distributed has no process group."""


class WeightMismatchError(RuntimeError, ValueError):
    """The ranks hold different models."""


def env_world_size() -> int:
    """WORLD_SIZE from the environment (torchrun sets it); 1 when absent."""
    text = os.environ.get("WORLD_SIZE")
    if text is None:
        return 1
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"WORLD_SIZE: expected a positive int in the environment, got {text!r}") from None
    if value < 1:
        raise ValueError(f"WORLD_SIZE: expected a positive int in the environment, got {value}")
    return value


def default_backend(device: torch.device | str | None = None) -> str:
    """'nccl' when the model lives on CUDA (or CUDA is there and no device is given), else 'gloo'."""
    if device is not None:
        return "nccl" if torch.device(device).type == "cuda" else "gloo"
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init(backend: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Initialise the default process group from torchrun's environment (idempotent); return it.

    With no torchrun environment (WORLD_SIZE unset) there is nothing to join: NotInitializedError,
    whose message says how to start. On NCCL each rank takes cuda:LOCAL_RANK.
    """
    if dist.is_initialized():
        return dist.group.WORLD
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise NotInitializedError(f"torch.distributed is not initialised and {', '.join(missing)} "
                                  f"{'is' if len(missing) == 1 else 'are'} not set: {TORCHRUN_HINT}")
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    backend = backend or default_backend()
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'gloo' (CPU) or 'nccl' (CUDA), got {backend!r}")
    kwargs = {}
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return dist.group.WORLD


def init_or_single(backend: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S, log=None):
    """init() under torchrun; without it, a group of one process on 127.0.0.1 (fine: every head stays
    here), after saying so through `log` (a callable taking one line)."""
    if dist.is_initialized() or "WORLD_SIZE" in os.environ:
        return init(backend, timeout_s=timeout_s)
    if log is not None:
        log("a world size of 1 (no torchrun environment): one process holds every head, nothing is sharded; "
            "start N ranks with `torchrun --nproc-per-node N -m headcount ...`")
    dist.init_process_group(backend or default_backend(), init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.group.WORLD


def shutdown() -> None:
    """Destroy the default group if there is one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def resolve(group=None) -> tuple[Any, int, int]:
    """(group, rank within it, its size); raises NotInitializedError (saying how to start) without one."""
    if not dist.is_available():
        raise NotInitializedError("torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        raise NotInitializedError(f"torch.distributed is not initialised: {TORCHRUN_HINT}")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the given process group")
    return group, rank, dist.get_world_size(group)


def is_main(group=None) -> bool:
    """True on rank 0, and in a process with no process group at all (it prints)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    return dist.get_rank(group) == 0


# ---------------------------------------------------------------------------------- weight hash
def weight_hash(model: torch.nn.Module) -> str:
    """sha256 over every parameter and persistent buffer: name, dtype, shape and bytes (tied weights once)."""
    h = hashlib.sha256()
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        t = tensor.detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        t = t.to("cpu").contiguous()
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes, any dtype
    return h.hexdigest()


def check_same_weights(model: torch.nn.Module, group=None) -> str:
    """All-gather each rank's weight hash; raise WeightMismatchError on EVERY rank when they differ."""
    group, rank, world = resolve(group)
    digest = weight_hash(model)
    if world == 1:
        return digest
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    digests = [bytes(t.cpu().tolist()).hex() for t in gathered]
    if len(set(digests)) > 1:
        listed = ", ".join(f"rank {r}: {d[:12]}" for r, d in enumerate(digests))
        raise WeightMismatchError(f"the ranks hold different models (weight sha256 {listed}); every rank must "
                                  "load the same checkpoint, unchanged, before sharding")
    return digest


# ------------------------------------------------------------------------------------- launcher
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankOutcome:
    rank: int
    value: Any = None
    error_type: str | None = None  # the exception's class name when the rank raised
    error: str | None = None  # its message

    @property
    def ok(self) -> bool:
        return self.error_type is None


class RanksFailed(RuntimeError):
    """Some ranks raised (or never answered); `outcomes` has one RankOutcome per rank."""

    def __init__(self, outcomes: list[RankOutcome]):
        self.outcomes = outcomes
        lines = [f"rank {o.rank}: {o.error_type}: {o.error}" for o in outcomes if not o.ok]
        super().__init__("; ".join(lines))


def _child(rank: int, world_size: int, port: int, threads: int, timeout_s: float, fn, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(threads)
    try:
        init("gloo", timeout_s=timeout_s)
        value = fn(*args)
        queue.put((rank, value, None, None))
    except BaseException as err:  # report every failure to the parent, then leave
        queue.put((rank, None, type(err).__name__, " ".join(str(err).split()) or traceback.format_exc()))
    finally:
        try:
            shutdown()
        except Exception:
            pass


def spawn(fn: Callable, world_size: int, *args, threads: int = 1, timeout_s: float = 60.0,
          raise_errors: bool = True) -> list:
    """Run fn(*args) on `world_size` fresh processes joined in a gloo group on 127.0.0.1 (a free port),
    each with `threads` torch threads and collectives that time out after timeout_s.

    Returns each rank's return value (picklable) in rank order. When a rank raises, RanksFailed (with
    every rank's outcome) unless raise_errors=False, which returns the RankOutcome list instead.
    A rank that neither answers nor exits within 2 x timeout_s is killed and reported as "Timeout".
    fn must be importable by name (a module-level function).
    """
    import queue as queue_mod
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, threads, timeout_s, fn, args, q), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    outcomes: dict[int, RankOutcome] = {}
    deadline = time.monotonic() + 2 * timeout_s + 30  # start-up (importing torch) counts too
    while len(outcomes) < world_size and time.monotonic() < deadline:
        try:
            rank, value, etype, msg = q.get(timeout=0.5)
            outcomes[rank] = RankOutcome(rank, value, etype, msg)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    result = []
    for r, p in enumerate(procs):
        if r in outcomes:
            result.append(outcomes[r])
        elif p.exitcode is not None and p.exitcode >= 0:
            result.append(RankOutcome(r, None, "Exited", f"exited with code {p.exitcode} without answering"))
        else:
            result.append(RankOutcome(r, None, "Timeout", f"no answer within {2 * timeout_s + 30:.0f} s (killed)"))
    if raise_errors and not all(o.ok for o in result):
        raise RanksFailed(result)
    return [o.value for o in result] if raise_errors else result


# ------------------------------------------------------------------------- data-parallel statistics
class DataParallel:
    """The process group a statistic is split over (or none): which calibration items this rank takes, and
    float64 all-reduced sums, so every rank ends with the single-process result (to summation order).

    group: None (one process), "auto" (the default group when torch.distributed is initialised, else one
    process) or a process group."""

    def __init__(self, group=None):
        self.group, self.rank, self.world = None, 0, 1
        if group is None:
            return
        if isinstance(group, str):
            if group != "auto":
                raise ValueError(f"group: expected None, 'auto' or a torch.distributed process group, got {group!r}")
            if not (dist.is_available() and dist.is_initialized()):
                return
            group = dist.group.WORLD
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def shard(self, items, what: str = "calibration windows"):
        """This rank's items: items[rank::world]; a clear error when there are fewer items than ranks."""
        if self.world > 1 and len(items) < self.world:
            raise ValueError(f"torchrun: {self.world} ranks but only {len(items)} {what}; use at most "
                             f"{len(items)} ranks or more calibration (--calibration-windows)")
        return items[self.rank::self.world]

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of `t` over the ranks, accumulated in float64 (returned in float64)."""
        t = t.double()
        if self.world == 1:
            return t
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t

    def sum_many(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each tensor summed over the ranks in ONE all-reduce (flattened, float64; complex tensors as their
        real and imaginary parts): float64 (complex128) tensors of the same shapes, in the same order."""
        if self.world == 1:
            return [t.to(torch.complex128 if t.is_complex() else torch.float64) for t in tensors]
        flat = [(torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.double()).reshape(-1).cpu()
                for t in tensors]
        buf = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64)
        if dist.get_backend(self.group) == "nccl":
            buf = buf.cuda()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        buf = buf.cpu()
        out, start = [], 0
        for t, f in zip(tensors, flat):
            part = buf[start:start + f.numel()].clone()  # its own storage (view_as_complex needs an even offset)
            start += f.numel()
            if t.is_complex():
                part = torch.view_as_complex(part.view(*t.shape, 2))
            out.append(part.reshape(t.shape).to(t.device))
        return out

    def sum_float(self, value: float) -> float:
        """A Python number summed over the ranks (float64)."""
        return float(self.sum_many([torch.tensor([float(value)], dtype=torch.float64)])[0][0])
