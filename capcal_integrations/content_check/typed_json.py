"""A dataclass's fields from JSON, each checked against its type annotation: a saved content decision is
data from disk, and ``"reads": "false"`` (a string, truthy) must not be read as true. Pure.

>>> from dataclasses import dataclass
>>> @dataclass
... class D:
...     on: bool
...     n: int
...     x: float | None = None
...     pair: tuple[float, float] = (0.0, 0.0)
>>> fields_of(D, {"on": True, "n": 3, "pair": [1, 2.5]}, "d")
{'on': True, 'n': 3, 'pair': (1.0, 2.5)}
>>> fields_of(D, {"on": "false", "n": 3}, "d")
Traceback (most recent call last):
...
capcal_integrations.errors.InputError: d: 'on' must be true or false, got 'false'
>>> fields_of(D, {"on": True, "n": -5}, "d")
Traceback (most recent call last):
...
capcal_integrations.errors.InputError: d: 'n' must be an integer >= 0, got -5
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InputError

__all__ = ["fields_of", "typed"]


def fields_of(cls: type, values: Mapping[str, Any], what: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``values`` as the keyword arguments of dataclass ``cls``: every key one of its fields (``skip``: fields the
    JSON never holds), every field without a default present, each value checked and converted by :func:`typed`
    against the field's annotation; an :class:`~.errors.InputError` naming ``what`` and the field otherwise."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in skip}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise InputError(f"{what}: unknown field(s) {', '.join(map(repr, unknown))}")
    missing = [name for name, f in fields.items() if name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise InputError(f"{what}: missing field(s) {', '.join(map(repr, missing))}")
    return {name: typed(value, hints[name], f"{what}: {name!r}") for name, value in values.items()}


#: The scalar annotations a saved file may hold: what fits each, and how an error names it.
_SCALARS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    type(None): (lambda v: v is None, "null"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v), "a number"),
    str: (lambda v: isinstance(v, str), "text"),
}


def typed(value: Any, hint: Any, where: str) -> Any:
    """``value`` (as JSON gives it) checked against ``hint`` (``bool``, ``int`` >= 0, ``float`` not NaN, ``str``,
    ``None``, unions, ``tuple[X, ...]`` and fixed tuples from JSON arrays) and converted (ints to floats, arrays
    to tuples)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return typed(value, option, where)
            except InputError:
                pass
        raise InputError(f"{where} must be {' or '.join(_name(a) for a in args)}, got {value!r}")
    if hint in _SCALARS:
        fits, said = _SCALARS[hint]
        if fits(value):
            return float(value) if hint is float else value
        raise InputError(f"{where} must be {said}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise InputError(f"{where} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(typed(v, args[0], f"{where}[{k}]") for k, v in enumerate(value))
        if len(value) != len(args):
            raise InputError(f"{where} must be a list of {len(args)}, got {value!r}")
        return tuple(typed(v, a, f"{where}[{k}]") for k, (v, a) in enumerate(zip(value, args)))
    raise InputError(f"{where}: cannot check a value of type {_name(hint)}")  # a field type this module lacks


def _name(hint: Any) -> str:
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))
