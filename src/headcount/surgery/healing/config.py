"""HealConfig: a heal's settings as one frozen object, checked once, recorded whole in the result's JSON.

    heal(model, teacher, HealConfig(steps=200, tokens=98_304))      the object
    heal(model, teacher, steps=200, tokens=98_304)                  the keyword form: the same object built from them

The defaults are the constants below, which `headcount heal` shows in its --help (one truth: the command imports
them from here). No torch import, so the command's help reads them without loading torch. What a heal needs
besides its settings stays heal()'s own arguments: the models, the calibration (texts or windows are data, not
settings), the figures already measured, the process group, the log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from headcount.arguments import ArgumentError, one_of, positive_float, positive_int

DEFAULT_PARAMS = "attention"
DEFAULT_STEPS = 200
DEFAULT_TOKENS = 98_304  # 192 windows of 512 tokens: healing is meant to cost at most 100k calibration tokens
# attention: merge-kv's uptrain rate, chosen on validation windows for the same job (benchmarks/merge_defaults.py)
DEFAULT_LR = {"attention": 3e-4, "all": 1e-4, "lora": 1e-3}
# AdamW moves every weight by about its lr a step, whatever the weight's size: DEFAULT_LR is for attention weights
# of RMS >= REFERENCE_RMS (SmolLM2's are 0.194); a model whose attention weights are smaller gets the lr scaled by
# its RMS / REFERENCE_RMS, the same relative step (default_lr): a 10x larger relative step undid the heal of a
# model with 10x smaller weights (qwen2.5-coder-0.5b's, RMS 0.019; docs/healing.md has the runs).
REFERENCE_RMS = 0.19
# one window of 512 tokens a step, the length the held-out perplexity is measured on: with 2 windows of 256 the
# student never trained at positions 256-511 (docs/healing.md, "Windows of 512", has the runs and their commands)
WINDOW = 512
BATCH_SIZE = 1  # windows per step
VALIDATION_WINDOWS = 8
EVALUATIONS = 8  # validation measurements over a run (eval_every = steps // EVALUATIONS)
PATIENCE = 3
BACKOFF = 0.5  # the lr's factor after a validation measurement with no new best (back to the best weights)
WARMUP = 0.05
EVAL_WINDOWS = 4  # held-out windows of 512 tokens per domain, as `headcount prune` measures
_COUNT = "an int >= 1"  # the wording of every count check below: "steps: expected an int >= 1, got 0"


@dataclass(frozen=True)
class HealConfig:
    """A heal's settings. steps: optimizer steps of `batch_size` windows; tokens: distinct calibration tokens
    drawn, training and validation windows together (fewer are drawn when the steps need fewer); params:
    "attention" (the edited layers' q/k/v/o and norms), "all" or "lora"; lr: the peak learning rate (None:
    DEFAULT_LR[params], scaled down for a teacher with small attention weights: loop.default_lr); batch_size
    None: BATCH_SIZE, or one window per rank under torchrun; eval_every None: steps // EVALUATIONS; held_out:
    measure the held-out domains before the edit, after it and after healing; max_seconds: after three timed
    steps the run is shortened to fit; checkpoints: steps after which the held-out domains are measured (the
    result's curve); checkpoint_layers: recompute each layer in backward (None: on for bf16 / fp16 weights of
    1 GiB or more)."""

    steps: int = DEFAULT_STEPS
    tokens: int = DEFAULT_TOKENS
    params: str = DEFAULT_PARAMS
    lr: Optional[float] = None
    window: int = WINDOW
    batch_size: Optional[int] = None
    validation_windows: int = VALIDATION_WINDOWS
    eval_every: Optional[int] = None
    patience: int = PATIENCE
    held_out: bool = True
    eval_windows: int = EVAL_WINDOWS
    max_seconds: Optional[float] = None
    seed: int = 0
    checkpoints: tuple = ()
    checkpoint_layers: Optional[bool] = None

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: the checked values are stored once, here
        set_(self, "steps", DEFAULT_STEPS if self.steps is None else positive_int("steps", self.steps,
                                                                                  expected=_COUNT))
        set_(self, "tokens", DEFAULT_TOKENS if self.tokens is None else positive_int("tokens", self.tokens,
                                                                                     expected=_COUNT))
        one_of("params", self.params, DEFAULT_LR)
        positive_float("lr", self.lr, expected="a positive learning rate", none=True)
        positive_int("window", self.window, 2)
        positive_int("batch_size", self.batch_size, expected=_COUNT, none=True)
        positive_int("validation_windows", self.validation_windows, expected=_COUNT)
        positive_int("eval_every", self.eval_every, expected=_COUNT, none=True)
        positive_int("patience", self.patience, expected=_COUNT)
        positive_int("eval_windows", self.eval_windows, expected=_COUNT)
        positive_float("max_seconds", self.max_seconds, none=True)
        set_(self, "checkpoints", tuple(sorted({positive_int("checkpoints", c, 0) for c in self.checkpoints})))

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_keywords(cls, config: "HealConfig | None", settings: dict) -> "HealConfig":
        """The config of a heal() call: `config`, or one built from the keyword form's settings (not both)."""
        if config is not None and settings:
            raise ValueError(f"config: give a HealConfig or its settings as keywords, not both (got "
                             f"{', '.join(sorted(settings))} beside it)")
        if config is not None and not isinstance(config, cls):
            raise ValueError(f"config: expected a HealConfig, got {type(config).__name__}")
        return config if config is not None else cls(**settings)


def check_budget(tokens: int, window: int, validation_windows: int) -> int:
    """The windows `tokens` holds, when they are at least the validation windows and one to train on."""
    n_budget = tokens // window
    if n_budget < validation_windows + 1:
        raise ArgumentError("tokens", f"{tokens} tokens is {n_budget} windows of {window}; expected at least "
                                      f"{validation_windows + 1} (validation_windows + one to train on)")
    return n_budget
