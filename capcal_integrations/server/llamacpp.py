"""llama.cpp's OpenAI-compatible server, in this process, through the xllamacpp wheel."""

from __future__ import annotations

import logging
import os
import signal
import sys

from ..errors import MissingExtra, ServerError
from .lifeline import stop_signal
from .models import model_path
from .net import _url, check_port
from .ownership import forget_server, record_server

log = logging.getLogger(__name__)


def cors_settings(allow_origin: str | None) -> dict[str, object]:
    """llama.cpp's CORS parameters: by default it echoes any page's ``Origin`` back (with credentials
    allowed), so every web page the user opens could read its answers. Here no origin is allowed
    (an empty ``Access-Control-Allow-Origin``, which no browser accepts) unless one is named; that one
    may send the ``Authorization`` header (a ``*`` in ``Access-Control-Allow-Headers`` does not cover it)."""
    return {"cors_origins": allow_origin or "", "cors_origins_explicit": True, "cors_credentials": False,
            "cors_headers": "Authorization, Content-Type"}


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, n_ctx_per_slot: int = 4096,
          n_parallel: int = 8, threads: int | None = None, alias: str = "local", cache_ram_mib: int = 1024,
          parent_fd: int | None = None, prefill: bool = True, api_key: str | None = None,
          allow_origin: str | None = None, record: bool = False) -> None:
    """Serve ``model`` at http://host:port/v1 in this process until SIGINT/SIGTERM. Call from the main thread.

    ``prefill=False`` turns off llama.cpp's continuation of a final assistant message (as hosted APIs
    behave: the message is taken as a finished turn).

    ``api_key``: required as ``Authorization: Bearer KEY`` on every route but ``/health`` (None: no
    key). ``allow_origin``: the one web origin whose pages may read the answers (default none; see
    :func:`cors_settings`). ``record`` (needs ``api_key``): once listening, write the state file that
    lets this user's ``capcal`` commands find and reuse the server (:mod:`.ownership`), and remove it
    on the way out.

    With ``parent_fd`` (the read end of a pipe whose write end the parent holds), also stop when that
    pipe reads EOF, i.e. when the parent exits, however it dies.
    """
    if record and not api_key:
        raise ValueError("record=True needs an api_key: a recorded server must be able to prove it is ours")
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
    # a request whose client has gone (a deadline passed) is cancelled between two batches: one ubatch (512
    # tokens, llama.cpp's default n_ubatch), not 2048, so it stops within one ubatch's work; the compute per
    # ubatch is unchanged
    p.n_batch = 512
    p.model_alias = [alias]  # must be a list: a plain str is split into characters
    # llama.cpp keeps old prompts' KV in host RAM (8 GiB by default); a reranker revisits few of them
    p.cache_ram_mib = cache_ram_mib
    p.prefill_assistant = prefill
    p.api_keys = [api_key] if api_key else []
    for name, value in cors_settings(allow_origin).items():
        setattr(p, name, value)
    with stop_signal(parent_fd) as stop:
        try:
            server = xlc.Server(p)  # returns once listening; HTTP and inference run on native threads
        except Exception as e:  # RuntimeError "Failed to init server": bad model file, port taken meanwhile, ...
            raise ServerError(f"llama.cpp could not start serving model {model!r} on {_url(host, port)}: {e}") from e
        sys.stderr.write(f'capcal: serving {model} at {_url(host, port)}/v1 (model name "{alias}"); Ctrl-C to stop\n')
        state = record_server(host, port, api_key, engine="llama.cpp", model=model) if record and api_key else None
        try:
            if state:
                sys.stderr.write(f"capcal: the API key is in {state} (readable by you only; `capcal key` prints "
                                 "it); capcal rerank, tune and demo on this machine find it there\n")
            sys.stderr.flush()
            stop.wait()
        finally:
            if state:
                forget_server(state)  # first: the server is about to go
        # xllamacpp.Server has no stop()/close(): dropping the only reference runs the C++ destructor,
        # which stops the HTTP listener and joins the main loop (~0.1 s). Once, with a request in flight
        # when the parent died, it released the port and then spun for minutes, and with requests in flight
        # (a chat's content check still reading when the chat ends) it does not return for more than 10 s: the
        # kernel's alarm ends the process if the destructor has not returned in 3 s (it holds the GIL, so no
        # thread could), before the launcher's SIGKILL and its warning.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(3)
        del server
