"""Which lists a content check has read, which it is reading, and when it may try again after readings failed.

A check reads a list once (its identity: a digest of the query and passages), and remembers at most :data:`SEEN`
lists (the oldest forgotten first). A reading that ends without being delivered (it failed, its event loop
closed, a full queue dropped it) leaves its list unread: it may be read later. Readings that fail are tried again
after :data:`RETRY_BASE` seconds, doubling up to :data:`RETRY_MAX`; after :data:`WARN_AFTER` failures in a row one
WARNING names the error (the others are logged at DEBUG), and a reading that succeeds starts the count afresh.
:class:`Pending` is one list handed to a runner to be read. No I/O.

>>> a = Attempts(clock=lambda: 0.0)
>>> a.want("x"), a.want("y"), a.want("y", exclusive=False)
(True, False, True)
>>> a.read("x"); a.release("x"); a.want("x", exclusive=False)
False
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import EndpointError
from ..redaction import redact

__all__ = ["Attempts", "Pending", "RETRY_BASE", "RETRY_MAX", "WARN_AFTER", "SEEN"]

log = logging.getLogger("capcal_integrations")

RETRY_BASE, RETRY_MAX, WARN_AFTER = 2.0, 300.0, 3
SEEN = 1024


class Attempts:
    """One check's readings: lists read and in flight, failures in a row (module docstring). Thread-safe;
    ``clock`` (seconds, monotonic) times the retries."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.seen: OrderedDict[str, None] = OrderedDict()  # lists read (at most SEEN)
        self.flying: set[str] = set()  # lists being read
        self.failures, self.retry_at, self.error = 0, 0.0, ""  # failures in a row, the next try, the last error
        self._lock = threading.Lock()

    def want(self, ident: str, exclusive: bool = True) -> bool:
        """Whether to read list ``ident`` now: not read, not being read, not waiting after failures and
        (``exclusive``) no other in flight; then it is in flight until :meth:`release`."""
        with self._lock:
            if ((exclusive and self.flying) or ident in self.seen or ident in self.flying
                    or self.clock() < self.retry_at):
                return False
            self.flying.add(ident)
            return True

    def read(self, ident: str) -> None:
        """List ``ident`` was read: remembered (not read again), and the failure count starts afresh."""
        with self._lock:
            self.failures, self.retry_at = 0, 0.0
            if ident:
                self.seen[ident] = None
                while len(self.seen) > SEEN:
                    self.seen.popitem(last=False)

    def release(self, ident: str) -> None:
        """A reading ended (read, failed or dropped)."""
        with self._lock:
            self.flying.discard(ident)

    def failed(self, err: BaseException) -> None:
        """A reading failed: the next waits; one WARNING after :data:`WARN_AFTER` in a row."""
        error = f"{type(err).__name__}: {redact(str(err))[:300]}"
        with self._lock:
            self.failures += 1
            self.retry_at = self.clock() + min(RETRY_MAX, RETRY_BASE * 2 ** (self.failures - 1))
            self.error, failures = error, self.failures
        if failures == WARN_AFTER:
            log.warning("capcal: the content check's readings failed %d times in a row (last: %s); lists keep their "
                        "given order meanwhile, and it tries again every %g s at most", failures, error, RETRY_MAX)
        else:
            log.debug("capcal: a content-check reading failed (%s); the next try waits", error)

    def note(self) -> str:
        """What a list's note says of failing readings ("" while none fails)."""
        if not self.failures:
            return ""
        wait = max(0.0, self.retry_at - self.clock())
        return f"; {self.failures} reading(s) failed in a row ({self.error}), next try in {wait:.0f} s"


@dataclass
class Pending:
    """A list to read for the check: ``flow(state)`` is the :data:`~capcal_integrations.endpoints.calls.Flow` of
    its readings; the runner
    (background, or the ranking itself: :meth:`take`) then calls :meth:`deliver` with its result or :meth:`failed`
    with its error, and :meth:`done` always (a list not delivered may be read again later)."""

    check: Any  # a ContentCheck (.content_check)
    flow: Callable[[Any], Any]
    form: str = "additive"
    ident: str = ""

    def deliver(self, reading: Any) -> Any:
        return self.check.add(reading, self.form, self.ident)

    def failed(self, err: BaseException) -> None:
        self.check.failed(err)

    def done(self) -> None:
        self.check.release(self.ident)

    def take(self, state: Any) -> Any:
        """The readings taken in the ranking's own flow (``check_wait``): ``None`` once delivered, or the note of
        a reading the endpoint failed (the list then keeps its given order, and is not marked read)."""
        try:
            self.deliver((yield from self.flow(state)))
            return None
        except EndpointError as err:
            self.failed(err)
            return f"content check: its reading of this list failed ({type(err).__name__}), tried again later"
        finally:
            self.done()
