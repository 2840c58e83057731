"""Method specifications: ``"capcal:alpha=1.0,probability=trie"`` -> a method and reranker options.

Grammar: ``NAME[:ITEM[,ITEM...]]`` where ``ITEM`` is ``key=value`` or, for ``first-token``, the bare word
``capcal`` (``first-token:capcal`` is the method ``first-token-capcal``). ``bm25`` is the first-stage
order itself (no model). Values may not contain commas; ``placeholder=`` (empty) is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..options import CALIBRATED_METHODS, METHODS, OPTION_NAMES, Options

__all__ = ["MethodSpec", "parse_spec", "parse_specs", "BM25"]

BM25 = "bm25"

_KEYS = set(OPTION_NAMES) - {"method", "concurrency"}  # the method is the spec's name; concurrency is not ranking


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method: ``label`` as the user wrote it, ``key`` canonical (options sorted, numbers
    normalised) so that ``capcal:alpha=1`` and ``capcal:alpha=1.0`` share cached results."""

    label: str
    method: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        if not self.options:
            return self.method
        return self.method + ":" + ",".join(f"{k}={_show(v)}" for k, v in sorted(self.options.items()))

    @property
    def uses_model(self) -> bool:
        return self.method != BM25

    @property
    def calibrated(self) -> bool:
        return self.method in CALIBRATED_METHODS

    def reranker_options(self) -> dict[str, Any]:
        """Keyword arguments for ``CapCalReranker.with_options``."""
        return {"method": self.method, **self.options}


def _show(v: Any) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


def _value(key: str, raw: str, spec: str) -> Any:
    try:
        return Options.parse(key, raw)
    except InputError as err:
        raise InputError(f"{spec!r}: {err}") from None


def parse_spec(text: str) -> MethodSpec:
    """Parse one method spec.

    >>> parse_spec("capcal:alpha=1,probability=trie").key
    'capcal:alpha=1.0,probability=trie'
    >>> parse_spec("first-token:capcal").method, parse_spec("psc:m=5").options
    ('first-token-capcal', {'m': 5})
    >>> parse_spec("capcal:placeholder=").options
    {'placeholder': ''}
    """
    label = text.strip()
    name, _, rest = label.partition(":")
    name = name.strip().lower()
    items = [i.strip() for i in rest.split(",")] if rest else []
    if name == "first-token" and "capcal" in items:
        items.remove("capcal")
        name = "first-token-capcal"
    if name != BM25 and name not in METHODS:
        raise InputError(f"unknown method {name!r} in {label!r}; choose bm25 or one of {', '.join(METHODS)}")
    options: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise InputError(f"{label!r}: expected key=value, got {item!r}")
        if key not in _KEYS:
            raise InputError(f"{label!r}: unknown option {key!r}; known: {', '.join(sorted(_KEYS))}")
        if key in options:
            raise InputError(f"{label!r}: option {key!r} given twice")
        options[key] = _value(key, raw.strip() if key != "placeholder" else raw, label)
    if name == BM25 and options:
        raise InputError(f"{label!r}: bm25 takes no options")
    return MethodSpec(label, name, options)


def parse_specs(text: str) -> list[MethodSpec]:
    """A comma-separated list of specs: methods are separated by commas *outside* option lists,
    so ``"bm25,capcal:alpha=1.0,probability=trie,vanilla"`` is three methods: an item that is a known
    method name (or starts with one followed by ``:``) begins a new spec, anything else continues
    the previous spec's options.

    >>> [s.key for s in parse_specs("bm25,capcal:alpha=1.0,probability=trie,vanilla,first-token:capcal")]
    ['bm25', 'capcal:alpha=1.0,probability=trie', 'vanilla', 'first-token-capcal']
    """
    groups: list[str] = []
    for item in text.split(","):
        head = item.strip().partition(":")[0].strip().lower()
        if head in METHODS or head == BM25:
            groups.append(item)
        elif groups:
            groups[-1] += "," + item
        else:
            raise InputError(f"method list must start with a method name, got {item!r}")
    specs = [parse_spec(g) for g in groups if g.strip()]
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise InputError(f"a method is listed twice: {text!r}")
    return specs
