"""A frontier's point: one edit of the unedited model, or several applied in the order given.

    parse_point("prune:0.2")               Point("prune:0.2", (Step("prune", 0.2),))
    parse_point("drop:0.25+merge:0.9")     drop a quarter of the attention layers, then keep 90% of the KV bytes
    parse_point("merge:12KiB")             merge to at most 12 KiB of KV cache per token

prune:F   F of the query heads removed (`headcount prune --fraction F`'s edit), F in (0, 1)
merge:B   K/V heads merged by merge_plan to keep B of the model's KV bytes per token as it stands at that step
          (B in (0, 1) or bytes per token: 12288, 12KiB; surgery.merging.planner.parse_budget)
drop:F    F of the attention sublayers removed whole (surgery.dropping), F in (0, 1)
kv:B      the KV budget B (as merge's) met by the cheapest mix of K/V merges and whole attention sublayers dropped
          (merge_plan(drops=True): each layer's cost of a merge and of a drop measured alike, one knapsack)
Pure Python: the command parses every --point before a model is loaded; whether the model can reach a merge
budget is checked once it is (run.check_points).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EDITS = ("prune", "merge", "drop", "kv")  # kv: merge_plan(drops=True)
UNEDITED = "unedited"
DEFAULT_POINTS = ("prune:0.1", "prune:0.2", "prune:0.3", "merge:0.9", "merge:0.75", "merge:0.5",
                  "drop:0.1", "drop:0.25", "drop:0.5")
_EXPECTED = ("EDIT:AMOUNT joined by + (prune:0.2, merge:0.75, merge:12KiB, drop:0.25, kv:0.75, "
             "drop:0.25+merge:0.9)")


@dataclass(frozen=True)
class Step:
    edit: str  # one of EDITS
    amount: float | int  # prune / drop: a fraction; merge / kv: a fraction (float) or bytes per token (int)
    text: str  # as given: "merge:0.75"


@dataclass(frozen=True)
class Point:
    text: str  # as given, the row's `point`
    steps: tuple[Step, ...]

    @property
    def slug(self) -> str:
        """A directory name for the point (the text with anything but letters, digits, '.', '+', '-' as '_')."""
        return re.sub(r"[^A-Za-z0-9.+-]", "_", self.text)


def _step(text: str, whole: str, flag: str) -> Step:
    edit, sep, amount = text.partition(":")
    edit = edit.strip().lower()
    if not sep or edit not in EDITS:
        raise ValueError(f"{flag}: expected {_EXPECTED}; {edit or text!r} is not one of {', '.join(EDITS)} "
                         f"(in {whole!r})")
    amount = amount.strip()
    if edit in ("merge", "kv"):
        from headcount.surgery.merging.planner import parse_budget

        value = parse_budget(amount, flag=f"{flag} {whole}")
        if isinstance(value, float) and not value < 1:
            raise ValueError(f"{flag}: expected {edit}:B with B a fraction in (0, 1) of the KV bytes to keep or bytes "
                             f"per token, got {text!r} (in {whole!r})")
        return Step(edit, value, f"{edit}:{amount}")
    try:
        value = float(amount)
    except ValueError:
        raise ValueError(f"{flag}: expected {edit}:F with F a fraction in (0, 1), got {text!r} "
                         f"(in {whole!r})") from None
    if not 0 < value < 1:
        raise ValueError(f"{flag}: expected {edit}:F with F a fraction in (0, 1), got {text!r} (in {whole!r})")
    return Step(edit, value, f"{edit}:{amount}")


def parse_point(text, flag: str = "--point") -> Point:
    """A point's text -> Point; bad text: ValueError naming `flag`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{flag}: expected {_EXPECTED}, got {text!r}")
    text = text.strip()
    if text == UNEDITED:
        raise ValueError(f"{flag}: the unedited model is always measured (its row is `unedited`); expected an edit")
    steps = tuple(_step(part.strip(), text, flag) for part in text.split("+"))
    return Point(text, steps)


def parse_points(values, flag: str = "--point") -> list[Point]:
    """--point's values (none: DEFAULT_POINTS), each parsed; the same point twice is refused."""
    points = [parse_point(v, flag) for v in (values or DEFAULT_POINTS)]
    seen: dict[str, str] = {}
    for p in points:
        if p.slug in seen:
            raise ValueError(f"{flag}: {p.text!r} is given twice" + (f" (as {seen[p.slug]!r})"
                                                                      if seen[p.slug] != p.text else ""))
        seen[p.slug] = p.text
    return points
