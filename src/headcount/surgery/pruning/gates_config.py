"""GateConfig: the L0 gates' training settings as one frozen object, checked once, recorded whole in GateResult.

    train_gates(model, GateConfig(steps=150, lr=0.1), fraction=0.2)        the object
    train_gates(model, steps=150, lr=0.1, fraction=0.2)                    the keyword form: the same object built

The target (heads_to_keep or fraction) is what to reach, not how: it stays train_gates' own argument, as the
calibration and the progress bar. The defaults are the constants below, which `headcount prune --method l0`
shows in its --help (one truth: the command imports them from here). No torch import. gates.py's module doc says
why each value is what it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from headcount import arguments

L0_STEPS = 150  # the frozen gates' default steps: ~15 minutes for smollm2 on 2 cores (windows of 256, batches of 2)
JOINT_STEPS = 200  # joint=True's default steps: healing's budget (200 steps of 2 distinct windows)
L0_LR = 0.1
N_WINDOWS = 8
WINDOW = 256
BATCH_SIZE = 2
INIT_LOG_ALPHA = 2.0  # P(open) = 0.97, deterministic gate 0.96: training starts next to the teacher
LAMBDA_LR = 1.0
WARMUP = 0.7
JOINT_WARMUP = 0.5  # joint: the target reached by half the steps, before the gates are fixed (JOINT_HARD)
JOINT_HARD = 0.25  # joint: the last quarter of the steps trains the weights with the gates fixed
JOINT_PARAMS = ("attention", "all")
DEFAULT_JOINT_PARAMS = "attention"  # healing's default (the same choice); the teacher shares everything else


@dataclass(frozen=True)
class GateConfig:
    """How the gates train. steps: optimizer steps, one calibration batch each (None: L0_STEPS, or JOINT_STEPS
    with joint); lr: Adam's on log_alpha; mode: "query" (a gate per query head) or "group" (per GQA group);
    n_windows / window / batch_size: the calibration (decoders: windows of tokens; encoders: up to
    32 * n_windows sentences in batches of 32); lambda_lr: Adam's (ascent) on the Lagrangian's multipliers;
    warmup: the share of steps over which the target warms up (None: WARMUP, or JOINT_WARMUP with joint); init:
    log_alpha at the start; history_every: steps between recorded snapshots of the gates (None: steps // 20);
    joint: the model's `params` ("attention" or "all") train WITH the gates at `weight_lr` (None: healing's
    default_lr for the model), the last `hard` share of the steps (None: JOINT_HARD) with the gates fixed."""

    steps: Optional[int] = None
    lr: float = L0_LR
    mode: str = "query"
    n_windows: int = N_WINDOWS
    window: int = WINDOW
    batch_size: int = BATCH_SIZE
    lambda_lr: float = LAMBDA_LR
    warmup: Optional[float] = None
    init: float = INIT_LOG_ALPHA
    history_every: Optional[int] = None
    seed: int = 0
    joint: bool = False
    params: Optional[str] = None
    weight_lr: Optional[float] = None
    hard: Optional[float] = None

    def __post_init__(self):
        from headcount.surgery.pruning.plan import check_mode

        set_ = object.__setattr__  # frozen: the checked values, their defaults resolved, stored once here
        check_mode(self.mode)
        arguments.boolean("joint", self.joint, expected="True or False")
        steps = (JOINT_STEPS if self.joint else L0_STEPS) if self.steps is None else self.steps
        set_(self, "steps", arguments.positive_int("steps", steps, expected="an int >= 1"))
        set_(self, "lr", arguments.positive_float("lr", self.lr, expected="a positive number"))
        set_(self, "lambda_lr", arguments.positive_float("lambda_lr", self.lambda_lr, expected="a positive number"))
        hard = (JOINT_HARD if self.joint else 0.0) if self.hard is None else self.hard
        set_(self, "hard", arguments.fraction("hard", hard, include_low=True,
                                              expected="a share of the steps in [0, 1)"))
        if self.hard and not self.joint:
            raise ValueError(f"hard: only with joint=True (fixed gates train nothing on a frozen model), got "
                             f"{self.hard!r}")
        warmup = (JOINT_WARMUP if self.joint else WARMUP) if self.warmup is None else self.warmup
        set_(self, "warmup", arguments.fraction("warmup", warmup, include_low=True, include_high=True,
                                                expected="a share of the steps in [0, 1]"))
        set_(self, "history_every", max(1, self.steps // 20) if self.history_every is None else
             arguments.positive_int("history_every", self.history_every, expected="an int >= 1"))
        self._check_joint()

    def _check_joint(self) -> None:
        if self.joint:
            params = DEFAULT_JOINT_PARAMS if self.params is None else self.params
            arguments.one_of("params", params, JOINT_PARAMS, expected=f"one of {', '.join(JOINT_PARAMS)} (the "
                                                                      "weights trained with the gates)")
            object.__setattr__(self, "params", params)
            arguments.positive_float("weight_lr", self.weight_lr, expected="a positive number", none=True)
        elif self.params is not None or self.weight_lr is not None:
            raise ValueError(f"{'params' if self.params is not None else 'weight_lr'}: only with joint=True (the "
                             "frozen variant trains no weight)")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_keywords(cls, config: "GateConfig | None", settings: dict) -> "GateConfig":
        """The config of a train_gates() call: `config`, or one built from the keyword form's settings (not both)."""
        if config is not None and settings:
            raise ValueError(f"config: give a GateConfig or its settings as keywords, not both (got "
                             f"{', '.join(sorted(settings))} beside it)")
        if config is not None and not isinstance(config, cls):
            raise ValueError(f"config: expected a GateConfig, got {type(config).__name__}")
        return config if config is not None else cls(**settings)
