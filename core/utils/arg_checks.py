"""Checks for numeric arguments and config values, worded the same everywhere: the name, what
is allowed, and the value given."""
import numbers
import operator


def check_number(name, value):
    """A real number (not a bool, not an unresolved HF "auto" string)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_int(name, value, minimum):
    """An integer >= `minimum`; integral floats from hand-written configs are accepted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool):
        value = None
    try:
        value_int = operator.index(value)
    except TypeError:
        value_int = None
    if value_int is None or value_int < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}")
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return value_int


def check_names(name, value, error=ValueError):
    """One string or a non-empty list of strings, as a list (``"w"`` -> ``["w"]``)."""
    names = [value] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(item, str) for item in names):
        raise error(f"{name} must be a name or a non-empty list of names, got {value!r}")
    return names
