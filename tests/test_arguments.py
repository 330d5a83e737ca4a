"""headcount.arguments: each check accepts exactly the values its rule describes (written here again, plainly, as
the truth), returns them, and refuses the rest with "NAME: expected WHAT, got VALUE"."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headcount import arguments as args

ANY = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                st.text(max_size=3), st.lists(st.integers(0, 3), max_size=2))


def _refused(call, name, value, error=ValueError):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{name}: expected ") and message.endswith(f"got {value!r}"), message
    return message


@given(ANY, st.integers(0, 3), st.booleans())
def test_positive_int(value, minimum, none):
    ok = (value is None and none) or (type(value) is int and value >= minimum)
    call = lambda: args.positive_int("n", value, minimum, none=none)  # noqa: E731
    if ok:
        assert call() == value
    else:
        message = _refused(call, "n", value)
        wording = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        assert f"expected {wording}{' or None' if none else ''}, got" in message


@given(ANY)
def test_positive_int_type_error_names_the_type(value):
    if type(value) is int and value >= 1:
        assert args.positive_int("n", value, type_error=TypeError) == value
    elif type(value) is int:
        _refused(lambda: args.positive_int("n", value, type_error=TypeError), "n", value, ValueError)
    else:
        with pytest.raises(TypeError, match=rf"\({type(value).__name__}\)$"):
            args.positive_int("n", value, type_error=TypeError)


@given(ANY, st.booleans(), st.booleans())
def test_positive_float(value, none, finite):
    number = type(value) in (int, float)
    ok = (value is None and none) or (number and value > 0 and (math.isfinite(value) or not finite))
    call = lambda: args.positive_float("x", value, none=none, finite=finite)  # noqa: E731
    if ok:
        result = call()
        assert result is None if value is None else (type(result) is float and result == value)
    else:
        _refused(call, "x", value)


@given(ANY, st.booleans(), st.booleans())
def test_fraction(value, include_low, include_high):
    number = type(value) in (int, float)
    ok = number and (0 <= value if include_low else 0 < value) and (value <= 1 if include_high else value < 1)
    call = lambda: args.fraction("p", value, include_low=include_low, include_high=include_high)  # noqa: E731
    if ok:
        assert call() == value
    else:
        message = _refused(call, "p", value)
        assert f"{'[' if include_low else '('}0, 1{']' if include_high else ')'}" in message


@given(st.lists(ANY, max_size=4), st.integers(0, 2))
def test_positive_ints(values, minimum):
    ok = bool(values) and all(type(v) is int and v >= minimum for v in values)
    call = lambda: args.positive_ints("sizes", values, minimum)  # noqa: E731
    if ok:
        assert call() == tuple(values)
    else:
        _refused(call, "sizes", values)


@given(ANY, st.sampled_from([("a", "b"), {"a", "b"}, (0, 1, 2)]))
def test_one_of(value, choices):
    try:
        ok = value in choices
    except TypeError:
        ok = False
    if ok:
        assert args.one_of("mode", value, choices) == value
    else:
        message = _refused(lambda: args.one_of("mode", value, choices), "mode", value)
        assert all(str(c) in message for c in choices)


@given(ANY)
def test_boolean(value):
    if value is True or value is False:
        assert args.boolean("flag", value) is value
    else:
        _refused(lambda: args.boolean("flag", value), "flag", value)


def test_own_wording_and_error_class():
    class OwnError(ValueError):
        pass

    with pytest.raises(OwnError, match=r"^budget: expected a positive number of bytes, got 0$"):
        args.positive_int("budget", 0, expected="a positive number of bytes", error=OwnError)
    with pytest.raises(ValueError, match=r"^--batch: expected positive whole numbers, got \[\]$"):
        args.positive_ints("--batch", [])
