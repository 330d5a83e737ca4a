"""merge_kv's defaults, which are `headcount merge-kv`'s (one truth; merge_kv(model, 1) is
`headcount merge-kv --kv-heads 1`). No torch import: the command reads them for its --help.

Chosen on validation windows of the calibration text by benchmarks/merge_defaults.py (docs/merging.md has its
table; the aim: <= 3 minutes for every layer of smollm2 to MQA on 2 cores): the per-layer merge with LOCAL_STEPS
of block-wise reconstruction per layer, then a short distillation from the unmerged model on the same calibration
windows (UPTRAIN_STEPS), which corrects what the layers' errors do together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Union

from headcount.arguments import fraction, positive_float, positive_int

CALIBRATION_WINDOWS = 16  # calibration windows of 512 tokens ("mixed": half prose, half code-like text)
LOCAL_STEPS = 60  # Adam steps per merged layer reproducing its own output (aware only)
UPTRAIN_STEPS = 20  # uptrain_steps=None: this many for an aware merge of a decoder, 0 otherwise
UPTRAIN_LR = 3e-4
UPTRAIN_WINDOW = 256  # the uptrain's windows: the calibration windows cut into pieces of this many tokens
TRAINABLE = ("attention", "qkv", "o_proj", "all")  # the uptrain's named choices of weights


def uptrain_windows(windows, width: int = UPTRAIN_WINDOW):
    """The calibration windows [N, T] cut into [N * T / width, width] pieces for the uptrain (unchanged when T
    is not a multiple of width or is at most width)."""
    n, t = windows.shape
    return windows.reshape(n * t // width, width) if t > width and t % width == 0 else windows


@dataclass(frozen=True)
class UptrainConfig:
    """The uptrain's settings (surgery.merging.uptrain), checked once, recorded whole in UptrainResult.config.

        uptrain(model, UptrainConfig(steps=20, lr=3e-4), teacher=unmerged, calibration=windows)
        uptrain(model, 20, lr=3e-4, teacher=unmerged, ...)     the keyword form: the same config built from them

    steps: optimizer steps; lr: the peak learning rate (warm-up then cosine to 0); trainable: "attention"
    (qkv_proj and o_proj of every layer), "qkv", "o_proj", "all", or a tuple of layer indices (those layers'
    attention); batch_size: windows (or sentence batches) a step; window: the decoder's calibration window;
    warmup: the share of steps warming up; max_windows: the calibration windows drawn (None: all); max_seconds:
    a wall-clock budget (the run shortened to fit after its first timed steps). The defaults are uptrain's own;
    merge_kv passes UPTRAIN_STEPS and its lr (UPTRAIN_LR, scaled to the model's weights)."""

    steps: int
    lr: float = 1e-4
    trainable: Union[str, tuple] = "attention"
    batch_size: int = 1
    window: int = 256
    weight_decay: float = 0.0
    warmup: float = 0.1
    seed: int = 0
    max_windows: Optional[int] = None
    max_seconds: Optional[float] = None

    def __post_init__(self):
        positive_int("steps", self.steps)
        object.__setattr__(self, "lr", positive_float("lr", self.lr))
        positive_int("batch_size", self.batch_size)
        positive_int("window", self.window, 2)
        fraction("warmup", self.warmup, include_low=True, expected="a fraction of the steps in [0, 1)")
        positive_int("max_windows", self.max_windows, none=True)
        positive_float("max_seconds", self.max_seconds, none=True,
                       expected="a positive number of seconds or None")
        if isinstance(self.trainable, str) and self.trainable not in TRAINABLE:
            raise ValueError(f"trainable: expected one of {TRAINABLE} or a list of layer indices, "
                             f"got {self.trainable!r}")
        if not isinstance(self.trainable, str):  # layer indices: a tuple (the config is frozen, and hashable)
            try:
                object.__setattr__(self, "trainable", tuple(self.trainable))
            except TypeError:
                raise TypeError(f"trainable: expected one of {', '.join(TRAINABLE)} or a list of layer indices, "
                                f"got {self.trainable!r}") from None

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
