"""Readings off the request path: the content check's lists read on a thread of the endpoint's own.

A reranker (and its ``with_options`` copies) hands a :class:`~capcal_integrations.content_check.attempts.Pending`
reading here with the work that reads it (over the sync client, or over the async client on the thread's own
event loop, which a caller's ``asyncio.run`` per call cannot close under it). At interpreter exit the readings
not started are dropped.
"""

from __future__ import annotations

import asyncio
import atexit
import queue
import threading
from collections.abc import Callable

from ..content_check.attempts import Pending

__all__ = ["BackgroundReadings", "QUEUED", "IDLE"]

_closing = threading.Event()  # set at interpreter exit: background readings not started are dropped
atexit.register(_closing.set)


class BackgroundReadings:
    """The content check's readings of one endpoint state (a reranker and its ``with_options`` copies), off the
    request path: one daemon thread, however many option variants, one reading at a time, at most
    :data:`QUEUED` waiting (a list handed over beyond that is dropped, and may be read later). The thread ends after
    :data:`IDLE` seconds without work. A reading that raises is the check's to count (``pending.failed``: retried
    later with backoff, one WARNING)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], None], Pending]] = queue.Queue(maxsize=QUEUED)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._left = 0  # readings handed over and not done yet
        self._settled = threading.Condition()

    def submit(self, work: Callable[[], None], pending: Pending) -> None:
        if _closing.is_set():
            pending.done()
            return
        queued = True
        with self._settled:  # counted with the put: the thread cannot finish it before it is counted
            try:
                self._queue.put_nowait((work, pending))
                self._left += 1
            except queue.Full:
                queued = False
        if not queued:
            pending.done()
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="capcal-content-check", daemon=True)
                self._thread.start()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The reading thread's own event loop (made on first use; called on that thread only)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def _run(self) -> None:
        while True:
            try:
                work, pending = self._queue.get(timeout=IDLE)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        if self._loop is not None:
                            self._loop.close()
                            self._loop = None
                        return
                continue
            try:
                if not _closing.is_set():
                    work()
            except Exception as err:  # noqa: BLE001 - a reading is best effort: the check counts it and tries later
                pending.failed(err)
            finally:
                pending.done()
                with self._settled:
                    self._left -= 1
                    self._settled.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every reading handed over so far is done, at most ``timeout`` seconds; whether none is left."""
        with self._settled:
            return self._settled.wait_for(lambda: self._left == 0, timeout)


#: Readings waiting for an endpoint's reading thread at most; seconds it waits for one before it ends.
QUEUED, IDLE = 4, 30.0
