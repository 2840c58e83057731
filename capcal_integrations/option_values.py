"""Option values from strings (the command line, ``capcal eval`` specs, environment) and the checks
:class:`~.options.Options` applies to values given in Python. Pure functions."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import InputError

__all__ = ["parse_alpha", "parse_int", "parse_optional_int", "parse_optional_float", "parse_guard", "parse_bool",
           "parse_optional_str", "is_whole", "is_finite"]


def parse_alpha(raw: str) -> float | str:
    if raw in ("adaptive", "auto"):
        return raw
    try:
        return float(raw)
    except ValueError:
        raise InputError(f"alpha must be 'adaptive' or a number (or 'auto'), got {raw!r}") from None


def parse_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"expected an integer, got {raw!r}") from None


def parse_optional_int(raw: str) -> int | None:
    return None if raw.lower() in ("", "none") else parse_int(raw)


def parse_optional_float(raw: str) -> float | None:
    if raw.lower() in ("", "none", "off"):
        return None
    try:
        return float(raw)
    except ValueError:
        raise InputError(f"expected a number or none, got {raw!r}") from None


def parse_guard(raw: str) -> float | str | None:
    """A content rule's name, ``none``, or a number (the retired per-list guard; :func:`~.rules.guard_value`)."""
    try:
        return parse_optional_float(raw)
    except InputError:
        return raw


def parse_bool(raw: str) -> bool:
    if raw.lower() in ("true", "yes", "1", "on"):
        return True
    if raw.lower() in ("false", "no", "0", "off"):
        return False
    raise InputError(f"expected true or false, got {raw!r}")


def is_whole(value: Any) -> bool:
    """An integer, and not a bool (``True`` is an int in Python, not a window size).

    >>> is_whole(3), is_whole(True), is_whole(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """A finite real number, and not a bool.

    >>> is_finite(1.5), is_finite(float("inf")), is_finite(float("nan")), is_finite(False)
    (True, False, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def parse_optional_str(raw: str) -> str | None:
    return None if raw.lower() in ("", "none") else raw
