"""How a local server knows when to stop: SIGINT, SIGTERM, or the death of whoever started it.

The launcher (:class:`~.launcher.EmbeddedServer`) passes the child the read end of a pipe whose write
end only the parent holds. When the parent exits, however it dies (even SIGKILL), the pipe reads
EOF and the child stops: no server outlives the process that started it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

__all__ = ["stop_signal"]


def _watch_parent(parent_fd: int, stop: threading.Event) -> None:
    """Block on the lifeline pipe; EOF (or an error) means the parent is gone or let go: stop."""
    try:
        while os.read(parent_fd, 1):
            pass
    except OSError:
        pass
    log.info("parent process gone (EOF on fd %d): stopping", parent_fd)
    stop.set()


@contextlib.contextmanager
def stop_signal(parent_fd: int | None = None) -> Iterator[threading.Event]:
    """An event set on SIGINT, SIGTERM or (with ``parent_fd``) the parent's death. Main thread only."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    if parent_fd is not None:
        threading.Thread(target=_watch_parent, args=(parent_fd, stop), name="capcal-lifeline", daemon=True).start()
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
