"""Trained head gates: a hard-concrete L0 gate per head (Louizos et al. 2018, arXiv 1712.01312; Voita et
al. 2019, arXiv 1905.09418), trained on a frozen model, then the closed heads removed structurally.

    train_gates(model, *, heads_to_keep=None, fraction=None, steps, lr=0.1, calibration=None, mode="query",
                progress=True, ...) -> GateResult
    apply_gates(model, gates, *, compensate="lstsq", calibration=None, force=False) -> PruneResult
    prune_l0(model, *, fraction=None, heads_to_keep=None, steps, ...) -> PruneResult (method "l0")

The gate (hard_concrete.py: its sample, expected L0 and deterministic value). One log_alpha per head
(mode="query") or per GQA group (mode="group": one gate shared by the query heads that read one KV head).
Gates enter the model through its public `head_gates=` forward argument (a list with one [B, n_heads] tensor
per layer: each example of a batch draws its own gates), i.e. at the input of o_proj, where a gate of 0 is
exactly the structural removal of that head.

One loop drives either run through the same face (batch_rows / loss / step / close): gates_frozen.FrozenRun,
or for joint training (joint=True, Voita's own setup) gates_joint.JointRun, where the chosen weights of the
model ("attention", the default, or "all") train with the gates (healing's optimizer), in place, on distinct
calibration windows, against a frozen copy of the unedited model; for the last `hard` share of the steps the
gates are fixed at the heads kept; apply_gates then removes the heads from that trained model with
compensate "none". Everything below describes the frozen variant, which stays the default.

Training. Every weight of the model is frozen (requires_grad False for the duration; the flags are put
back afterwards, and no weight is written); only log_alpha (and the two multipliers) train. The loss is
distillation from the unmodified model, which is the same model with no gates, so the teacher is a
no_grad forward of the same weights (no copy):
    decoders  KL(teacher || student) of the next-token distributions, mean over positions (nats)
    encoders  embedding fidelity 1 - cos of the mean-pooled, normalised sentence embeddings
              (headcount.analysis.objectives.pooled / fidelity), mean over sentences
plus a Lagrangian on the expected L0, written as a density d = E[L0] / n_gates:

    L = distill + lambda1 * (d - t) + lambda2 * (d - t)^2,    min over log_alpha, MAX over lambda1, lambda2

(CoFi, arXiv 2204.00408; Sheared-LLaMA, arXiv 2310.06694): the multipliers start at 0 and are trained by
gradient ASCENT (Adam with maximize=True), the target density t warms up linearly from the gates'
initial density to the requested one over the first `warmup` share of the steps. Why a Lagrangian and
not a fixed L0 coefficient (Voita's lambda) or a schedule on it: a fixed coefficient buys an unknown
sparsity, which depends on the loss's scale (KL in nats for a decoder, 1 - cos ~1e-3 for an encoder) and
on the model, so hitting a requested head count means sweeping it; the multiplier instead grows until
the constraint holds and shrinks when it overshoots, so one run lands on the target for any model and
loss. The warm-up keeps the distillation loss in charge early, while the gates learn which heads matter.

Short runs (a CPU affords ~100-300 steps) make the Lagrangian's dynamics matter, hence these settings
(docs/pruning.md, "History", has the runs they were chosen on and the command that repeats them):
  - the multipliers: Adam lr `lambda_lr` = 1.0 with NO momentum (betas (0, 0.99)): the multiplier turns as
    soon as the constraint is crossed (momentum there is what overshoots: integral wind-up);
  - the gates: Adam with betas (0.5, 0.99) (less lag than 0.9), and log_alpha clamped to [-6, 6] after each
    step: a gate pushed further saturates (its samples are all 0 or all 1, so neither loss moves it) and
    could not come back when the multiplier turns; at -6 it still counts 0.012 to the expected L0;
  - lr x steps of at least ~15: a gate moves at most ~lr per step and must travel from init (2) past -2.4
    (where its deterministic value reaches 0). The defaults: lr 0.1, 150 steps.

The choice at the end is EXACT: the deterministic gates decide. The `heads_to_keep` gates (query heads, or
KV groups in group mode) with the largest score (log_alpha, which orders the deterministic gates and
breaks their ties at 0 and 1) are kept, with at least one per layer (a layer cannot lose every head
structurally; `n_forced` says how many were kept only for that). GateResult says how many removed gates
were "closed" (deterministic gate exactly 0) and how many were open but ranked out (`n_removed_ranked`),
and how many kept gates were closed (`n_kept_closed`: the gates closed more than asked).

Cost: `forward_equivalents` = forward passes over the calibration tokens that the training costs, with
the convention that a step is 3 forward passes of its batch for the student (forward + backward, the
usual 1 + 2) plus 1 for the teacher's forward: sum over steps of 4 x batch tokens / calibration tokens.

Calibration goes through the one calibration path, headcount.analysis.batches.calibration_batches; None is
prune's default (removal.resolve_default: mixed prose + code-like text for a decoder).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from headcount import arguments
from headcount.surgery.pruning import plan as _plan
# the settings' defaults live with GateConfig (no torch there: the command's --help reads them); re-exported here
from headcount.surgery.pruning.gates_config import (BATCH_SIZE, INIT_LOG_ALPHA, JOINT_HARD,  # noqa: F401
                                                    JOINT_WARMUP, LAMBDA_LR, N_WINDOWS, WARMUP, WINDOW, GateConfig)
from headcount.surgery.pruning.hard_concrete import deterministic_gates, expected_l0, open_probability, sample_gates

Tensor = torch.Tensor

MODES = ("query", "group")
LOG_ALPHA_LIMIT = 6.0  # |log_alpha| bound: beyond it a gate saturates (see the module doc)
REACH_TOLERANCE = 0.10  # |E[L0] - target| above this share of the gates: the target was not reached


# ------------------------------------------------------------------------------------------- result
@dataclass
class GateResult:
    """Trained gates and the heads they keep. Heads are (layer, ORIGINAL head index), as prune takes them.

    gates: deterministic gate per current query head, [n_layers][n_heads] (group mode: a group's gate
    repeated on each of its query heads); layout: each layer's original head indices at training time.
    history: [{"step", "gates"}] every `history_every` steps and at the end; expected_l0 / target_l0: per
    step, in gates (query heads, or KV groups in group mode).
    """

    mode: str
    n_gates: int
    heads_to_keep: int
    fraction: float | None
    steps: int
    lr: float
    layout: list[list[int]]
    gates: list[list[float]]
    log_alpha: list[list[float]]
    kept: dict[int, list[int]]
    removed: dict[int, list[int]]
    expected_l0: list[float] = field(default_factory=list)
    target_l0: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    lambdas: tuple[float, float] = (0.0, 0.0)
    n_closed: int = 0
    n_removed_closed: int = 0
    n_removed_ranked: int = 0
    n_kept_closed: int = 0
    n_forced: int = 0
    calibration_tokens: int = 0
    forward_equivalents: float = 0.0
    seconds: float = 0.0
    objective: str = ""
    joint: bool = False  # the model's weights trained with the gates (gates_joint.py); False: the model frozen
    params: str | None = None  # joint: which weights moved ("attention", "all")
    weight_lr: float | None = None  # joint: AdamW's lr on those weights
    trained_params: int = 0  # joint: how many numbers moved
    hard_steps: int = 0  # joint: the last steps, with the gates fixed at the heads kept (only the weights trained)
    config: dict | None = None  # the GateConfig the run was given, whole (GateConfig.to_json)

    @property
    def final_loss(self) -> float | None:
        return self.loss[-1] if self.loss else None

    @property
    def final_expected_l0(self) -> float:
        return self.expected_l0[-1] if self.expected_l0 else float(self.n_gates)

    @property
    def reached(self) -> bool:
        """The expected L0 at the end is within REACH_TOLERANCE of the gates from the target."""
        return abs(self.final_expected_l0 - self.heads_to_keep) <= REACH_TOLERANCE * self.n_gates

    def kept_pairs(self) -> set[tuple[int, int]]:
        return {(l, h) for l, hs in self.kept.items() for h in hs}

    def to_json(self) -> dict:
        r4 = lambda rows: [[round(float(v), 4) for v in row] for row in rows]  # noqa: E731
        return {
            "mode": self.mode, "n_gates": self.n_gates, "heads_to_keep": self.heads_to_keep,
            "fraction": self.fraction, "steps": self.steps, "lr": self.lr, "objective": self.objective,
            "gates": r4(self.gates), "log_alpha": r4(self.log_alpha), "layout": self.layout,
            "kept": {str(k): v for k, v in self.kept.items()}, "removed": {str(k): v for k, v in self.removed.items()},
            "n_closed": self.n_closed, "n_removed_closed": self.n_removed_closed,
            "n_removed_ranked": self.n_removed_ranked, "n_kept_closed": self.n_kept_closed, "n_forced": self.n_forced,
            "expected_l0": [round(v, 3) for v in self.expected_l0], "target_l0": [round(v, 3) for v in self.target_l0],
            "final_expected_l0": round(self.final_expected_l0, 3), "reached": self.reached,
            "loss": [round(v, 6) for v in self.loss], "final_loss": self.final_loss,
            "history": [{"step": h["step"], "gates": r4(h["gates"])} for h in self.history],
            "lambdas": [round(float(v), 6) for v in self.lambdas],
            "calibration_tokens": self.calibration_tokens, "forward_equivalents": round(self.forward_equivalents, 2),
            "seconds": round(self.seconds, 3), "joint": self.joint, "params": self.params,
            "weight_lr": self.weight_lr, "trained_params": self.trained_params, "hard_steps": self.hard_steps,
            **({"config": self.config} if self.config is not None else {}),
        }


def _units(model, mode: str) -> list[tuple[int, list[int], Tensor]]:
    """Per layer: (number of gates, [original query heads of each gate...] flattened per gate, index
    [n_heads] mapping each current query head to its gate)."""
    out = []
    for layer, (kept, kv_of) in enumerate(_plan.layout(model)):
        if mode == "query":
            members = [[h] for h in kept]
            index = torch.arange(len(kept))
        else:
            kvs = sorted(set(kv_of))
            pos = {kv: i for i, kv in enumerate(kvs)}
            members = [[h for h, k in zip(kept, kv_of) if k == kv] for kv in kvs]
            index = torch.tensor([pos[k] for k in kv_of])
        out.append((len(members), members, index))
    return out


def gate_count(model, mode: str = "query") -> tuple[int, int]:
    """(gates, layers): the model's current query heads (mode="query") or KV groups (mode="group")."""
    _plan.check_mode(mode)
    units = _units(model, mode)
    return sum(u[0] for u in units), len(units)


def resolve_target(n_gates: int, n_layers: int, heads_to_keep=None, fraction=None, *, unit: str = "heads") -> int:
    """The number of gates to keep from heads_to_keep or fraction (the share to REMOVE), checked."""
    if (heads_to_keep is None) == (fraction is None):
        raise ValueError("heads_to_keep, fraction: give exactly one (the gates to keep, or the share to remove)")
    if fraction is not None:
        _plan._check_fraction(fraction)
        keep = n_gates - round(fraction * n_gates)
        name = "fraction"
    else:
        keep = arguments.positive_int("heads_to_keep", heads_to_keep, 0)
        name = "heads_to_keep"
    what = f"{keep} of {n_gates} {unit}"
    if keep == 0:
        raise arguments.ArgumentError(name, f"a gate target of 0 {unit} ({what}) leaves no attention; keep at least "
                                            "one per layer")
    if keep >= n_gates:
        raise arguments.ArgumentError(name, f"a gate target of every head ({what}) prunes nothing"
                                      + (f"; {fraction} of {n_gates} rounds to 0 removed" if fraction is not None
                                         else ""))
    if keep < n_layers:
        raise arguments.ArgumentError(name, f"{what} kept, fewer than the model's {n_layers} layers; structural "
                                            "removal keeps at least one per layer")
    return keep


# ------------------------------------------------------------------------------------------- train
def train_gates(model, config: GateConfig | None = None, *, heads_to_keep: int | None = None,
                fraction: float | None = None, calibration=None, progress: bool = True, **settings) -> GateResult:
    """Train a hard-concrete gate per head (or per GQA group) of the frozen `model`; see the module doc.

    config: how (GateConfig: steps, lr, mode, the calibration's size, the Lagrangian's lr and warm-up, joint
    training; its doc says what each means), or the same settings as keywords, train_gates(model, steps=150,
    fraction=0.2), which build it; recorded whole in GateResult.config. heads_to_keep / fraction: the target,
    exactly one; fraction is the share of gates to REMOVE, in (0, 1). In group mode both count KV groups (as
    prune_to's group mode does). joint=True (Voita's setup, gates_joint.py): the model's weights train WITH the
    gates, IN PLACE, against a frozen copy of the unedited model, on distinct calibration windows; for the last
    `hard` share of the steps the gates are fixed at the heads kept (1) and removed (0) and only the weights
    train, so apply_gates' removal is exactly the model trained last. Without joint, no weight of `model`
    changes.
    """
    config = GateConfig.from_keywords(config, settings)
    recipe = (JointGates if config.joint else FrozenGates)(model, config, heads_to_keep, fraction, calibration)
    recipe.setup(progress)
    with recipe.running():
        for step in range(config.steps):
            recipe.step(step)
    return recipe.finish()


class FrozenGates:
    """One gate training as a recipe, the frozen variant (train_gates' default): __init__ checks the target and
    builds the gates and their optimizers; setup() the run (gates_frozen.FrozenRun: its calibration and
    teacher) and the progress bar; running() the block the steps run in (every weight frozen, eval mode; put
    back after); step() one optimizer step of the gates and the multipliers; finish() the GateResult.
    JointGates changes what the run is and which gates a step draws."""

    def __init__(self, model, config: GateConfig, heads_to_keep, fraction, calibration):
        from headcount.analysis.batches import is_decoder
        from headcount.surgery.pruning.removal import resolve_default
        from headcount.training.optimizer import Optimizer

        self.model, self.config, self.fraction = model, config, fraction
        self.units = units = _units(model, config.mode)
        self.n_gates = n_gates = sum(u[0] for u in units)
        unit = "query heads" if config.mode == "query" else "KV groups"
        self.keep = resolve_target(n_gates, len(units), heads_to_keep, fraction, unit=unit)
        self.decoder = is_decoder(model)
        self.calibration = resolve_default(model, calibration)
        self.device = device = model.embed.weight.device
        self.start = time.perf_counter()
        self.log_alpha = torch.full((n_gates,), float(config.init), device=device, requires_grad=True)
        self.lambdas = torch.zeros(2, device=device, requires_grad=True)
        # Adam on the gates, Adam ascent on the multipliers (the module doc says why these betas), constant lrs
        self.opt = Optimizer([self.log_alpha], lr=config.lr, betas=(0.5, 0.99), clip=None)
        self.opt_lambda = Optimizer([self.lambdas], lr=config.lambda_lr, betas=(0.0, 0.99), maximize=True, clip=None)
        self.offsets = [0]
        for n, _, _ in units:
            self.offsets.append(self.offsets[-1] + n)
        self.indices = [idx.to(device) for _, _, idx in units]
        self.gen = torch.Generator(device=device).manual_seed(config.seed)
        self.density0 = float(open_probability(self.log_alpha.detach()).mean())
        self.density_target = self.keep / n_gates
        self.n_warm = round(config.warmup * config.steps)
        self.hard_from = config.steps - round(config.hard * config.steps)  # gates fixed from here (joint only)
        self.fixed = None  # the fixed gates [n_gates]: 1 kept, 0 removed
        self.expected, self.targets, self.losses, self.history = [], [], [], []
        self.dtype = model.embed.weight.dtype
        self.weight_lr, self.run, self.bar = None, None, None

    def make_run(self):
        from headcount.surgery.pruning.gates_frozen import FrozenRun

        c = self.config
        return FrozenRun(self.model, calibration=self.calibration, n_windows=c.n_windows, window=c.window,
                         batch_size=c.batch_size)

    def setup(self, progress: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.config.steps, desc=f"gates ({self.config.mode})",
                        disable=None if progress else True, leave=False)

    @contextlib.contextmanager
    def running(self):
        """Every weight frozen and eval mode for the block (the run built inside it: joint's teacher is copied
        before the first step); after it, whatever happened: the flags and the mode back, the run closed."""
        model = self.model
        flags = [p.requires_grad for p in model.parameters()]
        was_training = model.training
        try:
            for p in model.parameters():
                p.requires_grad_(False)
            model.eval()
            self.run = self.make_run()
            yield self
        finally:
            self.bar.close()
            for p, flag in zip(model.parameters(), flags):
                p.requires_grad_(flag)
            model.train(was_training)
            if self.run is not None:
                self.run.close()

    def per_layer(self, values: Tensor) -> list[Tensor]:
        """gate values [..., n_gates] -> one [..., n_heads] tensor per layer."""
        o = self.offsets
        return [values[..., o[l]:o[l + 1]].index_select(-1, self.indices[l]) for l in range(len(self.units))]

    def gates(self, step: int, rows: int) -> Tensor:
        """The gates of step's batch [rows, n_gates]: one hard-concrete draw per example."""
        return sample_gates(self.log_alpha.expand(rows, self.n_gates), generator=self.gen)

    def target(self, step: int) -> float:
        """The target density at `step`: warmed up linearly from the gates' initial density over n_warm steps."""
        if step >= self.n_warm:
            return self.density_target
        return self.density0 + (self.density_target - self.density0) * (step + 1) / self.n_warm

    def step(self, step: int) -> None:
        """One step: the distillation of the gated model, the Lagrangian on the expected L0 (gates and multipliers
        step; with the gates fixed, the loss alone), the weights' step (joint), the gates clamped, the record."""
        z = self.gates(step, self.run.batch_rows(step))
        distill = self.run.loss(step, [g.to(self.dtype) for g in self.per_layer(z)])[0]
        t = self.target(step)
        if self.fixed is None:
            gap = open_probability(self.log_alpha).mean() - t
            lagrangian = self.lambdas[0] * gap + self.lambdas[1] * gap * gap
            (distill + lagrangian).backward()
            self.opt.step()
            self.opt_lambda.step()
        else:
            distill.backward()
        self.run.step()  # the weights' step (joint); nothing for frozen gates
        with torch.no_grad():
            self.log_alpha.clamp_(-LOG_ALPHA_LIMIT, LOG_ALPHA_LIMIT)
            self.expected.append(float(expected_l0(self.log_alpha)))
        self.targets.append(t * self.n_gates)
        self.losses.append(float(distill.detach()))
        if (step + 1) % self.config.history_every == 0 or step + 1 == self.config.steps:
            with torch.no_grad():
                self.history.append({"step": step + 1, "gates": [g.tolist() for g in
                                                                 self.per_layer(deterministic_gates(self.log_alpha))]})
        self.bar.set_postfix(loss=f"{self.losses[-1]:.4f}", l0=f"{self.expected[-1]:.1f}/{self.keep}")
        self.bar.update(1)

    def finish(self) -> GateResult:
        """The chosen heads (the deterministic gates' top `keep`, at least one per layer; or the fixed gates),
        what the run cost and reached."""
        run, keep, n_gates, offsets, units, c = self.run, self.keep, self.n_gates, self.offsets, self.units, self.config
        # student forward + backward (3 forwards) on every token seen, plus the teacher's forwards: every batch for
        # frozen gates and an encoder's joint run, once per distinct window for a decoder's joint run (cached)
        forward_equivalents = (3.0 * run.tokens_seen + run.teacher_tokens) / max(run.calibration_tokens, 1)
        with torch.no_grad():
            la = self.log_alpha.detach().cpu()
            det = deterministic_gates(la)
        fixed = self.fixed
        chosen = _choose(la, offsets, keep) if fixed is None else set(torch.nonzero(fixed.cpu()).flatten().tolist())
        kept, removed = {}, {}
        n_forced = len(chosen - set(torch.topk(la, keep).indices.tolist()))
        for l, (n, members, _) in enumerate(units):
            for j in range(n):
                (kept if offsets[l] + j in chosen else removed).setdefault(l, []).extend(members[j])
        closed = det == 0
        n_removed_closed = sum(1 for i in range(n_gates) if i not in chosen and bool(closed[i]))
        return GateResult(
            mode=c.mode, n_gates=n_gates, heads_to_keep=keep,
            fraction=None if self.fraction is None else float(self.fraction), steps=c.steps, lr=c.lr,
            layout=[list(k) for k, _ in _plan.layout(self.model)],
            gates=[g.tolist() for g in _split(det if fixed is None else fixed.cpu(), offsets, units)],
            log_alpha=[la[offsets[l]:offsets[l + 1]].tolist() for l in range(len(units))],
            kept={l: sorted(v) for l, v in sorted(kept.items())},
            removed={l: sorted(v) for l, v in sorted(removed.items())},
            expected_l0=self.expected, target_l0=self.targets, loss=self.losses, history=self.history,
            lambdas=tuple(float(v) for v in self.lambdas.detach().cpu()), n_closed=int(closed.sum()),
            n_removed_closed=n_removed_closed, n_removed_ranked=n_gates - keep - n_removed_closed,
            n_kept_closed=sum(1 for i in chosen if bool(closed[i])), n_forced=n_forced,
            calibration_tokens=run.calibration_tokens, forward_equivalents=forward_equivalents,
            seconds=time.perf_counter() - self.start,
            objective="KL(teacher || gated) of next-token distributions" if self.decoder else
            "1 - cos of mean-pooled sentence embeddings (gated vs unmodified)",
            joint=c.joint, params=c.params, weight_lr=self.weight_lr,
            trained_params=sum(p.numel() for p in run.trained), hard_steps=c.steps - self.hard_from if c.joint else 0,
            config=c.to_json())


class JointGates(FrozenGates):
    """The joint recipe (Voita's setup, gates_joint.py): the run is gates_joint.JointRun (the model's `params`
    train with the gates, against a frozen copy); from hard_from on, a step's gates are the fixed ones (the heads
    kept open, the others closed) and only the weights train."""

    def __init__(self, model, config: GateConfig, heads_to_keep, fraction, calibration):
        super().__init__(model, config, heads_to_keep, fraction, calibration)
        from headcount.surgery.healing.loop import default_lr  # healing's: scaled down for a decoder's small weights

        self.weight_lr = default_lr(model, config.params) if config.weight_lr is None else config.weight_lr
        self.weight_lr = arguments.positive_float("weight_lr", self.weight_lr, expected="a positive number")

    def make_run(self):
        from headcount.surgery.pruning.gates_joint import JointRun

        c = self.config
        return JointRun(self.model, params=c.params, weight_lr=self.weight_lr, steps=c.steps,
                        calibration=self.calibration, window=c.window, batch_size=c.batch_size)

    def gates(self, step: int, rows: int) -> Tensor:
        if step < self.hard_from:
            return super().gates(step, rows)
        if self.fixed is None:  # the last phase begins: the kept heads open, the others closed, the gates fixed
            chosen_now = _choose(self.log_alpha.detach().cpu(), self.offsets, self.keep)
            self.fixed = torch.zeros(self.n_gates, device=self.device)
            self.fixed[sorted(chosen_now)] = 1.0
        return self.fixed.expand(rows, self.n_gates)


def _split(det: Tensor, offsets: list[int], units) -> list[Tensor]:
    return [det[offsets[l]:offsets[l + 1]].index_select(0, units[l][2]) for l in range(len(units))]


def _choose(scores: Tensor, offsets: list[int], keep: int) -> set[int]:
    """The `keep` gates with the highest scores, at least one per layer (each layer's best goes first);
    ties broken by position."""
    chosen = {offsets[l] + int(torch.argmax(scores[offsets[l]:offsets[l + 1]])) for l in range(len(offsets) - 1)}
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    for i in order:
        if len(chosen) >= keep:
            break
        chosen.add(i)
    return chosen


# ---------------------------------------------------------------------------------- removal on top
def _fold(model, gates: GateResult) -> None:
    """Scale each kept head's columns of o_proj by its deterministic gate (the gated model, exactly)."""
    for l, layer in enumerate(model.layers):
        attn = layer.attn
        dh = attn.head_dim
        with torch.no_grad():
            for j, value in enumerate(gates.gates[l]):
                if value != 1.0:
                    attn.o_proj.weight[:, j * dh:(j + 1) * dh] *= value


def apply_gates(model, gates: GateResult, *, compensate: str | None = None, calibration=None, force: bool = False,
                progress: bool = True, **kwargs):
    """Remove the heads `gates` did not keep from `model`, in place, with headcount.surgery.prune (mode =
    the gates' mode) -> PruneResult with method "l0".

    compensate "none" / "mean": the kept heads' deterministic gates are first folded into o_proj's columns,
    so with "none" the pruned model IS the gated model at its deterministic gates (removed heads at 0).
    "lstsq": nothing is folded; the refit of o_proj on the kept heads reproduces the unmodified model's
    attention outputs (it absorbs any scale a gate had). force=False refuses (ValueError naming `steps`)
    gates whose expected L0 ended more than 10% of the gates away from the target. Other keywords go to prune.
    compensate None: "lstsq" for frozen gates, "none" for joint ones (the only choice there: `model` must be the
    model trained with them, whose weights already compensate; gates_joint.py says why).
    """
    from headcount.surgery.pruning.removal import prune

    if not isinstance(gates, GateResult):
        raise TypeError(f"gates: expected a GateResult from train_gates, got {type(gates).__name__}")
    layout = [list(k) for k, _ in _plan.layout(model)]
    if layout != gates.layout:
        raise ValueError("gates: trained on a model with other heads (layouts differ); train them on this model")
    if compensate is None:
        compensate = "none" if gates.joint else "lstsq"
    if gates.joint and compensate != "none":
        raise ValueError(f"compensate: gates trained jointly with the model are applied to that trained model as "
                         f"they are (compensate 'none'; its weights already compensate), got {compensate!r}")
    if not gates.reached and not force:
        unit = "query heads" if gates.mode == "query" else "KV groups"
        raise ValueError(f"steps: the L0 target is unreachable in the steps given: after {gates.steps} steps the "
                         f"expected number of open gates is {gates.final_expected_l0:.1f}, "
                         f"target {gates.heads_to_keep} "
                         f"of {gates.n_gates} {unit} (more than {REACH_TOLERANCE:.0%} off); give more steps or a "
                         "larger lr, or force to prune by the gates' ranking anyway")
    if compensate in ("none", "mean"):
        _plan.check_mode(gates.mode)
        _plan.normalize_heads(model, gates.removed)  # checked before the fold writes anything
        _fold(model, gates)
    result = prune(model, gates.removed, mode=gates.mode, compensate=compensate, calibration=calibration,
                   progress=progress, **kwargs)
    result.method, result.order, result.gates = "l0", "l0 gates", gates
    if gates.fraction is not None:
        result.fraction = gates.fraction
    return result


def prune_l0(model, *, fraction: float | None = None, heads_to_keep: int | None = None, steps: int, lr: float = 0.1,
             calibration=None, mode: str = "query", compensate: str | None = None, force: bool = False,
             progress: bool = True, joint: bool = False, params: str | None = None, train_kwargs: dict | None = None,
             **prune_kwargs):
    """train_gates then apply_gates: L0-trained pruning in one call -> PruneResult (method "l0", .gates the
    GateResult). joint=True trains `params` of `model` with the gates (in place) and removes the heads with
    compensate "none" (None picks: "lstsq" frozen, "none" joint). train_kwargs go to train_gates (n_windows,
    window, batch_size, lambda_lr, warmup, init, seed, weight_lr); other keywords to prune (calibration_windows,
    ridge, ...)."""
    from headcount.surgery.pruning.compensate import COMPENSATIONS

    if compensate is None:
        compensate = "none" if joint else "lstsq"
    if compensate not in COMPENSATIONS:
        raise ValueError(f"compensate: expected one of {COMPENSATIONS}, got {compensate!r}")
    if joint and compensate != "none":
        raise ValueError(f"compensate: joint gates remove the heads from the trained model as it is ('none'), "
                         f"got {compensate!r}")
    gates = train_gates(model, heads_to_keep=heads_to_keep, fraction=fraction, steps=steps, lr=lr,
                        calibration=calibration, mode=mode, progress=progress, joint=joint, params=params,
                        **(train_kwargs or {}))
    return apply_gates(model, gates, compensate=compensate, calibration=calibration, force=force, progress=progress,
                       **prune_kwargs)
