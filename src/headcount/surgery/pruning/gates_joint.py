"""Gates trained WITH the model (Voita et al. 2019's setup): what train_gates(joint=True) adds to the frozen
variant (gates_frozen.FrozenRun, the same face); gates.py runs the loop over either.

    trained_parameters(model, params) -> [Parameter]   the weights that move with the gates
    teacher_copy(model, trained) -> model              a frozen copy of the unedited model for the distillation
    JointRun(model, ...)                               the run's calibration, teacher, loss and weight optimizer

Which weights move (`params`, the choice healing offers):
  "attention"  every layer's attention (qkv_proj, o_proj, q/k norms) and the norms around it (attn_norm,
               post_attn_norm): the edited sub-layers and what feeds them, ~1/4 of a small decoder's weights;
               the default, as healing's (the teacher then shares every other tensor with the student)
  "all"        every parameter (embeddings and lm_head included)

The run is healing's (surgery/healing/loop.py), with the gates in the student's forward:
  - calibration: DISTINCT windows, steps x batch_size of them up to healing's 98k-token budget, each seen
    once (the frozen variant cycles 8 windows: enough for 270 numbers, but a model's weights trained on
    2k tokens repeated 40 times learn those tokens, and the held-out text pays: docs/pruning.md has the run);
  - the teacher's final hidden states cached per window and the fused chunked KL (healing/loss.py);
  - the weights: AdamW at healing's default lr for those params (healing.loop.default_lr: DEFAULT_LR, scaled
    down for a decoder's small attention weights; an encoder's unscaled, relative_lr says why),
    warm-up then cosine, gradients clipped at 1 (headcount.training's Optimizer and WarmupCosine, as healing's);
  - the last `hard` share of the steps (JOINT_HARD, a quarter) fixes the gates at the heads that will be kept
    (exactly 1) and removed (exactly 0) and trains the weights alone: the weights then learn the model that
    removal leaves, rather than an average over sampled gates whose deterministic value (what removal keeps)
    is another model. The target density warms up over the first half (JOINT_WARMUP) so the gates have
    settled before they are fixed.

The teacher. In the frozen variant the teacher is the model itself without gates; here the model's weights
move, so the teacher is a copy taken before training, frozen. It owns only the tensors the student trains and
SHARES every other parameter and buffer with the student (copy.deepcopy with those tensors pre-entered in
its memo, as models.copying.attention_copy does): "attention" costs one copy of the attention weights and
norms, "all" a whole second model.

Why the removal after joint training is compensate="none": the kept heads' weights were trained to work
without the closed ones (with the hard phase, the pruned model IS the model trained last). A least-squares
refit would instead pull o_proj back towards the all-heads output of the trained weights, which is no model
anyone trained.
"""

from __future__ import annotations

import copy
import itertools

# the choices and defaults are GateConfig's (gates_config.py: one truth with `prune --method l0 --joint`)
from headcount.surgery.pruning.gates_config import DEFAULT_JOINT_PARAMS as DEFAULT_PARAMS  # noqa: E402
from headcount.surgery.pruning.gates_config import JOINT_PARAMS as PARAMS  # noqa: E402
from headcount.surgery.pruning.gates_config import JOINT_STEPS  # noqa: E402,F401


def check_params(params) -> str:
    if params not in PARAMS:
        raise ValueError(f"params: expected one of {', '.join(PARAMS)} (the weights trained with the gates), "
                         f"got {params!r}")
    return params


def trained_parameters(model, params: str = DEFAULT_PARAMS) -> list:
    """The parameters that train with the gates (each once, in module order)."""
    check_params(params)
    if params == "all":
        return list(model.parameters())
    seen, out = set(), []
    for layer in model.layers:
        mods = [layer.attn] + [m for m in (getattr(layer, n, None) for n in ("attn_norm", "post_attn_norm"))
                               if m is not None]
        for p in itertools.chain.from_iterable(m.parameters() for m in mods):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def teacher_copy(model, trained) -> object:
    """A frozen eval-mode copy of `model` owning the `trained` tensors, every other tensor shared with it."""
    own = {id(p) for p in trained}
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers()) if id(t) not in own}
    teacher = copy.deepcopy(model, memo)
    for p in teacher.parameters():
        if id(p) in own or id(p) not in memo:
            p.requires_grad_(False)
    return teacher.eval()


# ----------------------------------------------------------------------------------------- the run
class JointRun:
    """What a joint run adds to train_gates' loop: its own calibration (distinct windows, no repeats), the
    teacher (a frozen copy; a decoder's final hidden states cached per window, as healing caches them), the
    distillation loss and the weights' optimizer (healing's: AdamW, warm-up then cosine, clipped at 1).

        run = JointRun(model, params=..., weight_lr=..., steps=..., calibration=..., window=..., batch_size=...)
        loss, n = run.loss(step, head_gates)     the distillation of the gated student on step's batch
        run.step()                               the weights' optimizer step (after backward)
        run.close()                              requires_grad back, the teacher dropped
    """

    def __init__(self, model, *, params: str, weight_lr: float, steps: int, calibration, window: int,
                 batch_size: int, tokens: int | None = None):
        from headcount.analysis.batches import calibration_batches, is_decoder
        from headcount.surgery.healing import loop
        from headcount.surgery.healing.step import Teacher
        from headcount.training.optimizer import Optimizer
        from headcount.training.schedule import WarmupCosine

        self.model, self.decoder = model, is_decoder(model)
        self.trained = trained_parameters(model, params)
        tokens = loop.DEFAULT_TOKENS if tokens is None else tokens
        if self.decoder:
            window = min(window, model.config.max_position)
            n = max(1, min(steps * batch_size, tokens // window))
            windows = loop._windows(model, calibration, n, window)
            self.rows = [list(range(i, min(i + batch_size, windows.shape[0])))
                         for i in range(0, windows.shape[0], batch_size)]
            self.calibration_tokens = int(windows.numel())
        else:  # encoders: batches of 32 sentences, as many distinct ones as the steps take (and the text has)
            self.batches = calibration_batches(model, calibration, n_sentences=32 * steps)
            self.calibration_tokens = sum(b.n_tokens for b in self.batches)
        self.teacher_model = teacher_copy(model, self.trained)
        self.source = Teacher(self.teacher_model, windows) if self.decoder else None
        for p in self.trained:
            p.requires_grad_(True)
        self.optimizer = Optimizer(self.trained, lr=weight_lr, schedule=WarmupCosine(steps, share=loop.WARMUP))
        self.tokens_seen = 0
        self.teacher_tokens = 0  # tokens the teacher ran (a decoder's once per window: cached)

    def batch_rows(self, step: int) -> int:
        """How many examples (windows or sentences) step's batch holds: one gate draw each."""
        if self.decoder:
            return len(self.rows[step % len(self.rows)])
        return self.batches[step % len(self.batches)].ids.shape[0]

    def loss(self, step: int, head_gates) -> tuple:
        import torch

        from headcount.analysis import objectives
        from headcount.surgery.healing.step import distilled

        if self.decoder:
            rows = self.rows[step % len(self.rows)]
            kl, n = distilled(self.model, self.source, rows, self.teacher_model.lm_head, head_gates=head_gates)
            self.tokens_seen += len(rows) * self.source.windows.shape[1]
            return kl / n, n
        batch = self.batches[step % len(self.batches)]
        with torch.no_grad():
            ref = objectives.pooled(self.teacher_model, batch.ids, batch.mask)
        emb = objectives.pooled(self.model, batch.ids, batch.mask, head_gates=head_gates)
        self.tokens_seen += batch.n_tokens
        self.teacher_tokens += batch.n_tokens
        return objectives.fidelity(emb, ref).mean().float(), batch.ids.shape[0]

    def step(self) -> None:
        self.optimizer.step()  # clip at 1, AdamW, the schedule

    def close(self) -> None:
        if self.source is not None:
            self.teacher_tokens = self.source.forwards
        self.teacher_model = self.source = None
