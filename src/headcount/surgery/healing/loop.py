"""heal(): win back what an edit (pruning, K/V merging, L0 gates) cost, by distillation from the unedited model.

    heal(model, teacher, HealConfig(steps=200, tokens=98_304, params="attention", lr=None, ...),
         calibration="mixed", progress=True, ...) -> HealResult
    heal(model, teacher, steps=200, ...)          the keyword form: the same HealConfig built from the keywords

The loss is KL(teacher || student) of the next-token distributions (loss.distill_kl, chunked over positions)
on calibration windows only: `tokens` distinct calibration tokens are drawn through the one calibration path
(analysis.batches.calibration_batches); the last `validation_windows` windows are held aside as a validation
split, measured every `eval_every` steps: the weights with the lowest validation KL are the ones kept. A
measurement with no new best sends the run back to the best weights so far with its learning rate scaled by
BACKOFF (and the optimizer's moments reset): a model the edit barely hurt starts near its best, and a step
too large only pushes it off (docs/healing.md has the run that showed it). The run stops early after `patience`
such measurements in a row (headcount.training's BestWeights). The held-out domains
(headcount.data.held_out_domains) are only measured, never chosen on.

The optimizer, schedule, time budget and layer checkpointing are headcount.training's: AdamW, a linear warm-up
then cosine decay to 0, gradients clipped at norm 1; max_seconds re-sizes the schedule after three timed steps.
A step (step.py: train_step) runs on the teacher's final hidden states, cached per window.

heal() is a short function over _Healing, one run as a recipe: setup, step, validate, back_off, checkpoint
(held-out figures on the weights of a moment), finish.

Data-parallel (group="auto" under torchrun, or a process group): each step's windows are split over the ranks
(rows[rank::world] of the same global batch), the student is wrapped in torch's DistributedDataParallel (its
gradient all-reduce, nothing home-made) around a module computing the rank's share of the global mean KL
(step.Share), so every rank takes the single process's step; the validation split is sharded and its sums
all-reduced.

Low-precision weights (bf16; fp16 on a GPU): the weights that move get fp32 master copies (and fp32 AdamW
state) only for them (step.Masters): the gradient is cast to the master, the step taken in fp32, the model's
weights copied back from the masters, so small updates are not lost to bf16 rounding (memory.py gives the peak).

The defaults (DEFAULT_*) are the budget healing's targets (docs/healing.md) are measured at: chosen on the
validation split of smollm2's edits (docs/healing.md has the table and the commands).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys

import torch

from headcount.arguments import one_of
from headcount.surgery.healing.masked import MaskedWindows
from headcount.surgery.healing.result import HealResult
from headcount.surgery.healing.step import Masters as _Masters
from headcount.surgery.healing.step import Share, distilled, train_step
from headcount.surgery.healing.step import Teacher as _Teacher
from headcount.surgery.healing.weights import Mover, check_teacher, check_trainable_dtype, edited_layers
from headcount.training.best import BACK_OFF, STOP, BestWeights
from headcount.training.budget import TimeBudget
from headcount.training.checkpointing import layer_checkpointing
from headcount.training.optimizer import Optimizer
from headcount.training.schedule import WarmupCosine

# the settings' defaults live with HealConfig (no torch there: the command's --help reads them); re-exported here
from headcount.surgery.healing.config import (BACKOFF, BATCH_SIZE, DEFAULT_LR, DEFAULT_PARAMS,  # noqa: E402,F401
                                              DEFAULT_STEPS, DEFAULT_TOKENS, EVAL_WINDOWS, EVALUATIONS, PATIENCE,
                                              REFERENCE_RMS, VALIDATION_WINDOWS, WARMUP, WINDOW, HealConfig,
                                              check_budget)


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
    """The RMS of every layer's attention matrices (qkv_proj and o_proj weights) together; a layer whose attention
    was dropped (drop-attention) has none and adds nothing."""
    from headcount.models.dropped import is_dropped

    total, count = 0.0, 0
    for layer in model.layers:
        if is_dropped(layer.attn):
            continue
        for weight in (layer.attn.qkv_proj.weight, layer.attn.o_proj.weight):
            total += float(weight.detach().double().pow(2).sum())
            count += weight.numel()
    return math.sqrt(total / max(1, count))


def relative_lr(lr: float, model) -> float:
    """`lr` (a rate for attention weights of RMS >= REFERENCE_RMS) scaled down in proportion for a decoder `model`
    (the unedited one) whose attention weights' RMS is under REFERENCE_RMS: the same relative step. Every default
    lr that trains a model's weights goes through it (heal, merge-kv's uptrain, the joint gates' weights).
    An encoder's rate stays `lr`: its joint gates train on embedding fidelity, not the KL the rule was measured
    on, and minilm's joint gates do no better at the scaled rate (docs/healing.md has the lr sweep)."""
    from headcount.analysis.batches import is_decoder

    return lr * min(1.0, weight_rms(model) / REFERENCE_RMS) if is_decoder(model) else lr


def default_lr(teacher, params: str = DEFAULT_PARAMS) -> float:
    """heal()'s lr when none is given: DEFAULT_LR[params], scaled down in proportion for a model (the unedited
    `teacher`) whose attention weights' RMS is under REFERENCE_RMS; see REFERENCE_RMS."""
    one_of("params", params, DEFAULT_LR)
    return relative_lr(DEFAULT_LR[params], teacher)


def windows_drawn(steps: int | None = None, tokens: int | None = None, *, window: int = WINDOW,
                  batch_size: int | None = None, world: int = 1, validation_windows: int = VALIDATION_WINDOWS) -> int:
    """How many calibration windows a heal draws: the steps' windows and the validation ones, within the
    `tokens` budget (None: the defaults; batch_size None: heal's, one window per rank of `world`). A budget of
    fewer than validation_windows + 1 windows: ValueError."""
    steps = DEFAULT_STEPS if steps is None else steps
    batch_size = _batch_size(batch_size, world)
    tokens = DEFAULT_TOKENS if tokens is None else tokens
    n_budget = check_budget(tokens, window, validation_windows)
    return min(n_budget - validation_windows, steps * batch_size) + validation_windows


def _batch_size(batch_size: int | None, world: int) -> int:
    """Windows a step: BATCH_SIZE, or one per rank when more ranks run, unless given."""
    return max(BATCH_SIZE, world) if batch_size is None else batch_size


def _calibration_name(calibration) -> str:
    """What a heal distilled on, for its result and saved metadata."""
    if calibration is None:
        return "prose"  # the default corpus's calibration part alone
    if isinstance(calibration, str):
        from headcount.analysis.batches import STREAMS
        return calibration if calibration in STREAMS else "text"
    if isinstance(calibration, list) and all(isinstance(t, str) for t in calibration):
        return "text"
    if isinstance(calibration, MaskedWindows):
        return calibration.name
    return "windows"  # token windows or ready batches


def _windows(model, calibration, n_windows: int, window: int) -> torch.Tensor:
    """The first n_windows token windows [N, T] (a MaskedWindows' own, of its width; its mask is _mask's)."""
    from headcount.analysis.batches import calibration_batches

    if isinstance(calibration, MaskedWindows):
        return calibration.ids.to(model.embed.weight.device)[:n_windows]
    batches = calibration_batches(model, calibration, n_windows=n_windows, window=window, batch_size=n_windows)
    return torch.cat([b.ids for b in batches])[:n_windows]


def _mask(calibration, windows: torch.Tensor) -> torch.Tensor | None:
    """The loss mask [N, T] bool of the windows drawn (True where the token is a target), None: every token."""
    return calibration.mask[:windows.shape[0]].to(windows.device) if isinstance(calibration, MaskedWindows) else None


class _Healing:
    """One heal as a recipe: __init__ checks the settings and draws the windows; setup() builds what trains (the
    weights that move, their fp32 masters, optimizer and schedule, data parallelism); running() is the block the
    steps run in; step() one optimizer step, then the validation when one is due (validate(), which may
    back_off()); checkpoint() the held-out figures of the moment; finish() the result's totals."""

    def __init__(self, model, teacher, config: HealConfig, *, calibration, progress, log, group):
        check_teacher(model, teacher)
        check_trainable_dtype(model)
        self.config, self.model, self.teacher, self.calibration = config, model, teacher, calibration
        self.params, self.seed, self.patience = config.params, config.seed, config.patience
        self.steps = steps = config.steps
        self.lr = default_lr(teacher, config.params) if config.lr is None else config.lr
        self.budget = TimeBudget(config.max_seconds)
        self.checkpoints = list(config.checkpoints)
        self.eval_every = max(1, steps // EVALUATIONS) if config.eval_every is None else config.eval_every
        from headcount.distributed import DataParallel
        self.dp = dp = DataParallel(group)
        self.batch_size = batch_size = _batch_size(config.batch_size, dp.world)
        if dp.world > batch_size:
            raise ValueError(f"torchrun: {dp.world} ranks but a step of {batch_size} windows (batch_size); use at "
                             f"most {batch_size} ranks")
        window = min(config.window, model.config.max_position)
        validation_windows = config.validation_windows
        n_drawn = windows_drawn(steps, config.tokens, window=window, batch_size=batch_size,
                                validation_windows=validation_windows)
        self.windows = windows = _windows(model, calibration, n_drawn, window)
        self.mask = _mask(calibration, windows)
        if windows.shape[0] < 2:
            raise ValueError(f"calibration: {windows.shape[0]} window(s) of {window} tokens; expected at least 2")
        self.n_val = n_val = min(validation_windows, windows.shape[0] // 2)  # a short text keeps half to train on
        self.n_train = windows.shape[0] - n_val
        if n_val < dp.world:
            raise ValueError(f"torchrun: {dp.world} ranks but {n_val} validation windows; use at most {n_val} ranks")
        self.progress = progress and dp.rank == 0
        self.say = log or ((lambda m: print(m, file=sys.stderr, flush=True)) if self.progress else (lambda m: None))

    def setup(self, checkpoint_layers: bool | None) -> HealResult:
        """What trains: the weights that move (Mover), their fp32 masters, AdamW + clip + warm-up/cosine, the
        teacher's hidden-state cache, DistributedDataParallel over more ranks; the clock starts."""
        model, teacher, dp, windows = self.model, self.teacher, self.dp, self.windows
        self.budget.start()
        layers = edited_layers(model, teacher)
        if not layers or self.params == "all":
            layers = list(range(len(model.layers)))  # nothing differs: heal every layer's attention
        self.head_t = teacher.lm_head
        self.mover = Mover(model, teacher, self.params, layers)
        self.trainable = self.mover.trainable()
        masters = _Masters(self.trainable)
        self.masters = masters if masters.copied else None
        if checkpoint_layers is None:  # bf16 / fp16 weights of 1 GiB or more: a run that must save memory
            from headcount.heap import BOUND_FROM
            seen = {id(p): p for p in model.parameters()}
            checkpoint_layers = model.embed.weight.dtype in (torch.bfloat16, torch.float16) and \
                sum(p.numel() * p.element_size() for p in seen.values()) >= BOUND_FROM
        self.checkpoint_layers = bool(checkpoint_layers)
        self.recomputed = list(model.layers[min(layers):]) if checkpoint_layers else []
        self.result = HealResult(0, self.steps, int(windows.numel()), 0, self.n_val * windows.shape[1],
                                 float(self.lr), self.params, layers, self.mover.n_trainable(),
                                 teacher=getattr(teacher, "name", None),
                                 lora_rank=self.mover.rank if self.params == "lora" else None,
                                 calibration=_calibration_name(self.calibration), window=int(windows.shape[1]),
                                 batch_size=self.batch_size)
        self.source = _Teacher(teacher, windows, mask=self.mask)
        self.val_rows = list(range(self.n_train, self.n_train + self.n_val))[dp.rank::dp.world]
        self.schedule = WarmupCosine(self.steps, share=WARMUP)
        self.opt = Optimizer(self.masters.params() if self.masters else self.trainable, lr=self.lr,
                             schedule=self.schedule)
        self.ddp = None
        if dp.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(Share(model, self.source, self.head_t), process_group=dp.group)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.best = BestWeights(self.trainable, patience=self.patience)
        self.order: list[int] = []
        self.done = 0  # optimizer steps taken
        self.validation_forwards = 0  # student tokens run to measure the validation KL
        self.bar = None
        return self.result

    @contextlib.contextmanager
    def running(self):
        """Train mode, the layers from the first edited one recomputed in backward (checkpoint_layers), a progress
        bar; after the block, whatever happened: eval mode, every requires_grad flag back, LoRA merged."""
        from tqdm.auto import tqdm

        self.model.train()
        try:
            with layer_checkpointing(self.recomputed):
                self.bar = tqdm(total=self.steps, desc="heal", disable=None if self.progress else True, leave=False,
                                file=sys.stderr)
                yield
        finally:
            if self.bar is not None:
                self.bar.close()
            self.model.eval()
            self.mover.finish()

    def step(self) -> str | None:
        """One optimizer step (before the fourth, the time budget may cut the plan), then the validation when one
        is due: returns its decision (headcount.training.best), else None."""
        dp, batch_size, t = self.dp, self.batch_size, self.windows.shape[1]
        if self.budget.fit(self.done, self.schedule, agree=lambda s: dp.sum_float(s) / dp.world):  # ranks agree
            self.bar.total = self.schedule.total
        if len(self.order) < batch_size:
            self.order = torch.randperm(self.n_train, generator=self.generator).tolist() + self.order
        rows = [self.order.pop() for _ in range(min(batch_size, self.n_train))]
        if self.ddp is None:
            value = train_step(self.model, self.source, rows, self.head_t, self.opt.adamw, self.trainable,
                               masters=self.masters)
        else:
            if len(rows) < dp.world:
                raise ValueError(f"torchrun: {dp.world} ranks but {len(rows)} training windows a step")
            value = train_step(self.model, self.source, rows[dp.rank::dp.world], self.head_t, self.opt.adamw,
                               self.trainable, ddp=self.ddp, dp=dp, positions=self.source.positions(rows),
                               masters=self.masters)
        self.opt.advance()
        self.done += 1
        if not math.isfinite(value):
            raise ValueError(f"lr: the distillation loss became {value} at step {self.done} (lr {self.lr}); try a "
                             "smaller learning rate")
        self.result.train_losses.append(value)
        self.result.tokens_seen += len(rows) * t
        self.bar.update(1)
        if self.done % self.eval_every == 0 or self.done == self.schedule.total:
            return self.validate()
        return None

    def validate(self) -> str:
        """The validation KL recorded and judged by the best-weights policy; a back-off is taken here."""
        value = self.validation_kl()
        self.result.val_losses.append((self.done, value))
        decision = self.best.observe(self.done, value, final=self.done >= self.schedule.total)
        if decision == BACK_OFF:
            self.back_off()
        self.bar.set_postfix(val=f"{value:.4f}", best=f"{self.best.value:.4f}")
        return decision

    def validation_kl(self) -> float:
        """The mean KL per position on the validation split (every rank's share summed)."""
        model, was = self.model, self.model.training
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(self.val_rows), self.batch_size):
                rows = self.val_rows[i:i + self.batch_size]
                kl, n = distilled(model, self.source, rows, self.head_t)
                total, count = total + float(kl), count + n
                self.validation_forwards += len(rows) * self.windows.shape[1]
        model.train(was)
        if self.dp.world > 1:
            total, count = self.dp.sum_many([torch.tensor([total, float(count)])])[0].tolist()
        return total / count

    def back_off(self) -> None:
        """Back to the best weights so far (and their fp32 masters), the lr scaled by BACKOFF, fresh moments."""
        self.best.restore()
        if self.masters is not None:
            self.masters.model_to_masters()
        self.result.backoffs.append((self.done, self.opt.back_off(BACKOFF, self.done)))

    def checkpoint(self, step: int, measure, figures: dict) -> None:
        """The held-out domains measured on the weights of this moment (result.curve; not counted as healing)."""
        model, result = self.model, self.result
        with self.budget.paused():
            if step == 0 and "after_edit" in figures:
                figures_now = figures["after_edit"]  # already measured: the edit itself
            else:
                model.eval()
                figures_now = measure(model)
                model.train()
        result.curve.append({"steps": step, "tokens_seen": result.tokens_seen,
                             "seconds": round(self.budget.elapsed(), 1),
                             "val_kl": result.val_losses[-1][1] if result.val_losses[-1][0] == step else None,
                             "held_out": figures_now})
        self.say(f"heal: step {step}: held-out {figures_now}")

    def finish(self) -> HealResult:
        """The totals: steps taken and planned, the step kept, seconds, forward-equivalents over every rank."""
        result, dp = self.result, self.dp
        result.steps = len(result.train_losses)
        result.planned_steps = self.schedule.total
        result.best_step = self.best.step
        result.seconds = self.budget.elapsed()
        # student: forward + backward (2 forwards) on each training token, a forward on validation tokens; teacher:
        # one forward per distinct token it ran (cached afterwards); over every rank
        ran = self.validation_forwards + self.source.forwards
        ran = dp.sum_float(ran) if dp.world > 1 else ran
        result.forward_equivalents = (3.0 * result.tokens_seen + ran) / result.tokens
        result.world_size = dp.world
        result.checkpoint_layers = self.checkpoint_layers
        return result


def heal(model, teacher, config: HealConfig | None = None, *, calibration="mixed", progress: bool = True,
         known: dict | None = None, log=None, group=None, held_out_texts: dict | None = None,
         **settings) -> HealResult:
    """Heal `model` (edited) in place by distillation from `teacher` (its unedited ancestor); see the module doc.

    config: the settings, a HealConfig (steps, tokens, params, lr, window, batch_size, validation_windows,
    eval_every, patience, held_out, eval_windows, max_seconds, seed, checkpoints, checkpoint_layers: its doc
    says what each means), or the same settings as keywords, heal(model, teacher, steps=200), which build it.
    It is recorded whole in the result (HealResult.config). calibration: anything
    analysis.batches.calibration_batches takes ("mixed", "prose+source": half prose, half verbatim torch / numpy
    source, a list of texts, token windows), or MaskedWindows (windows with a loss mask: the KL is summed only
    where the predicted token is a target, in training and validation alike; answers.teacher_answers). known: {"before_edit": ..., "after_edit": ...} held-out figures
    already measured (the edit command's). group: None (one process), "auto" (data-parallel over
    torch.distributed's default group when it is initialised, as under torchrun) or a process group; see the
    module doc. held_out_texts: more held-out domains measured beside the three, {name: list of texts} (a
    user's text: `headcount heal --text` measures its held-out paragraphs). The checkpoints' figures are
    measured on the weights of that moment (one run, one schedule: `result.curve`; the measuring time is not
    counted in `seconds`).
    """
    config = HealConfig.from_keywords(config, settings)
    run = _Healing(model, teacher, config, calibration=calibration, progress=progress, log=log, group=group)
    if held_out_texts is not None and (not isinstance(held_out_texts, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(t, str) for t in v)
            for k, v in held_out_texts.items())):
        raise ValueError("held_out_texts: expected {domain name: non-empty list of texts}, got "
                         f"{type(held_out_texts).__name__}")
    measure = functools.partial(held_out_figures, eval_windows=config.eval_windows, extra=held_out_texts)
    figures = _figures_before(model, teacher, config, measure, dict(known or {}), held_out_texts)

    result = run.setup(config.checkpoint_layers)
    result.config = config.to_json()
    with run.running():
        run.validate()
        if 0 in run.checkpoints:
            run.checkpoint(0, measure, figures)
        while run.done < run.schedule.total:
            decision = run.step()
            if run.done in run.checkpoints:
                run.checkpoint(run.done, measure, figures)
            if decision == STOP:
                result.stopped_early = True
                break
        run.best.restore()  # keep the weights of the best validation step
    run.finish()
    if config.held_out:
        figures["after_heal"] = measure(model)
        result.held_out = figures
    run.say(f"heal: {result.steps} steps ({config.params}, lr {run.lr:g}), {result.tokens:,} calibration tokens, validation "
            f"KL {result.val_first:.4f} -> {run.best.value:.4f} (step {run.best.step}) in {result.seconds:.0f} s")
    return result


def _figures_before(model, teacher, config: HealConfig, measure, known: dict, held_out_texts) -> dict:
    """The held-out figures before the edit (the teacher) and after it (the student as handed in): measured, or
    the edit command's `known` ones with a user's text measured beside them; {} when config.held_out is off."""
    figures = {}
    if config.held_out:
        for key, m in (("before_edit", teacher), ("after_edit", model)):
            if not known.get(key):
                figures[key] = measure(m)
            else:  # the edit command measured the three domains; a user's text is measured here
                extra = held_out_figures(m, config.eval_windows, extra=held_out_texts, only_extra=True) \
                    if held_out_texts else {}
                figures[key] = {**known[key], **extra}
    return figures
