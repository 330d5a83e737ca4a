"""Argument checks every room shares: each returns the value it accepts and refuses the rest with one message,

    "{name}: expected {expected}, got {value!r}"

so `self.n = positive_int("n", n)` checks and assigns in one line. A bool is never a number here: True would
otherwise pass as the int 1. `expected=` replaces the default wording where a caller says more (the unit, what 0
means); `error=` raises a ValueError subclass of the caller's own (cost's CostError); `type_error=TypeError`
keeps attention.py's contract, a wrong type raised apart from a wrong value, with the type's name appended.
A refused value raises ArgumentError (a ValueError that knows the argument's name), so a command shows it under
its own flag (cli_errors.renamed) without reading the message. Imports nothing, so every layer may use it.
"""

from __future__ import annotations

import math


class ArgumentError(ValueError):
    """A bad argument that knows its name: str() is "name: message". `renamed(flag)` is the same error under
    another name (the command-line flag the argument came from)."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name, self.message = name, message

    def renamed(self, name: str) -> "ArgumentError":
        return ArgumentError(name, self.message)

    def __reduce__(self):  # pickled as its two parts (a spawned worker's error reaches the parent)
        return (type(self), (self.name, self.message))


def is_int(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float that is not a bool (NaN and infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _refuse(name: str, expected: str, value, error, type_error=None):
    if type_error is not None:
        raise type_error(f"{name}: expected {expected}, got {value!r} ({type(value).__name__})")
    if error is ValueError or issubclass(error, ArgumentError):  # a room's own ArgumentError keeps the name apart
        raise (ArgumentError if error is ValueError else error)(name, f"expected {expected}, got {value!r}")
    raise error(f"{name}: expected {expected}, got {value!r}")


def positive_int(name: str, value, minimum: int = 1, *, expected: str | None = None, none: bool = False,
                 error: type[Exception] = ValueError, type_error: type[Exception] | None = None) -> int | None:
    """`value` when it is an int >= `minimum` (or None, with none=True).

    Default wording: "a positive int" (minimum 1) or "an int >= minimum", plus " or None" with none=True."""
    if value is None and none:
        return None
    if expected is None:
        expected = ("a positive int" if minimum == 1 else f"an int >= {minimum}") + (" or None" if none else "")
    if not is_int(value):
        _refuse(name, expected, value, error, type_error)
    if value < minimum:
        _refuse(name, expected, value, error)
    return value


def positive_ints(name: str, values, minimum: int = 1, *, expected: str = "positive whole numbers",
                  error: type[Exception] = ValueError) -> tuple[int, ...]:
    """`values` as a tuple when it is a non-empty sequence of ints >= `minimum`; the message shows them all."""
    items = tuple(values) if isinstance(values, (list, tuple, range)) else None
    if not items or any(not is_int(v) or v < minimum for v in items):
        _refuse(name, expected, values, error)
    return items


def positive_float(name: str, value, *, expected: str | None = None, none: bool = False, finite: bool = True,
                   error: type[Exception] = ValueError, type_error: type[Exception] | None = None) -> float | None:
    """float(`value`) when it is a number > 0 (finite unless finite=False; or None, with none=True)."""
    if value is None and none:
        return None
    if expected is None:
        expected = "a positive float" + (" or None" if none else "")
    if not is_number(value):
        _refuse(name, expected, value, error, type_error)
    if not value > 0 or (finite and not math.isfinite(value)):
        _refuse(name, expected, value, error)
    return float(value)


def fraction(name: str, value, *, include_low: bool = False, include_high: bool = False,
             expected: str | None = None, none: bool = False, error: type[Exception] = ValueError) -> float | None:
    """float(`value`) when it lies in the interval from 0 to 1, each end included only when asked (or None, with
    none=True). Default wording: "a number in (0, 1)", brackets as the ends."""
    if value is None and none:
        return None
    if expected is None:
        expected = f"a number in {'[' if include_low else '('}0, 1{']' if include_high else ')'}" + \
            (" or None" if none else "")
    if not is_number(value):
        _refuse(name, expected, value, error)
    above = value >= 0 if include_low else value > 0
    below = value <= 1 if include_high else value < 1
    if not (above and below):
        _refuse(name, expected, value, error)
    return float(value)


def one_of(name: str, value, choices, *, expected: str | None = None, error: type[Exception] = ValueError):
    """`value` when it is one of `choices`. Default wording: "one of a, b, c"."""
    try:
        known = value in choices
    except TypeError:  # an unhashable value against a set or dict of choices
        known = False
    if not known:
        _refuse(name, expected if expected is not None else "one of " + ", ".join(str(c) for c in choices),
                value, error)
    return value


def boolean(name: str, value, *, expected: str = "true or false", error: type[Exception] = ValueError) -> bool:
    """`value` when it is True or False (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        _refuse(name, expected, value, error)
    return value
