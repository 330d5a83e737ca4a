"""heal(): win back what an edit (pruning, K/V merging, L0 gates) cost, by distillation from the unedited model.

    heal(model, teacher, *, steps=None, tokens=None, calibration="mixed", params="attention", lr=None,
         progress=True, ...) -> HealResult

The loss is KL(teacher || student) of the next-token distributions (loss.distill_kl, chunked over positions)
on calibration windows only: `tokens` distinct calibration tokens are drawn through the one calibration path
(analysis.batches.calibration_batches); the last `validation_windows` windows are held aside as a validation
split, measured every `eval_every` steps: the weights with the lowest validation KL are the ones kept. A
measurement with no new best sends the run back to the best weights so far with its learning rate scaled by
BACKOFF (and the optimizer's moments reset): a model the edit barely hurt (qwen2.5-coder-0.5b at 20%, its
validation KL 0.069) is pushed off by the default lr (measured: no new best in 36 steps at 3e-4). The run
stops early after `patience` such measurements in a row. The held-out domains
(headcount.data.held_out_domains) are only measured, never chosen on.

The optimizer is uptraining's: AdamW, a linear warm-up then cosine decay to 0 (schedule()), gradients
clipped at norm 1. The teacher's final hidden states are computed once per window and cached (exact: the
teacher never changes), so a step costs the student's forward and backward plus the teacher's lm_head on
its rows; a run whose cache would pass CACHE_BYTES recomputes the teacher's forward instead.

Data-parallel (group="auto" under torchrun, or a process group): each step's windows are split over the ranks
(rows[rank::world] of the same global batch), the student is wrapped in torch's DistributedDataParallel (its
gradient all-reduce, nothing home-made) around a module computing the rank's share of the global mean KL,
so every rank takes the single process's step; the validation split is sharded and its sums all-reduced.

Low-precision weights (bf16; fp16 on a GPU): the weights that move get fp32 master copies (and fp32 AdamW
state) only for them: the gradient is cast to the master, the step taken in fp32, the model's weights copied
back from the masters, so small updates are not lost to bf16 rounding (memory.py gives the peak).

The defaults (DEFAULT_*) are the budget issue 26's targets are measured at: chosen on the validation split of
smollm2's edits (docs/healing.md has the table and the commands).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time

import torch

from headcount.surgery.healing.loss import distill_kl
from headcount.surgery.healing.result import HealResult
from headcount.surgery.healing.weights import Mover, check_teacher, check_trainable_dtype, edited_layers

DEFAULT_PARAMS = "attention"
DEFAULT_STEPS = 200
DEFAULT_TOKENS = 98_304  # 192 windows of 512 tokens: the budget is 100k calibration tokens
# attention: merge-kv's uptrain rate, chosen on validation windows for the same job (benchmarks/merge_defaults.py)
DEFAULT_LR = {"attention": 3e-4, "all": 1e-4, "lora": 1e-3}
# AdamW moves every weight by about its lr a step, whatever the weight's size: DEFAULT_LR is for attention weights
# of RMS >= REFERENCE_RMS (SmolLM2's are 0.194); a model whose attention weights are smaller gets the lr scaled by
# its RMS / REFERENCE_RMS, the same relative step (default_lr). Measured on qwen2.5-coder-0.5b 20% pruned (RMS
# 0.019): 3e-4, 1.5e-4 and 7.5e-5 each took the validation KL from 0.069 to 0.29 / 0.18 / 0.12 within 12 steps;
# 2.5e-5 took it from 0.085 to 0.069 in 24 steps (a shorter run's validation split).
REFERENCE_RMS = 0.19
# one window of 512 tokens a step, the length the held-out perplexity is measured on: with 2 windows of 256 the
# student never trained at positions 256-511. Same tokens a step; measured on smollm2 at the default budget (AMD
# EPYC, alone, docs/healing.md): 30% pruned +6.0/+3.1/+15.1 -> +4.0/+1.7/+14.9, 50% +16.8/+15.7/+48.5 ->
# +15.1/+15.0/+47.7 (prose / code / source)
WINDOW = 512
BATCH_SIZE = 1  # windows per step
VALIDATION_WINDOWS = 8
EVALUATIONS = 8  # validation measurements over a run (eval_every = steps // EVALUATIONS)
PATIENCE = 3
BACKOFF = 0.5  # the lr's factor after a validation measurement with no new best (back to the best weights)
WARMUP = 0.05
CACHE_BYTES = 1 << 30
EVAL_WINDOWS = 4  # held-out windows of 512 tokens per domain, as `headcount prune` measures


def schedule(step: int, warm: int, total: int) -> float:
    """The learning-rate factor at `step`: linear warm-up over `warm` steps, then cosine from 1 to 0 at `total`."""
    if step < warm:
        return (step + 1) / (warm + 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


@functools.lru_cache(maxsize=1)
def _domains() -> tuple:
    from headcount.data import held_out_domains
    return tuple(held_out_domains().items())  # built once per process: a heal measures three times


def held_out_figures(model, eval_windows: int = EVAL_WINDOWS, window: int = 512, extra: dict | None = None,
                     only_extra: bool = False) -> dict:
    """{domain: perplexity} on the three held-out domains (prose: the default corpus's held-out part, as
    `headcount prune` measures it; code; standard-library source), and on `extra` ({name: texts}: a user's
    held-out text, `headcount heal --text`); only_extra: those alone."""
    from headcount.surgery.held_out import evaluate, held_out_sets

    texts = {**({} if only_extra else {**dict(_domains()), "prose": None}), **(extra or {})}
    return evaluate(model, held_out_sets(model, texts, eval_windows, window))


def weight_rms(model) -> float:
    """The RMS of every layer's attention matrices (qkv_proj and o_proj weights) together."""
    total, count = 0.0, 0
    for layer in model.layers:
        for weight in (layer.attn.qkv_proj.weight, layer.attn.o_proj.weight):
            total += float(weight.detach().double().pow(2).sum())
            count += weight.numel()
    return math.sqrt(total / max(1, count))


def relative_lr(lr: float, model) -> float:
    """`lr` (a rate for attention weights of RMS >= REFERENCE_RMS) scaled down in proportion for a decoder `model`
    (the unedited one) whose attention weights' RMS is under REFERENCE_RMS: the same relative step. Every default
    lr that trains a model's weights goes through it (heal, merge-kv's uptrain, the joint gates' weights).
    An encoder's rate stays `lr`: its joint gates train on embedding fidelity, not the KL the rule was measured
    on, and minilm (RMS 0.07; joint, 200 steps, cosine at 50% / 75% removed) measured the scaled 1.1e-4 at
    0.931 / 0.872, 3e-4 at 0.935 / 0.891, 1e-3 at 0.929 / 0.883 (docs/healing.md)."""
    from headcount.analysis.batches import is_decoder

    return lr * min(1.0, weight_rms(model) / REFERENCE_RMS) if is_decoder(model) else lr


def default_lr(teacher, params: str = DEFAULT_PARAMS) -> float:
    """heal()'s lr when none is given: DEFAULT_LR[params], scaled down in proportion for a model (the unedited
    `teacher`) whose attention weights' RMS is under REFERENCE_RMS; see REFERENCE_RMS."""
    if params not in DEFAULT_LR:
        raise ValueError(f"params: expected one of {', '.join(DEFAULT_LR)}, got {params!r}")
    return relative_lr(DEFAULT_LR[params], teacher)


def _calibration_name(calibration) -> str:
    """What a heal distilled on, for its result and saved metadata."""
    if calibration is None:
        return "prose"  # the default corpus's calibration part alone
    if isinstance(calibration, str):
        from headcount.analysis.batches import STREAMS
        return calibration if calibration in STREAMS else "text"
    if isinstance(calibration, list) and all(isinstance(t, str) for t in calibration):
        return "text"
    return "windows"  # token windows or ready batches


def _check_int(name: str, value, minimum: int):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def _windows(model, calibration, n_windows: int, window: int) -> torch.Tensor:
    from headcount.analysis.batches import calibration_batches

    batches = calibration_batches(model, calibration, n_windows=n_windows, window=window, batch_size=n_windows)
    return torch.cat([b.ids for b in batches])[:n_windows]


class _Teacher:
    """The teacher's final hidden states per window [T - 1, d] (all but the last position), cached when they fit
    (budget 0: never cached, a forward every time)."""

    def __init__(self, teacher, windows: torch.Tensor, budget: int = CACHE_BYTES):
        self.teacher, self.windows = teacher, windows
        n, t = windows.shape
        per = (t - 1) * teacher.config.d_model * teacher.embed.weight.element_size()
        self.cache = {} if 0 < budget and n * per <= budget else None
        self.forwards = 0  # teacher tokens run

    @torch.no_grad()
    def hidden(self, rows: list[int]) -> torch.Tensor:
        if self.cache is not None and all(r in self.cache for r in rows):
            return torch.stack([self.cache[r] for r in rows])
        ids = self.windows[rows]
        h = self.teacher(ids, compute_logits=False).hidden_states[:, :-1]
        self.forwards += ids.numel()
        if self.cache is not None:
            for r, row in zip(rows, h):
                self.cache[r] = row
        return h


def _kl(model, teacher: _Teacher, rows: list[int], head_t, head_gates=None) -> tuple[torch.Tensor, int]:
    """(KL summed over the rows' positions, positions); head_gates: the student's (joint L0 gates)."""
    h_t = teacher.hidden(rows)
    h_s = model(teacher.windows[rows], compute_logits=False, head_gates=head_gates).hidden_states[:, :-1]
    return distill_kl(h_s, h_t, model.lm_head, head_t), h_t.shape[0] * h_t.shape[1]


class _Share(torch.nn.Module):
    """This rank's share of the global mean KL: KL summed over its rows x world / the global positions, so that
    DistributedDataParallel's gradient average is the gradient of the global mean. The student is a submodule
    (DDP syncs and all-reduces its trainable parameters); the teacher is not (never registered)."""

    def __init__(self, model, source: _Teacher, head_t):
        super().__init__()
        self.model = model
        self._side = (source, head_t)

    def forward(self, rows: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        source, head_t = self._side
        kl, _ = _kl(self.model, source, rows, head_t)
        return kl * scale, kl.detach()


class _Masters:
    """fp32 master copies of the trainable weights stored in a lower precision (bf16 / fp16), the optimizer's
    parameters in their place; fp32 weights are their own masters (no copy)."""

    def __init__(self, trainable: list):
        low = (torch.bfloat16, torch.float16)
        self.pairs = [(p, torch.nn.Parameter(p.detach().float().clone()) if p.dtype in low else p) for p in trainable]
        self.copied = [(p, m) for p, m in self.pairs if m is not p]

    def params(self) -> list:
        return [m for _, m in self.pairs]

    def grads_to_masters(self) -> None:
        for p, m in self.copied:
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        for p, m in self.copied:
            p.copy_(m)


@contextlib.contextmanager
def checkpointed(model, layers):
    """Each layer in `layers` recomputed in backward (torch.utils.checkpoint, non-reentrant): autograd keeps only
    its input, one layer's activations live at a time, at the price of one more forward of those layers."""
    from torch.utils.checkpoint import checkpoint

    patched = []
    for i in layers:
        layer = model.layers[i]

        def run(*args, _forward=layer.forward, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            return _forward(*args, **kwargs)

        layer.forward = run  # an instance attribute over the class's forward; removed below
        patched.append(layer)
    try:
        yield
    finally:
        for layer in patched:
            del layer.forward


def train_step(model, source: "_Teacher", rows: list[int], head_t, optimizer, trainable, *, ddp=None,
               dp=None, positions: int | None = None, masters: _Masters | None = None) -> float:
    """One optimizer step on the windows `rows`: the mean KL per position, backward, clip at 1, AdamW.
    Data-parallel: `rows` are this rank's share, `ddp` the DistributedDataParallel(_Share) wrapper, `dp` the
    DataParallel of the group and `positions` the global batch's positions; returns the global mean KL.
    masters: fp32 master weights (see _Masters): the step is taken on them, then copied into the model."""
    if ddp is None:
        kl, n = _kl(model, source, rows, head_t)
        loss, value = kl / n, None
    else:
        loss, kl = ddp(rows, dp.world / positions)
        value = dp.sum_float(float(kl)) / positions  # the same number on every rank (the NaN check agrees)
    loss.backward()
    if masters is not None:
        masters.grads_to_masters()
        trainable = masters.params()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # no gradients held through the next forward
    if masters is not None:
        masters.masters_to_model()
    return float(loss.detach()) if value is None else value


def heal(model, teacher, *, steps: int | None = None, tokens: int | None = None, calibration="mixed",
         params: str = DEFAULT_PARAMS, lr: float | None = None, progress: bool = True, window: int = WINDOW,
         batch_size: int | None = None, validation_windows: int = VALIDATION_WINDOWS, eval_every: int | None = None,
         patience: int = PATIENCE, held_out: bool = True, eval_windows: int = EVAL_WINDOWS,
         known: dict | None = None, max_seconds: float | None = None, seed: int = 0, log=None,
         checkpoints=(), group=None, checkpoint_layers: bool | None = None,
         held_out_texts: dict | None = None) -> HealResult:
    """Heal `model` (edited) in place by distillation from `teacher` (its unedited ancestor); see the module doc.

    steps: optimizer steps of `batch_size` windows (None = DEFAULT_STEPS; batch_size None = BATCH_SIZE, or one
    window per rank when more ranks run, so that the defaults work under torchrun); tokens: distinct calibration tokens
    drawn, training and validation windows together (None = DEFAULT_TOKENS; fewer are drawn when the steps
    need fewer). params: "attention" (the edited layers' q/k/v/o and norms), "all", or "lora". lr: the peak
    learning rate (None = default_lr(teacher, params): DEFAULT_LR[params], scaled down for small weights).
    held_out: measure the three held-out domains before the edit (the teacher), after it and after healing
    (`known` may hand in {"before_edit": ..., "after_edit": ...} already measured). max_seconds: after three timed steps the run is shortened to fit (schedule re-sized).
    checkpoints: steps after which the held-out domains are measured on the weights of that moment (one run,
    one schedule: `result.curve`, the quality against healing tokens; the measuring time is not counted in
    `seconds`). group: None (one process), "auto" (data-parallel over torch.distributed's default group when
    it is initialised, as under torchrun) or a process group; see the module doc. checkpoint_layers: recompute
    each layer's activations in backward (one more forward a step, far less memory: memory.py); None = on
    for bf16 / fp16 weights of heap.BOUND_FROM (1 GiB) or more (the 1.5B in bf16); fp32 heals (smollm2,
    qwen2.5-coder-0.5b by default) keep the faster path. held_out_texts: more held-out domains measured beside
    the three, {name: list of texts} (a user's text: `headcount heal --text` measures its held-out paragraphs).
    calibration: anything analysis.batches.calibration_batches takes ("mixed", "prose+source": half prose, half
    verbatim torch / numpy source, a list of texts, token windows).
    """
    from tqdm.auto import tqdm

    check_teacher(model, teacher)
    check_trainable_dtype(model)
    steps = DEFAULT_STEPS if steps is None else _check_int("steps", steps, 1)
    tokens = DEFAULT_TOKENS if tokens is None else _check_int("tokens", tokens, 1)
    _check_int("batch_size", batch_size, 1), _check_int("validation_windows", validation_windows, 1)  # None passes
    _check_int("patience", patience, 1), _check_int("window", window, 2)
    if params not in DEFAULT_LR:
        raise ValueError(f"params: expected one of {', '.join(DEFAULT_LR)}, got {params!r}")
    lr = default_lr(teacher, params) if lr is None else lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"lr: expected a positive learning rate, got {lr!r}")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds: expected a positive number of seconds or None, got {max_seconds!r}")
    checkpoints = sorted({_check_int("checkpoints", c, 0) for c in checkpoints})
    from headcount.distributed import DataParallel
    dp = DataParallel(group)
    batch_size = max(BATCH_SIZE, dp.world) if batch_size is None else batch_size
    if dp.world > batch_size:
        raise ValueError(f"torchrun: {dp.world} ranks but a step of {batch_size} windows (batch_size); use at most "
                         f"{batch_size} ranks")
    window = min(window, model.config.max_position)
    n_budget = tokens // window
    if n_budget < validation_windows + 1:
        raise ValueError(f"tokens: {tokens} tokens is {n_budget} windows of {window}; expected at least "
                         f"{validation_windows + 1} (validation_windows + one to train on)")
    n_train = min(n_budget - validation_windows, steps * batch_size)
    windows = _windows(model, calibration, n_train + validation_windows, window)
    if windows.shape[0] < 2:
        raise ValueError(f"calibration: {windows.shape[0]} window(s) of {window} tokens; expected at least 2")
    n_val = min(validation_windows, windows.shape[0] // 2)  # a short calibration text keeps half to train on
    n_train = windows.shape[0] - n_val
    if n_val < dp.world:
        raise ValueError(f"torchrun: {dp.world} ranks but {n_val} validation windows; use at most {n_val} ranks")
    main = dp.rank == 0
    progress = progress and main
    say = log or ((lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None))

    known = dict(known or {})
    figures = {}
    if held_out_texts is not None and (not isinstance(held_out_texts, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(t, str) for t in v)
            for k, v in held_out_texts.items())):
        raise ValueError("held_out_texts: expected {domain name: non-empty list of texts}, got "
                         f"{type(held_out_texts).__name__}")
    measure = functools.partial(held_out_figures, eval_windows=eval_windows, extra=held_out_texts)
    if held_out:
        for key, m in (("before_edit", teacher), ("after_edit", model)):
            if not known.get(key):
                figures[key] = measure(m)
            else:  # the edit command measured the three domains; a user's text is measured here
                extra = held_out_figures(m, eval_windows, extra=held_out_texts, only_extra=True) \
                    if held_out_texts else {}
                figures[key] = {**known[key], **extra}

    start = time.perf_counter()
    layers = edited_layers(model, teacher)
    if not layers:
        layers = list(range(len(model.layers)))  # nothing differs: heal every layer's attention
    if params == "all":
        layers = list(range(len(model.layers)))
    head_t = teacher.lm_head
    mover = Mover(model, teacher, params, layers)
    trainable = mover.trainable()
    masters = _Masters(trainable)
    masters = masters if masters.copied else None
    if checkpoint_layers is None:  # bf16 / fp16 weights of 1 GiB or more: a run that must save memory
        from headcount.heap import BOUND_FROM
        seen = {id(p): p for p in model.parameters()}
        checkpoint_layers = model.embed.weight.dtype in (torch.bfloat16, torch.float16) and \
            sum(p.numel() * p.element_size() for p in seen.values()) >= BOUND_FROM
    saving = checkpointed(model, range(min(layers), len(model.layers))) if checkpoint_layers else \
        contextlib.nullcontext()
    result = HealResult(0, steps, int(windows.numel()), 0, n_val * windows.shape[1], float(lr), params, layers,
                        mover.n_trainable(), teacher=getattr(teacher, "name", None),
                        lora_rank=mover.rank if params == "lora" else None,
                        calibration=_calibration_name(calibration), window=int(windows.shape[1]),
                        batch_size=batch_size)
    source = _Teacher(teacher, windows)
    val_rows = list(range(n_train, n_train + n_val))[dp.rank::dp.world]
    train_rows = list(range(n_train))
    eval_every = max(1, steps // EVALUATIONS) if eval_every is None else _check_int("eval_every", eval_every, 1)
    plan = {"steps": steps, "warm": int(WARMUP * steps)}
    optimizer = torch.optim.AdamW(masters.params() if masters else trainable, lr=lr, weight_decay=0.0)
    ddp = None
    if dp.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(_Share(model, source, head_t), process_group=dp.group)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s, plan["warm"], plan["steps"]))
    generator = torch.Generator().manual_seed(seed)
    validation_forwards = 0  # student tokens run to measure the validation KL

    def validate() -> float:
        nonlocal validation_forwards
        was = model.training
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(val_rows), batch_size):
                kl, n = _kl(model, source, val_rows[i:i + batch_size], head_t)
                total, count = total + float(kl), count + n
                validation_forwards += len(val_rows[i:i + batch_size]) * windows.shape[1]
        model.train(was)
        if dp.world > 1:
            total, count = dp.sum_many([torch.tensor([total, float(count)])])[0].tolist()
        return total / count

    measured = 0.0  # seconds spent measuring checkpoints (not healing)

    def checkpoint(step: int) -> None:
        nonlocal measured
        t0 = time.perf_counter()
        if step == 0 and "after_edit" in figures:
            figures_now = figures["after_edit"]  # already measured: the edit itself
        else:
            model.eval()
            figures_now = measure(model)
            model.train()
        measured += time.perf_counter() - t0
        result.curve.append({"steps": step, "tokens_seen": result.tokens_seen,
                             "seconds": round(time.perf_counter() - start - measured, 1),
                             "val_kl": result.val_losses[-1][1] if result.val_losses[-1][0] == step else None,
                             "held_out": figures_now})
        say(f"heal: step {step}: held-out {figures_now}")

    best = {"value": math.inf, "state": None, "step": 0}

    def remember(step: int, value: float) -> bool:
        result.val_losses.append((step, value))
        if value < best["value"]:
            best.update(value=value, step=step, state=[p.detach().clone() for p in trainable])
            return True
        return False

    def back_off(step: int) -> None:
        """Back to the best weights so far (and their fp32 masters), the lr scaled by BACKOFF, fresh moments."""
        with torch.no_grad():
            for p, saved in zip(trainable, best["state"]):
                p.copy_(saved)
            if masters is not None:
                for p, m in masters.copied:
                    m.copy_(p.float())
        optimizer.state.clear()
        scheduler.base_lrs = [b * BACKOFF for b in scheduler.base_lrs]
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * schedule(step, plan["warm"], plan["steps"])
        result.backoffs.append((step, scheduler.base_lrs[0]))

    model.train()
    order: list[int] = []
    since_best = 0
    bar = None
    saving.__enter__()
    try:
        remember(0, validate())
        bar = tqdm(total=steps, desc="heal", disable=None if progress else True, leave=False, file=sys.stderr)
        if 0 in checkpoints:
            checkpoint(0)
        bar.set_postfix(val=f"{best['value']:.4f}")
        step = 0
        while step < plan["steps"]:
            if max_seconds is not None and step == 3:
                per_step = (time.perf_counter() - start - measured) / 3
                per_step = dp.sum_float(per_step) / dp.world  # every rank plans the same number of steps
                fit = max(4, int(max_seconds / per_step))
                if fit < plan["steps"]:
                    plan["steps"], plan["warm"] = fit, min(plan["warm"], int(WARMUP * fit))
                    bar.total = fit
            if len(order) < batch_size:
                order = torch.randperm(n_train, generator=generator).tolist() + order
            rows = [train_rows[order.pop()] for _ in range(min(batch_size, n_train))]
            if ddp is None:
                value = train_step(model, source, rows, head_t, optimizer, trainable, masters=masters)
            else:
                if len(rows) < dp.world:
                    raise ValueError(f"torchrun: {dp.world} ranks but {len(rows)} training windows a step")
                value = train_step(model, source, rows[dp.rank::dp.world], head_t, optimizer, trainable, ddp=ddp,
                                   dp=dp, positions=len(rows) * (windows.shape[1] - 1), masters=masters)
            scheduler.step()
            step += 1
            if not math.isfinite(value):
                raise ValueError(f"lr: the distillation loss became {value} at step {step} (lr {lr}); try a smaller "
                                 "learning rate")
            result.train_losses.append(value)
            result.tokens_seen += len(rows) * windows.shape[1]
            bar.update(1)
            if step % eval_every == 0 or step == plan["steps"]:
                since_best = 0 if remember(step, validate()) else since_best + 1
                if 0 < since_best < patience and step < plan["steps"]:
                    back_off(step)
                bar.set_postfix(val=f"{result.val_losses[-1][1]:.4f}", best=f"{best['value']:.4f}")
            if step in checkpoints:
                checkpoint(step)
            if since_best >= patience:
                result.stopped_early = True
                break
        with torch.no_grad():  # keep the weights of the best validation step
            for p, saved in zip(trainable, best["state"]):
                p.copy_(saved)
    finally:
        saving.__exit__(None, None, None)
        if bar is not None:
            bar.close()
        model.eval()
        mover.finish()
    result.steps = len(result.train_losses)
    result.planned_steps = plan["steps"]
    result.best_step = best["step"]
    result.seconds = time.perf_counter() - start - measured
    # student: forward + backward (2 forwards) on each training token, a forward on validation tokens; teacher:
    # one forward per distinct token it ran (cached afterwards); over every rank
    run = dp.sum_float(validation_forwards + source.forwards) if dp.world > 1 else validation_forwards + source.forwards
    result.forward_equivalents = (3.0 * result.tokens_seen + run) / result.tokens
    result.world_size = dp.world
    result.checkpoint_layers = bool(checkpoint_layers)
    if held_out:
        figures["after_heal"] = measure(model)
        result.held_out = figures
    say(f"heal: {result.steps} steps ({params}, lr {lr:g}), {result.tokens:,} calibration tokens, validation KL "
        f"{result.val_first:.4f} -> {best['value']:.4f} (step {best['step']}) in {result.seconds:.0f} s")
    return result
