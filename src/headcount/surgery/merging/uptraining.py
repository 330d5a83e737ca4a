"""uptrain: a short CPU fine-tune after merging or pruning, on calibration text.

    uptrain(model, UptrainConfig(steps=20, lr=1e-4, trainable="attention", batch_size=1, window=256),
            calibration=None, teacher=None) -> UptrainResult
    uptrain(model, 20, lr=1e-4, ...)      the keyword form: the same UptrainConfig built from the keywords

headcount.training's AdamW + clip with its linear warm-up then cosine decay to 0, a progress bar on stderr
with the running loss, and the first / last losses logged. Each step draws its own window, so the first and last
steps' losses are of different text: the loss on the same PROBE_WINDOWS windows (the first of the pool), measured
before the first step and after the last, is what says whether the run lowered it (`probe_before` /
`probe_after`). Decoders: next-token cross-entropy on calibration windows, or, with `teacher` (the
unmodified model), the KL divergence from the teacher's next-token distribution (distillation: every position
carries a full distribution, not one token, so it recovers more per step). Encoders need a teacher: the loss is
1 - cosine between the mean-pooled sentence embeddings of the student and the teacher.

trainable: "attention" (qkv_proj and o_proj of every layer), "qkv" (qkv_proj only), "o_proj",
"all" (every parameter), or a list of layer indices (those layers' attention). Everything else is
frozen for the run and restored afterwards; the model is left in eval mode.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from headcount.surgery.merging.defaults import TRAINABLE, UptrainConfig
from headcount.surgery.merging.stream import calibration_batches, is_decoder
from headcount.training.budget import TimeBudget
from headcount.training.optimizer import Optimizer
from headcount.training.schedule import WarmupCosine

# what the commands' JSON and the report keep of an UptrainResult (no per-step losses, no timings)
SUMMARY_KEYS = ("steps", "lr", "tokens", "objective", "loss_first", "loss_last", "probe_before", "probe_after")
PROBE_WINDOWS = 2  # windows (an encoder: sentence batches) measured before and after: 10% of 20 steps' token-forwards


@dataclass
class UptrainResult:
    steps: int
    lr: float
    trainable: str
    trainable_params: int
    tokens: int  # tokens seen (with repeats)
    seconds: float
    losses: list[float] = field(default_factory=list)  # one per step
    objective: str = "cross_entropy"
    config: dict | None = None  # the UptrainConfig the run was given, whole (UptrainConfig.to_json)
    probe_before: float | None = None  # the loss on the same PROBE_WINDOWS windows before the first step
    probe_after: float | None = None  # ... and after the last
    probe_tokens: int = 0

    @property
    def loss_first(self) -> float:
        k = max(1, min(5, len(self.losses)))
        return sum(self.losses[:k]) / k

    @property
    def loss_last(self) -> float:
        k = max(1, min(5, len(self.losses)))
        return sum(self.losses[-k:]) / k

    @property
    def token_forwards(self) -> float:
        """Its cost in one-token forward passes: the student's forward and backward on every token it saw (a
        backward counted as two forwards, as kv_merge._forward_equivalents counts them) plus, with a teacher,
        the teacher's forward on the same tokens, and the probe's forwards (student, + teacher) before and after.
        Divide by a calibration's token count for forward-equivalents."""
        per_forward = 1.0 if self.objective == "cross_entropy" else 2.0  # the probe's student (+ teacher) forwards
        return (3.0 + (0.0 if self.objective == "cross_entropy" else 1.0)) * self.tokens + \
            2 * per_forward * self.probe_tokens

    def to_json(self) -> dict:
        return {**asdict(self), "loss_first": self.loss_first, "loss_last": self.loss_last,
                "token_forwards": self.token_forwards}


def summary(block: dict | None) -> dict | None:
    """An UptrainResult.to_json() cut to SUMMARY_KEYS (None stays None)."""
    return {k: block.get(k) for k in SUMMARY_KEYS} if block else None


def describe(block: dict) -> str:
    """One line for a summary: the probe's before -> after where measured, else the first and last steps'."""
    if block.get("probe_before") is not None:
        return (f"uptrain: {block['steps']} steps, {block['objective']} on the same windows "
                f"{block['probe_before']:.4f} -> {block['probe_after']:.4f}")
    return (f"uptrain: {block['steps']} steps, {block['objective']} {block['loss_first']:.4f} -> "
            f"{block['loss_last']:.4f}")


def _parameters(model, trainable) -> list[torch.nn.Parameter]:
    if isinstance(trainable, str):
        if trainable not in TRAINABLE:
            raise ValueError(f"trainable: expected one of {TRAINABLE} or a list of layer indices, got {trainable!r}")
        if trainable == "all":
            return [p for p in model.parameters()]
        layers = range(len(model.layers))
    else:
        try:
            layers = sorted({int(i) for i in trainable})
        except (TypeError, ValueError):
            raise TypeError(f"trainable: expected one of {TRAINABLE} or a list of layer indices, "
                            f"got {trainable!r}") from None
        bad = [i for i in layers if not 0 <= i < len(model.layers)]
        if bad or not layers:
            raise ValueError(f"trainable: expected layer indices in [0, {len(model.layers)}), got {list(trainable)}")
        trainable = "attention"
    from headcount.models.dropped import is_dropped

    params = []
    for i in layers:
        attn = model.layers[i].attn
        if is_dropped(attn):  # drop-attention left this layer no attention weights to train
            continue
        if trainable in ("attention", "qkv"):
            params += list(attn.qkv_proj.parameters())
        if trainable in ("attention", "o_proj"):
            params += list(attn.o_proj.parameters())
    if not params:
        raise ValueError(f"trainable: the layers asked for ({', '.join(map(str, layers))}) have no attention weights "
                         "left (their attention was dropped); name layers that still have attention")
    return params


def _decoder_loss(model, ids, teacher) -> torch.Tensor:
    logits = model(ids[:, :-1]).logits.float()
    if teacher is None:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    with torch.no_grad():
        target = F.log_softmax(teacher(ids[:, :-1]).logits.float(), dim=-1)
    return F.kl_div(F.log_softmax(logits, dim=-1).reshape(-1, logits.shape[-1]),
                    target.reshape(-1, target.shape[-1]), log_target=True, reduction="batchmean")


def _encoder_loss(model, batch, teacher) -> torch.Tensor:
    def pool(m):
        h = m(batch.ids, batch.mask).last_hidden_state
        w = batch.mask.unsqueeze(-1).to(h.dtype)
        return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)

    with torch.no_grad():
        target = pool(teacher)
    return 1.0 - F.cosine_similarity(pool(model), target, dim=-1).mean()


def uptrain(model, config: UptrainConfig | int, *, calibration=None, teacher=None, progress: bool = True,
            log=None, **settings) -> UptrainResult:
    """Fine-tune `model` in place on calibration text (see module docstring).

    config: the settings, an UptrainConfig (steps, lr, trainable, batch_size, window, weight_decay, warmup, seed,
    max_windows, max_seconds: its doc says what each means), or the number of steps with the other settings as
    keywords, uptrain(model, 20, lr=3e-4), which build the same config. It is recorded whole in the result
    (UptrainResult.config). teacher: the unmodified model (distillation; an encoder needs one)."""
    if isinstance(config, UptrainConfig):
        if settings:
            raise ValueError(f"config: give an UptrainConfig or its settings as keywords, not both (got "
                             f"{', '.join(sorted(settings))} beside it)")
    else:
        config = UptrainConfig(steps=config, **settings)
    budget = TimeBudget(config.max_seconds)
    decoder = is_decoder(model)
    if not decoder and teacher is None:
        raise ValueError("teacher: an encoder has no language-model loss; pass the unmodified model as teacher=")
    params = _parameters(model, config.trainable)
    data = _Data(model, config, calibration, decoder)
    frozen = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    n_trainable = sum(p.numel() for p in {id(p): p for p in params}.values())
    schedule = WarmupCosine(config.steps, share=config.warmup)
    optimizer = Optimizer(params, lr=config.lr, schedule=schedule, weight_decay=config.weight_decay)
    trainable = config.trainable
    result = UptrainResult(config.steps, float(config.lr), trainable if isinstance(trainable, str) else "layers",
                           n_trainable, 0, 0.0, objective="cross_entropy" if decoder and teacher is None else
                           ("kl_to_teacher" if decoder else "cosine_to_teacher"), config=config.to_json())
    budget.start()
    was_training = model.training
    try:
        result.probe_before, result.probe_tokens = data.probe(model, teacher)
        model.train()
        _steps(model, data, teacher, optimizer, schedule, budget, result, progress)
        model.eval()
        result.probe_after, _ = data.probe(model, teacher)
    finally:
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        model.train(was_training)
        model.eval()
    result.seconds = budget.elapsed()
    result.steps = len(result.losses)
    message = (f"uptrain: {result.steps} steps, {result.tokens:,} tokens, {result.objective} on the same "
               f"{data.n_probe} windows {result.probe_before:.4f} -> {result.probe_after:.4f} (each step its own "
               f"window: the first steps {result.loss_first:.4f}, the last {result.loss_last:.4f}) in "
               f"{result.seconds:.0f} s")
    if log is not None:
        log(message)
    elif progress:
        import sys
        print(message, file=sys.stderr)
    return result


class _Data:
    """The uptrain's calibration: a decoder's windows (one pool, drawn batch_size rows a step) or an encoder's
    sentence batches, in a seeded random order, reshuffled when used up."""

    def __init__(self, model, config: UptrainConfig, calibration, decoder: bool):
        self.decoder, self.batch_size = decoder, config.batch_size
        if decoder:
            self.batches = calibration_batches(model, calibration, n_windows=config.max_windows or 10**9,
                                               window=config.window, batch_size=config.batch_size)
            self.pool = torch.cat([b.ids for b in self.batches])
        else:
            self.batches = calibration_batches(model, calibration, n_sentences=max(256, 16 * config.batch_size))
            self.pool = None
        self.generator = torch.Generator().manual_seed(config.seed)
        self.order: list[int] = []
        self.n_probe = min(PROBE_WINDOWS, self.pool.shape[0] if decoder else len(self.batches))

    @torch.no_grad()
    def probe(self, model, teacher) -> tuple[float, int]:
        """(the mean loss on the first n_probe windows or sentence batches, their tokens), gradients off."""
        losses, tokens = [], 0
        for i in range(self.n_probe):
            if self.decoder:
                ids = self.pool[i:i + 1]
                losses.append(float(_decoder_loss(model, ids, teacher)))
                tokens += ids.numel()
            else:
                batch = self.batches[i]
                losses.append(float(_encoder_loss(model, batch, teacher)))
                tokens += int(batch.mask.sum())
        return sum(losses) / len(losses), tokens

    def loss(self, model, teacher) -> tuple:
        """(the loss of the next batch, its tokens)."""
        if not self.order:
            n = self.pool.shape[0] if self.decoder else len(self.batches)
            self.order = torch.randperm(n, generator=self.generator).tolist()
        if self.decoder:
            ids = self.pool[[self.order.pop() for _ in range(min(self.batch_size, len(self.order)))]]
            return _decoder_loss(model, ids, teacher), ids.numel()
        batch = self.batches[self.order.pop()]
        return _encoder_loss(model, batch, teacher), int(batch.mask.sum())


def _steps(model, data: _Data, teacher, optimizer, schedule, budget, result: UptrainResult, progress: bool) -> None:
    """The optimizer steps (fewer when the time budget re-sizes the schedule), each loss recorded in `result`."""
    from tqdm.auto import tqdm

    bar = tqdm(range(result.steps), desc="uptrain", disable=None if progress else True, leave=False)
    running = None
    for step in bar:
        if step >= schedule.total:
            break
        if budget.fit(step, schedule):  # three steps timed, then the run fitted to the budget
            bar.total = schedule.total
        loss, tokens = data.loss(model, teacher)
        result.tokens += tokens
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        result.losses.append(value)
        running = value if running is None else 0.9 * running + 0.1 * value
        bar.set_postfix(loss=f"{running:.4f}")
