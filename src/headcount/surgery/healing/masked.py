"""MaskedWindows: token windows with a per-token loss mask, the calibration form whose targets are some tokens only.

    MaskedWindows(ids [N, T] long, mask [N, T] bool, name="teacher-answers")

mask[i, j] is True where token j of window i is a target: the heal's KL at position j - 1 (the distribution that
predicts token j) counts only there (step.Teacher.targets). A prompt is context, not a target; padding is neither.
A window must hold at least one target, so that its mean KL is defined. No torch import at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MaskedWindows:
    ids: Any  # LongTensor [N, T]
    mask: Any  # BoolTensor [N, T]: True where the token is a target
    name: str = "masked windows"  # what the heal's result calls this calibration

    def __post_init__(self):
        import torch

        ids, mask = self.ids, self.mask
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids: expected token windows, a LongTensor [N, T]; got "
                             f"{getattr(ids, 'dtype', type(ids).__name__)} {list(getattr(ids, 'shape', []))}")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != ids.shape:
            raise ValueError(f"mask: expected a bool tensor of the windows' shape {list(ids.shape)}, got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} {list(getattr(mask, 'shape', []))}")
        empty = (~mask[:, 1:].any(dim=1)).nonzero().flatten().tolist()  # token 0 is never predicted
        if empty:
            raise ValueError(f"mask: window {empty[0]} has no target after its first token; expected at least one "
                             "per window")

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def to_json(self) -> dict:
        return {"name": self.name, "windows": len(self), "window": int(self.ids.shape[1]),
                "targets": int(self.mask[:, 1:].sum())}
