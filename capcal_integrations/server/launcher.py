"""Starting the embedded server as a child process, finding a running one, and picking an endpoint.

The child runs in its own session (process group) so :meth:`EmbeddedServer.stop` can end it and
anything it spawned, and it watches a pipe whose write end only the parent holds: when the parent
exits for any reason (even SIGKILL) the child reads EOF and shuts down.

:func:`endpoint` reuses a running server only if this user's ``capcal serve`` started it and it proves
it (:mod:`.ownership`); a server it starts itself gets a fresh key. Either way the key it yields is
that server's own, never the ambient ``$OPENAI_API_KEY``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from ..errors import InputError, MissingExtra, ServerError
from .address import NO_KEY, Endpoint  # noqa: F401 - re-exported (NO_KEY)
from .gateway import HostedGateway
from .models import MODELS, _spec, cache_dir, model_path
from .net import ENGINES, _get_json, _healthy, _url
from .ownership import find_own_server, new_key

log = logging.getLogger(__name__)

#: Where ``capcal serve`` listens by default, and where the commands look for a running server.
DEFAULT_PORT = 8080

_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parent.parent.parent)  # holds capcal_integrations/


def find_running(host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> str | None:
    """The base URL if a healthy OpenAI-compatible server answers at host:port, else None.

    This says nothing about whose server it is: :func:`endpoint` reuses only one that
    :func:`.ownership.check_own_server` vouches for."""
    root = _url(host, port)
    if _healthy(root):
        return root + "/v1"
    status, body = _get_json(root + "/v1/models")
    return root + "/v1" if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list) else None


class EmbeddedServer:
    """The llama.cpp server (``python -m capcal_integrations.server``) as a child process; a context manager.

    The engine-specific parts are :meth:`_prepare` (checks and downloads done in the parent),
    :meth:`_command` (the child's command line) and :attr:`default_startup_timeout`; :meth:`start`
    and :meth:`stop` are generic.

    ``api_key``: the key the server requires on its ``/v1`` routes (``/health`` stays open); None, the
    default, requires none: whoever reaches the port may use it. It reaches the child in its
    environment (``$CAPCAL_API_KEY``), which only this user can read, not on its command line, which
    every user can. ``allow_origin``: the one web origin whose pages may read the server's answers
    (default none).
    """

    engine = "llama.cpp"
    default_startup_timeout: float = 120
    stop_timeout: float = 10

    def __init__(self, model: str = "0.5b", host: str = "127.0.0.1", port: int | None = None,
                 startup_timeout: float | None = None, *, n_parallel: int = 8, ctx_per_slot: int = 4096,
                 threads: int | None = None, alias: str = "local", prefill: bool = True,
                 api_key: str | None = None, allow_origin: str | None = None) -> None:
        _spec(model)
        self.model, self.host, self.port, self.alias = model, host, port, alias
        self.startup_timeout = self.default_startup_timeout if startup_timeout is None else startup_timeout
        self.n_parallel, self.ctx_per_slot, self.threads = n_parallel, ctx_per_slot, threads
        self.prefill = prefill  # False: llama.cpp does not continue a final assistant message (as hosted APIs)
        self.api_key, self.allow_origin = api_key, allow_origin
        self.log_path: pathlib.Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None  # write end of the pipe the child watches; closed in stop()

    @property
    def base_url(self) -> str:
        return _url(self.host, self.port) + "/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _prepare(self) -> None:
        """Fail here, in the parent, for what the child would only report in its log."""
        if importlib.util.find_spec("xllamacpp") is None:
            raise MissingExtra("xllamacpp", "embedded")
        model_path(self.model)  # assemble and verify the weights its extra installed (never pip here)

    def _command(self, parent_fd: int) -> list[str]:
        """The child's command line; it must exit when ``parent_fd`` (the read end of the lifeline) reads EOF."""
        return [sys.executable, "-m", "capcal_integrations.server", "--model", self.model,
                "--host", self.host, "--port", str(self.port), "--parent-fd", str(parent_fd),
                "--n-parallel", str(self.n_parallel), "--ctx-per-slot", str(self.ctx_per_slot), "--alias", self.alias,
                *(["--threads", str(self.threads)] if self.threads else []), *([] if self.prefill else ["--no-prefill"]),
                *(["--allow-origin", self.allow_origin] if self.allow_origin else [])]

    def _fail(self, why: str) -> ServerError:
        self.stop()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()  # type: ignore[union-attr]
        except OSError:
            lines = []
        own = [ln.removeprefix("capcal: error: ") for ln in lines if ln.startswith("capcal: error: ")]
        return ServerError(f"the embedded {self.engine} server for model {self.model!r} {why}"
                           f"{f' ({own[-1]})' if own else ''}; see its log {self.log_path}",
                           details="\n".join(lines[-30:]) or "(empty log)")

    def start(self) -> EmbeddedServer:
        if self._proc and self._proc.poll() is None:
            return self
        self.stop()  # a child that died: close its lifeline before starting anew
        self._prepare()
        if not self.port:
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        self.log_path = cache_dir() / "logs" / f"{self.engine.lower().replace('.', '')}-{self.model}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        env.pop("CAPCAL_API_KEY", None)  # the user's key for their own `capcal serve` is not this server's
        if self.api_key:
            env["CAPCAL_API_KEY"] = self.api_key
        read_fd, write_fd = os.pipe()  # both non-inheritable: other children never hold the write end
        try:
            cmd = self._command(read_fd)
            with open(self.log_path, "wb") as logf:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True, pass_fds=(read_fd,))
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._lifeline = write_fd
        atexit.register(self.stop)
        log.info("started pid %d: %s (log %s)", self._proc.pid, " ".join(cmd), self.log_path)
        deadline = time.monotonic() + self.startup_timeout
        try:
            while time.monotonic() < deadline:
                if (code := self._proc.poll()) is not None:
                    raise self._fail(f"exited with code {code} during startup")
                if _healthy(_url(self.host, self.port)):
                    return self
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        raise self._fail(f"was not healthy after {self.startup_timeout:g} s")

    def stop(self) -> None:
        """SIGTERM the child's process group, wait up to :attr:`stop_timeout`, then SIGKILL; close the
        lifeline. Idempotent.

        Signals go only to a child the Popen handle says is still running (``poll() is None``): until
        it is reaped its PID, which is also its process group's ID, cannot be given to another
        process. Once reaped (it exited), nothing is signalled, since that number may be someone
        else's now."""
        proc, self._proc = self._proc, None
        lifeline, self._lifeline = self._lifeline, None
        atexit.unregister(self.stop)
        try:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc is None or proc.poll() is not None:
                    return
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:  # the child left its group, which is empty now
                    proc.send_signal(sig)
                try:
                    proc.wait(timeout=self.stop_timeout)
                    return
                except subprocess.TimeoutExpired:
                    log.warning("server pid %d still running %g s after %s", proc.pid, self.stop_timeout, sig.name)
        finally:
            if lifeline is not None:
                os.close(lifeline)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VllmServer(EmbeddedServer):
    """The same packaged model served by vLLM (:mod:`.vllm`) as a child process. The child is
    ``python -m capcal_integrations.server --engine vllm``, which runs vLLM in its own process group
    and stops it when the lifeline closes."""

    engine = "vLLM"
    default_startup_timeout: float = 900  # CPU builds take about 2 min to become healthy, more on a busy machine
    stop_timeout: float = 40

    def _prepare(self) -> None:
        from .vllm import check_vllm, hf_model_dir

        hf_model_dir(self.model, python=check_vllm())  # converted here, so a failure surfaces in the parent

    def _command(self, parent_fd: int) -> list[str]:
        return [sys.executable, "-m", "capcal_integrations.server", "--engine", "vllm", "--model", self.model,
                "--host", self.host, "--port", str(self.port), "--parent-fd", str(parent_fd), "--alias", self.alias,
                "--ctx-per-slot", str(self.ctx_per_slot), *(["--allow-origin", self.allow_origin] if self.allow_origin else [])]


def vllm_browser_flags(allow_origin: str | None) -> tuple[str, ...]:
    """vLLM's CORS flags: only ``allow_origin`` may read answers from a web page (none by default; some
    vLLM releases allowed every origin unless told otherwise)."""
    return ("--allowed-origins", json.dumps([allow_origin] if allow_origin else []))


@contextlib.contextmanager
def endpoint(base_url: str | None, model: str | None = None, *, port: int | None = None,
             threads: int | None = None, reuse_default: bool = True,
             engine: str = "llamacpp", hosted: bool = False) -> Iterator[Endpoint]:
    """An :class:`Endpoint` ``(base_url, model name to send)`` with its ``api_key``, for the duration
    of the ``with`` block.

    1. ``base_url``, else ``$CAPCAL_BASE_URL``: used as is; ``model`` is sent unless it names an
       embedded model (then None: let the endpoint pick); ``api_key`` None (the caller's).
    2. A server this user's ``capcal serve`` started at 127.0.0.1:``port`` (default
       :data:`DEFAULT_PORT`, unless ``reuse_default`` is false: then only a given ``port`` is
       reused), checked by :func:`.ownership.check_own_server` before anything is sent: reused,
       with its key, when it serves ``model`` (or no ``model`` was asked for); name None. Any other
       server there is left alone (the reason is logged); one of ours serving another model too (or,
       at a ``port`` given, an :class:`~.errors.InputError`).
    3. Otherwise the embedded server for ``model`` (default "0.5b") is started here with ``engine``
       (``"llamacpp"`` or ``"vllm"``) and a fresh random key, and stopped on exit.

    ``hosted``: always start the embedded llama.cpp server, with assistant prefill off, and give the
    URL of a :class:`~.gateway.HostedGateway` in front of it (the model as a hosted chat-only API); both
    require a fresh random key, the ``api_key``.
    """
    base_url = base_url or os.environ.get("CAPCAL_BASE_URL")
    if hosted:
        if base_url or engine != "llamacpp":
            raise InputError("hosted shows the embedded llama.cpp model as a hosted chat API; to use a hosted API, "
                             "pass its --base-url without it")
        key = new_key()  # the server and the gateway in front of it both require it, as every server started here
        with EmbeddedServer(model=model or "0.5b", port=port, threads=threads, prefill=False, api_key=key) as server, \
                HostedGateway(server.base_url, "chat", api_key=key) as gateway:
            log.info("embedded server at %s shown as a hosted chat-only API at %s", server.base_url, gateway.base_url)
            yield Endpoint(gateway.base_url, None, key)
        return
    if base_url:
        yield Endpoint(base_url, None if model in MODELS else model)
        return
    embedded = model or "0.5b"
    if embedded not in MODELS:
        raise InputError(f"model {embedded!r} is not an embedded model (choose one of: {', '.join(MODELS)}); "
                         "pass --base-url to use another endpoint")
    reuse_port = port or (DEFAULT_PORT if reuse_default else None)
    if reuse_port and (own := find_own_server(reuse_port)):
        if model is None or own.model == model:
            log.info("using the server your capcal serve (pid %d) runs at %s", own.pid, own.base_url)
            yield Endpoint(own.base_url, None, own.api_key)
            return
        if port:
            raise InputError(f"your capcal serve at {own.base_url} serves the {own.model} model, not {model}; ask for "
                             f"--model {own.model}, or stop it, or give another --port")
        log.info("your capcal serve at %s serves the %s model, not %s: starting %s here", own.base_url, own.model,
                 model, model)
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    log.info("starting the embedded %s model server with %s (no --base-url given)", embedded, engine)
    extra = {"threads": threads} if engine == "llamacpp" else {}
    key = new_key()
    with (VllmServer if engine == "vllm" else EmbeddedServer)(model=embedded, port=port, api_key=key, **extra) as server:
        log.info("embedded %s server ready at %s (log %s)", embedded, server.base_url, server.log_path)
        yield Endpoint(server.base_url, None, key)
