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

    def submit(self, work: Callable[[], None], pending: Pending) -> None:
        if _closing.is_set():
            pending.done()
            return
        try:
            self._queue.put_nowait((work, pending))
        except queue.Full:
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
                self._queue.task_done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every reading handed over so far is done, at most ``timeout`` seconds; whether none is left
        (the queue's own count of unfinished tasks: ``Queue.join`` with a timeout)."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._queue.unfinished_tasks, timeout)


#: Readings waiting for an endpoint's reading thread at most; seconds it waits for one before it ends.
QUEUED, IDLE = 4, 30.0
