"""merge_kv's defaults, which are `headcount merge-kv`'s (one truth; merge_kv(model, 1) is
`headcount merge-kv --kv-heads 1`). No torch import: the command reads them for its --help.

Chosen on validation windows of the calibration text by benchmarks/merge_defaults.py (docs/merging.md has its
table; the aim: <= 3 minutes for every layer of smollm2 to MQA on 2 cores): the per-layer merge with LOCAL_STEPS
of block-wise reconstruction per layer, then a short distillation from the unmerged model on the same calibration
windows (UPTRAIN_STEPS), which corrects what the layers' errors do together.
"""

from __future__ import annotations

CALIBRATION_WINDOWS = 16  # calibration windows of 512 tokens ("mixed": half prose, half code-like text)
LOCAL_STEPS = 60  # Adam steps per merged layer reproducing its own output (aware only)
UPTRAIN_STEPS = 20  # uptrain_steps=None: this many for an aware merge of a decoder, 0 otherwise
UPTRAIN_LR = 3e-4
UPTRAIN_WINDOW = 256  # the uptrain's windows: the calibration windows cut into pieces of this many tokens


def uptrain_windows(windows, width: int = UPTRAIN_WINDOW):
    """The calibration windows [N, T] cut into [N * T / width, width] pieces for the uptrain (unchanged when T
    is not a multiple of width or is at most width)."""
    n, t = windows.shape
    return windows.reshape(n * t // width, width) if t > width and t % width == 0 else windows
