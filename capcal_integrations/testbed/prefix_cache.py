"""What a llama.cpp server's slots would have cached, for the simulated server's usage report.

Each slot holds the last prompt sent to it (text and token-id segments). A new prompt goes to the slot it is
pinned to (``id_slot``), else to the slot whose prompt shares the longest prefix with it; the tokens of that
common prefix are the cached ones, counted in the testbed's own tokens (:func:`~.reading.pieces`).
:class:`~.endpoint.SimulatedServer` reports them as ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .reading import pieces

__all__ = ["PrefixCache"]


class PrefixCache:
    """The prompt each of ``slots`` llama.cpp slots holds. Not locked: the server calls it under its own lock."""

    def __init__(self, slots: int) -> None:
        self._offsets: OrderedDict[str, list[int]] = OrderedDict()
        self._cache: list[list[str | int]] = [[] for _ in range(max(1, slots))]

    def use(self, segments: Sequence[str | int], slot: Any) -> tuple[int, int]:
        """Prompt tokens of a prompt, and how many a llama.cpp slot would have cached: the common prefix
        with the previous prompt of the pinned slot (else of the slot that shares most), which holds it now."""
        tokens = sum(len(self._offsets_of(x)) - 1 if isinstance(x, str) else 1 for x in segments)
        slots = [slot] if isinstance(slot, int) and 0 <= slot < len(self._cache) else range(len(self._cache))
        hits = {k: self._shared(self._cache[k], segments) for k in slots}
        best = max(hits, key=lambda k: hits[k])
        self._cache[best] = list(segments)
        return tokens, hits[best]

    def _offsets_of(self, text: str) -> list[int]:
        offsets = self._offsets.get(text)
        if offsets is None:
            offsets = self._offsets[text] = [0, *_cumulative(pieces(text))]
            while len(self._offsets) > 256:
                self._offsets.popitem(last=False)
        return offsets

    def _shared(self, before: Sequence[str | int], now: Sequence[str | int]) -> int:
        """Tokens at the start of ``now`` that ``before`` had too."""
        hit = 0
        for a, b in zip(before, now):
            if a == b:
                hit += len(self._offsets_of(a)) - 1 if isinstance(a, str) else 1
                continue
            if isinstance(a, str) and isinstance(b, str):
                hit += bisect.bisect_right(self._offsets_of(b), _common(a, b)) - 1
            break
        return hit


def _common(a: str, b: str) -> int:
    """Length of the common prefix of two strings (bisection on slices: fast for long prompts).

    >>> _common("abcdef", "abcxyz"), _common("", "a"), _common("same", "same")
    (3, 0, 4)
    """
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cumulative(parts: Sequence[str]) -> list[int]:
    out, total = [], 0
    for p in parts:
        total += len(p)
        out.append(total)
    return out
