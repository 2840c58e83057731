"""llama.cpp's OpenAI-compatible server, in this process, through the xllamacpp wheel."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys

from ..errors import MissingExtra, ServerError
from .launcher import _url
from .lifeline import stop_signal
from .models import model_path

log = logging.getLogger(__name__)


def check_port(host: str, port: int) -> None:
    """Raise :class:`ServerError` unless a server could listen on host:port now (a bind test)."""
    where = _url(host, port).removeprefix("http://")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no conflict
            s.bind(addr)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ServerError(f"cannot listen on {where}: the port is in use (pass --port)") from None
        raise ServerError(f"cannot listen on {where}: {e.strerror or e}") from None


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, n_ctx_per_slot: int = 4096,
          n_parallel: int = 8, threads: int | None = None, alias: str = "local", cache_ram_mib: int = 1024,
          parent_fd: int | None = None, prefill: bool = True) -> None:
    """Serve ``model`` at http://host:port/v1 in this process until SIGINT/SIGTERM. Call from the main thread.

    ``prefill=False`` turns off llama.cpp's continuation of a final assistant message (as hosted APIs
    behave: the message is taken as a finished turn).

    With ``parent_fd`` (the read end of a pipe whose write end the parent holds), also stop when that
    pipe reads EOF, i.e. when the parent exits, however it dies.
    """
    try:
        import xllamacpp as xlc  # heavy native module: import lazily
    except ImportError:
        raise MissingExtra("xllamacpp", "embedded") from None
    check_port(host, port)  # before the (slow) model load, and with a clear message
    p = xlc.CommonParams()
    p.model.path = str(model_path(model))
    p.hostnames = [host]
    p.port = port
    p.n_ctx = n_ctx_per_slot * n_parallel  # the slots split the total context between them
    p.n_parallel = n_parallel  # the reranker keeps a "real" and an "empty" prompt cached in separate slots
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads or os.cpu_count() or 1
    p.model_alias = [alias]  # must be a list: a plain str is split into characters
    # llama.cpp keeps old prompts' KV in host RAM (8 GiB by default); a reranker revisits few of them
    p.cache_ram_mib = cache_ram_mib
    p.prefill_assistant = prefill
    with stop_signal(parent_fd) as stop:
        try:
            server = xlc.Server(p)  # returns once listening; HTTP and inference run on native threads
        except Exception as e:  # RuntimeError "Failed to init server": bad model file, port taken meanwhile, ...
            raise ServerError(f"llama.cpp could not start serving model {model!r} on {_url(host, port)}: {e}") from e
        sys.stderr.write(f'capcal: serving {model} at {_url(host, port)}/v1 (model name "{alias}"); Ctrl-C to stop\n')
        sys.stderr.flush()
        stop.wait()
        # xllamacpp.Server has no stop()/close(): dropping the only reference runs the C++ destructor,
        # which stops the HTTP listener and joins the main loop (~0.1 s). Once, with a request in flight
        # when the parent died, it released the port and then spun for minutes: the kernel's alarm ends
        # the process if the destructor has not returned in 15 s (it holds the GIL, so no thread could).
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(15)
        del server
