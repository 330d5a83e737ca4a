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

import time
from dataclasses import dataclass, field

import torch

from headcount import arguments
from headcount.surgery.pruning import plan as _plan
from headcount.surgery.pruning.hard_concrete import deterministic_gates, expected_l0, open_probability, sample_gates

Tensor = torch.Tensor

MODES = ("query", "group")
N_WINDOWS = 8
WINDOW = 256
BATCH_SIZE = 2
INIT_LOG_ALPHA = 2.0  # P(open) = 0.97, deterministic gate 0.96: training starts next to the teacher
LOG_ALPHA_LIMIT = 6.0  # |log_alpha| bound: beyond it a gate saturates (see the module doc)
LAMBDA_LR = 1.0
WARMUP = 0.7
JOINT_WARMUP = 0.5  # joint: the target reached by half the steps, before the gates are fixed (JOINT_HARD)
JOINT_HARD = 0.25  # joint: the last quarter of the steps trains the weights with the gates fixed
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
def train_gates(model, *, heads_to_keep: int | None = None, fraction: float | None = None, steps: int,
                lr: float = 0.1, calibration=None, mode: str = "query", progress: bool = True,
                n_windows: int = N_WINDOWS, window: int = WINDOW, batch_size: int = BATCH_SIZE,
                lambda_lr: float = LAMBDA_LR, warmup: float | None = None, init: float = INIT_LOG_ALPHA,
                history_every: int | None = None, seed: int = 0, joint: bool = False, params: str | None = None,
                weight_lr: float | None = None, hard: float | None = None) -> GateResult:
    """Train a hard-concrete gate per head (or per GQA group) of the frozen `model`; see the module doc.
    joint=True (Voita's setup, gates_joint.py): `params` ("attention", the default, or "all") of `model` train
    WITH the gates (AdamW, lr `weight_lr`, None = healing's default_lr, and its schedule), IN PLACE, against a
    frozen copy of the unedited model, on distinct calibration windows (steps x batch_size, up to healing's 98k
    tokens; n_windows is the frozen variant's); for the last `hard` share of the steps the gates are fixed at
    the heads kept (1) and removed (0) and only the weights train, so apply_gates' removal is exactly the model
    trained last.

    heads_to_keep / fraction: exactly one; fraction is the share of gates to REMOVE, in (0, 1). In group mode
    both count KV groups (as prune_to's group mode does). steps: optimizer steps, one calibration batch
    each (cycled). lr: Adam's on log_alpha; lambda_lr: Adam's (ascent) on the multipliers.
    n_windows / window / batch_size: the calibration (decoders: windows of tokens; encoders: up to
    32 * n_windows sentences in batches of 32). warmup: the share of steps over which the target warms up.
    (None: WARMUP frozen, JOINT_WARMUP joint). init: log_alpha at the start. Without joint, no weight of
    `model` changes.
    """
    from tqdm.auto import tqdm

    from headcount.analysis.batches import is_decoder
    from headcount.surgery.pruning import gates_joint as _joint
    from headcount.surgery.pruning.gates_frozen import FrozenRun
    from headcount.training.optimizer import Optimizer

    _plan.check_mode(mode)
    steps = arguments.positive_int("steps", steps, expected="an int >= 1")
    lr = arguments.positive_float("lr", lr, expected="a positive number")
    lambda_lr = arguments.positive_float("lambda_lr", lambda_lr, expected="a positive number")
    if warmup is None:
        warmup = JOINT_WARMUP if joint else WARMUP
    if hard is None:
        hard = JOINT_HARD if joint else 0.0
    hard = arguments.fraction("hard", hard, include_low=True, expected="a share of the steps in [0, 1)")
    if hard and not joint:
        raise ValueError(f"hard: only with joint=True (fixed gates train nothing on a frozen model), got {hard!r}")
    warmup = arguments.fraction("warmup", warmup, include_low=True, include_high=True,
                                expected="a share of the steps in [0, 1]")
    history_every = max(1, steps // 20) if history_every is None else \
        arguments.positive_int("history_every", history_every, expected="an int >= 1")
    arguments.boolean("joint", joint, expected="True or False")
    if joint:
        params = _joint.check_params(_joint.DEFAULT_PARAMS if params is None else params)
        from headcount.surgery.healing.loop import default_lr  # healing's: scaled down for a decoder's small weights
        weight_lr = default_lr(model, params) if weight_lr is None else weight_lr
        weight_lr = arguments.positive_float("weight_lr", weight_lr, expected="a positive number")
    elif params is not None or weight_lr is not None:
        raise ValueError(f"{'params' if params is not None else 'weight_lr'}: only with joint=True (the frozen "
                         "variant trains no weight)")
    units = _units(model, mode)
    n_gates = sum(u[0] for u in units)
    unit = "query heads" if mode == "query" else "KV groups"
    keep = resolve_target(n_gates, len(units), heads_to_keep, fraction, unit=unit)
    decoder = is_decoder(model)
    from headcount.surgery.pruning.removal import resolve_default

    calibration = resolve_default(model, calibration)
    device = model.embed.weight.device

    start = time.perf_counter()
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    log_alpha = torch.full((n_gates,), float(init), device=device, requires_grad=True)
    lambdas = torch.zeros(2, device=device, requires_grad=True)
    # Adam on the gates, Adam ascent on the multipliers (the module doc says why these betas), constant lrs
    opt = Optimizer([log_alpha], lr=lr, betas=(0.5, 0.99), clip=None)
    opt_lambda = Optimizer([lambdas], lr=lambda_lr, betas=(0.0, 0.99), maximize=True, clip=None)
    offsets = [0]
    for n, _, _ in units:
        offsets.append(offsets[-1] + n)
    indices = [idx.to(device) for _, _, idx in units]
    gen = torch.Generator(device=device).manual_seed(seed)
    density0 = float(open_probability(log_alpha.detach()).mean())
    density_target = keep / n_gates
    n_warm = round(warmup * steps)
    hard_from = steps - round(hard * steps)  # from this step on: gates fixed at the heads kept (joint only)
    fixed = None  # the fixed gates [n_gates]: 1 kept, 0 removed
    expected, targets, losses, history = [], [], [], []
    dtype = model.embed.weight.dtype

    def per_layer(values: Tensor) -> list[Tensor]:
        """gate values [..., n_gates] -> one [..., n_heads] tensor per layer."""
        return [values[..., offsets[l]:offsets[l + 1]].index_select(-1, indices[l]) for l in range(len(units))]

    def snapshot() -> list[list[float]]:
        with torch.no_grad():
            return [g.tolist() for g in per_layer(deterministic_gates(log_alpha))]

    run = None
    bar = tqdm(total=steps, desc=f"gates ({mode})", disable=None if progress else True, leave=False)
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
        # joint: the teacher (the unedited weights, frozen) copied before the first step
        run = _joint.JointRun(model, params=params, weight_lr=weight_lr, steps=steps, calibration=calibration,
                              window=window, batch_size=batch_size) if joint else \
            FrozenRun(model, calibration=calibration, n_windows=n_windows, window=window, batch_size=batch_size)
        for step in range(steps):
            rows = run.batch_rows(step)
            if step >= hard_from:  # joint's last phase: the kept heads open, the others closed, the gates fixed
                if fixed is None:
                    chosen_now = _choose(log_alpha.detach().cpu(), offsets, keep)
                    fixed = torch.zeros(n_gates, device=device)
                    fixed[sorted(chosen_now)] = 1.0
                z = fixed.expand(rows, n_gates)
            else:
                z = sample_gates(log_alpha.expand(rows, n_gates), generator=gen)  # [B, n_gates]: one draw each
            head_gates = [g.to(dtype) for g in per_layer(z)]
            distill = run.loss(step, head_gates)[0]
            t = density_target if step >= n_warm else density0 + (density_target - density0) * (step + 1) / n_warm
            if fixed is None:
                gap = open_probability(log_alpha).mean() - t
                lagrangian = lambdas[0] * gap + lambdas[1] * gap * gap
                (distill + lagrangian).backward()
                opt.step()
                opt_lambda.step()
            else:
                distill.backward()
            run.step()  # the weights' step (joint); nothing for frozen gates
            with torch.no_grad():
                log_alpha.clamp_(-LOG_ALPHA_LIMIT, LOG_ALPHA_LIMIT)
                expected.append(float(expected_l0(log_alpha)))
            targets.append(t * n_gates)
            losses.append(float(distill.detach()))
            if (step + 1) % history_every == 0 or step + 1 == steps:
                history.append({"step": step + 1, "gates": snapshot()})
            bar.set_postfix(loss=f"{losses[-1]:.4f}", l0=f"{expected[-1]:.1f}/{keep}")
            bar.update(1)
    finally:
        bar.close()
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)
        if run is not None:
            run.close()

    # student forward + backward (3 forwards) on every token seen, plus the teacher's forwards: every batch for
    # frozen gates and an encoder's joint run, once per distinct window for a decoder's joint run (cached)
    forward_equivalents = (3.0 * run.tokens_seen + run.teacher_tokens) / max(run.calibration_tokens, 1)
    with torch.no_grad():
        la = log_alpha.detach().cpu()
        det = deterministic_gates(la)
    chosen = _choose(la, offsets, keep) if fixed is None else set(torch.nonzero(fixed.cpu()).flatten().tolist())
    kept, removed = {}, {}
    n_forced = len(chosen - set(torch.topk(la, keep).indices.tolist()))
    for l, (n, members, _) in enumerate(units):
        for j in range(n):
            (kept if offsets[l] + j in chosen else removed).setdefault(l, []).extend(members[j])
    closed = det == 0
    n_removed_closed = sum(1 for i in range(n_gates) if i not in chosen and bool(closed[i]))
    result = GateResult(
        mode=mode, n_gates=n_gates, heads_to_keep=keep, fraction=None if fraction is None else float(fraction),
        steps=steps, lr=lr, layout=[list(k) for k, _ in _plan.layout(model)],
        gates=[g.tolist() for g in _split(det if fixed is None else fixed.cpu(), offsets, units)],
        log_alpha=[la[offsets[l]:offsets[l + 1]].tolist() for l in range(len(units))],
        kept={l: sorted(v) for l, v in sorted(kept.items())},
        removed={l: sorted(v) for l, v in sorted(removed.items())},
        expected_l0=expected, target_l0=targets, loss=losses, history=history,
        lambdas=tuple(float(v) for v in lambdas.detach().cpu()), n_closed=int(closed.sum()),
        n_removed_closed=n_removed_closed, n_removed_ranked=n_gates - keep - n_removed_closed,
        n_kept_closed=sum(1 for i in chosen if bool(closed[i])), n_forced=n_forced,
        calibration_tokens=run.calibration_tokens, forward_equivalents=forward_equivalents,
        seconds=time.perf_counter() - start,
        objective="KL(teacher || gated) of next-token distributions" if decoder else
        "1 - cos of mean-pooled sentence embeddings (gated vs unmodified)",
        joint=joint, params=params, weight_lr=weight_lr, trained_params=sum(p.numel() for p in run.trained),
        hard_steps=steps - hard_from if joint else 0)
    return result


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
