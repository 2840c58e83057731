"""A ranking's progress, as it goes: :class:`Watched` drives a flow unchanged and tells a callback how many requests
it has asked for so far, after each batch (``CapCalReranker.rerank(..., progress=callback)``; the adapters draw a
bar with it: ``progress=True``). The drivers see the same generator protocol (``next``, ``send``, ``throw``,
``close``), so nothing else changes."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

__all__ = ["Watched"]


class Watched(Generator):  # type: ignore[type-arg]  # a Flow of any result
    """``flow``, with ``tick(requests asked for so far)`` called after each batch of calls it yields."""

    def __init__(self, flow: Any, tick: Callable[[int], None]) -> None:
        self.flow, self.tick, self.asked = flow, tick, 0

    def _seen(self, calls: Any) -> Any:
        self.asked += len(calls)
        self.tick(self.asked)
        return calls

    def __iter__(self) -> Watched:
        return self

    def __next__(self) -> Any:
        return self._seen(next(self.flow))

    def send(self, value: Any) -> Any:
        return self._seen(self.flow.send(value))

    def throw(self, *args: Any) -> Any:
        return self._seen(self.flow.throw(*args))

    def close(self) -> None:
        self.flow.close()
