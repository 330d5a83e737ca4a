"""How the report calls the rooms below it: through their public (lazy) exports, with only the keyword
arguments a function accepts, so a step follows a function as it changes and a missing one is a clean
`unavailable` entry rather than a crash.

    fn("surgery", "prune_to") -> the function (ImportError / AttributeError while it is not there)
    call_with(fn, *args, **kwargs) -> fn(*args, **the kwargs its signature takes)
    default_of(fn, "order") -> the default of that parameter (the report follows the project's defaults)
"""

from __future__ import annotations

import inspect
from typing import Callable

MISSING = (ImportError, AttributeError, NotImplementedError)


class NotApplicable(NotImplementedError):
    """A section that does not apply to this model (e.g. faithfulness on an encoder)."""


def call_with(fn: Callable, *args, **kwargs):
    """Call fn with the keyword arguments its signature accepts (the others are dropped)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def fn(package: str, name: str):
    """headcount.<package>.<name> through the package's public (lazy) exports; raises ImportError or
    AttributeError while the function is not there yet."""
    import importlib
    import types
    obj = getattr(importlib.import_module(f"headcount.{package}"), name)
    if isinstance(obj, types.ModuleType):  # a submodule named like its function shadowed the export
        obj = getattr(obj, name)
    if not callable(obj):
        raise AttributeError(f"headcount.{package}.{name} is not a function")
    return obj



def default_of(func: Callable, name: str, fallback=None):
    """The default value of `func`'s parameter `name` (fallback when it has none or no such parameter)."""
    try:
        p = inspect.signature(func).parameters.get(name)
    except (TypeError, ValueError):
        return fallback
    if p is None or p.default is inspect.Parameter.empty:
        return fallback
    return p.default
