"""The rendered-template cache of an endpoint, bounded (see :class:`TemplateCache`, :class:`RankingTemplates`).

A rendered prompt (llama.cpp's template text with the passages' token ids, vLLM's token ids) is
reused at every decoding step of the ranking that built it; across rankings only what holds no
passage is worth keeping (a template's skeleton), plus the empty prompt of the same query ranked
again. So each ranking keeps its own prompts while it runs (:class:`RankingTemplates`, dropped with the
ranking), over one small least-recently-used cache per endpoint (:class:`TemplateCache`) where other
rankings find what they can reuse. Memory is what the rankings in flight hold, plus at most
:data:`TEMPLATE_CACHE_SIZE` entries; no past query or passage stays beyond that.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Any

__all__ = ["TEMPLATE_CACHE_SIZE", "TemplateCache", "RankingTemplates"]

#: Entries the endpoint-wide cache keeps once their rankings ended (skeletons, recent empty prompts).
TEMPLATE_CACHE_SIZE = 16

_MISSING = object()


class TemplateCache(MutableMapping):
    """A thread-safe least-recently-used mapping of at most ``capacity`` entries (``rerank_many``'s
    threads share one endpoint state).

    >>> cache = TemplateCache(2)
    >>> cache["a"], cache["b"] = 1, 2
    >>> cache["a"]  # "a" is now the most recently used
    1
    >>> cache["c"] = 3  # evicts "b"
    >>> sorted(cache)
    ['a', 'c']
    """

    def __init__(self, capacity: int = TEMPLATE_CACHE_SIZE) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __getitem__(self, key: Any) -> Any:
        with self._lock:
            value = self._entries[key]
            self._entries.move_to_end(key)
            return value

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __delitem__(self, key: Any) -> None:
        with self._lock:
            del self._entries[key]

    def pop(self, key: Any, *default: Any) -> Any:
        with self._lock:
            return self._entries.pop(key, *default)

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TemplateCache({len(self)} of {self.capacity})"


class RankingTemplates(MutableMapping):
    """One ranking's rendered templates: its own entries, kept while it runs (so a busy endpoint's
    cache can never evict a prompt between two steps of a ranking), over the endpoint's shared
    :class:`TemplateCache`, which receives every entry and serves the ones another ranking made.
    Only one flow uses it at a time, so it needs no lock of its own.

    >>> shared = TemplateCache(1)
    >>> mine = RankingTemplates(shared)
    >>> mine["real"], mine["empty"] = "R", "E"  # the shared cache keeps only "empty"
    >>> "real" in mine, mine["real"], list(shared)
    (True, 'R', ['empty'])
    >>> "empty" in RankingTemplates(shared)  # another ranking finds it
    True
    """

    def __init__(self, shared: TemplateCache) -> None:
        self.shared = shared
        self.own: dict[Any, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        value = self.own.get(key, _MISSING)
        if value is _MISSING:
            value = self.shared[key]
            self.own[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        if key in self.own:
            return True
        value = self.shared.get(key, _MISSING)
        if value is _MISSING:
            return False
        self.own[key] = value  # found now, kept for this ranking even if the shared cache evicts it
        return True

    def __setitem__(self, key: Any, value: Any) -> None:
        self.own[key] = value
        self.shared[key] = value

    def __delitem__(self, key: Any) -> None:
        del self.own[key]
        self.shared.pop(key, None)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.own)

    def __len__(self) -> int:
        return len(self.own)
