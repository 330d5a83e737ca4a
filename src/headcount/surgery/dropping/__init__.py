"""Dropping whole attention sublayers: which layers (choose.py: drop_order, by the similarity of each attention's
input and output, or by the calibration loss of dropping it alone), the edit (drop.py: drop_attention), and
`headcount drop-attention` (cli.py). The model side of an attention-free layer is models/dropped.py."""

from __future__ import annotations

from headcount import lazy

__getattr__, __dir__, __all__ = lazy.exports(__name__, {
    "drop_order": "headcount.surgery.dropping.choose", "DropOrder": "headcount.surgery.dropping.choose",
    "drop_attention": "headcount.surgery.dropping.drop", "DropResult": "headcount.surgery.dropping.drop",
})
