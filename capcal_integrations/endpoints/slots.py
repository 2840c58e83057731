"""Which llama.cpp server slot each prompt goes to (see :class:`SlotPins`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SlotPins"]


@dataclass
class SlotPins:
    """Pins each prompt to a llama.cpp slot: a new prompt takes the least recently used free slot.

    A list of prompts is otherwise spread over idle slots, and every slot that does not hold the
    shared prefix recomputes the whole prompt; pinned, the prompts run one after another in one slot
    and each costs only its last few tokens. Least-recently-used (not round robin) keeps the prompts
    of one decoding step, the real and the empty one, in different slots even when one of them comes
    back from an earlier list (the empty prompt is the same for every order of a query's passages).
    A slot with one of our requests in flight is never given to another prompt, nor sent a second
    request: with more live prompts than slots (many concurrent queries), such a request goes
    unpinned and the server picks the slot (two requests queued on one slot once sent llama.cpp's
    server into an endless loop here). ``rerank_many``'s threads share one :class:`SlotPins`, so
    :meth:`pin` and :meth:`release` hold a lock: without it two threads could both see a slot free and
    both take it.

    >>> pins = SlotPins()
    >>> real, empty = pins.pin("real", 2), pins.pin("empty", 2)
    >>> real, empty, pins.pin("other", 2)  # both slots busy: unpinned
    (0, 1, None)
    >>> pins.release(real); pins.release(empty)
    >>> pins.pin("real", 2), pins.pin("other", 2)  # "other" takes the least recently used slot
    (0, 1)
    """

    owner: dict[int, Any] = field(default_factory=dict)  # slot -> prompt
    used: dict[int, int] = field(default_factory=dict)  # slot -> tick of last use
    busy: set[int] = field(default_factory=set)  # slots with one of our requests in flight
    tick: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def pin(self, prompt: Any, slots: int) -> int | None:
        """The slot for ``prompt``, busy until :meth:`release`; ``None`` when none is free for it."""
        with self.lock:
            self.tick += 1
            slot = next((s for s, owner in self.owner.items() if owner == prompt), None)
            if slot is None or slot in self.busy:
                slot = self._free(slots)
                if slot is None:
                    return None
                self.owner[slot] = prompt
            self.used[slot] = self.tick
            self.busy.add(slot)
            return slot

    def _free(self, slots: int) -> int | None:
        """The least recently used free slot below ``slots`` (a never used one first, the lowest), found
        among the slots used so far: never a range of all ``slots``, whatever a server reports."""
        fresh = next(s for s in range(len(self.used) + len(self.busy) + 1) if s not in self.used and s not in self.busy)
        if fresh < slots:
            return fresh
        used = [s for s in self.used if s < slots and s not in self.busy]
        return min(used, key=lambda s: (self.used[s], s)) if used else None

    def release(self, *slots: int | None) -> None:
        """The ``slots`` free again (``None``: a prompt that went unpinned)."""
        with self.lock:
            self.busy.difference_update(slots)
