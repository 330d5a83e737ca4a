"""One to_json / from_json for every section of report.json (sections.py declares them as dataclasses).

    @dataclass
    class Rank(Section):
        summary: list[RankRow] = field(default_factory=list)
        tolerance: Any = None
    Rank.from_json({"summary": [...], "tolerance": 1e-5, "heads": [...]}).to_json()   the same keys back

A field's annotation says how its JSON is read: a Section subclass (an object), list[S] (an array of them),
dict[str, S] (an object of them), `X | None` (null allowed); anything else is the JSON value as it is. Keys a
class does not name are kept in `more`, untouched: the page reads keys no claim needs; a declared key the JSON did
not have is left out again on the way back, so reading and writing a section gives the same JSON. A field without a
default is required; a missing one, or an object where an array belongs, is a ValueError naming the section and key.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field


@dataclass
class Section:
    more: dict = field(default_factory=dict, kw_only=True)  # the keys this class does not name, as they were
    absent: frozenset = field(default=frozenset(), kw_only=True, compare=False, repr=False)  # declared, not in the JSON

    @classmethod
    def from_json(cls, data, where: str | None = None):
        """The section read from its JSON object (an instance of cls is returned as it is)."""
        where = where or cls.__name__
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"report.json {where}: expected an object, got {type(data).__name__}")
        hints, names = _fields(cls)
        for f in dataclasses.fields(cls):
            if f.name in names and f.name not in data and f.default is dataclasses.MISSING \
                    and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"report.json {where}: expected the key {f.name!r}, got keys {sorted(data)}")
        known = {k: _load(hints[k], v, f"{where}.{k}") for k, v in data.items() if k in names}
        return cls(**known, more={k: v for k, v in data.items() if k not in names},
                   absent=frozenset(n for n in names if n not in data))

    def to_json(self) -> dict:
        names = _fields(type(self))[1]
        return {name: _dump(getattr(self, name)) for name in names if name not in self.absent} | self.more


@functools.cache
def _fields(cls) -> tuple[dict, tuple[str, ...]]:
    hints = typing.get_type_hints(cls)
    return hints, tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("more", "absent"))


def _is_section(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


def _load(tp, value, where: str):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        rest = [a for a in args if a is not type(None)]
        return _load(rest[0], value, where) if len(rest) == 1 else value
    if _is_section(tp):
        return tp.from_json(value, where)
    if origin is list and args and _is_section(args[0]):
        if not isinstance(value, list):
            raise ValueError(f"report.json {where}: expected an array, got {type(value).__name__}")
        return [args[0].from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and len(args) == 2 and _is_section(args[1]):
        if not isinstance(value, dict):
            raise ValueError(f"report.json {where}: expected an object, got {type(value).__name__}")
        return {k: args[1].from_json(v, f"{where}.{k}") for k, v in value.items()}
    return value


def _dump(value):
    if isinstance(value, Section):
        return value.to_json()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value
