"""Starting the embedded server as a child process, finding a running one, and picking an endpoint.

The child runs in its own session (process group) so :meth:`EmbeddedServer.stop` can end it and
anything it spawned, and it watches a pipe whose write end only the parent holds: when the parent
exits for any reason (even SIGKILL) the child reads EOF and shuts down.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
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
import urllib.error
import urllib.request
from collections.abc import Iterator

from ..errors import InputError, MissingExtra, ServerError
from .gateway import HostedGateway
from .models import MODELS, _spec, cache_dir, model_path

log = logging.getLogger(__name__)

_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parent.parent.parent)  # holds capcal_integrations/


def _url(host: str, port: int | None) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _get_json(url: str, timeout: float = 2.0) -> tuple[int, object]:
    """(HTTP status, 0 if unreachable; the JSON body or None). Never goes through a proxy."""
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError, http.client.HTTPException):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _healthy(root: str) -> bool:
    # llama.cpp: 503 while loading, then {"status": "ok"}; vLLM: 200 with an empty body once ready
    status, body = _get_json(root + "/health")
    return status == 200 and (body is None or (isinstance(body, dict) and body.get("status") == "ok"))


def find_running(host: str = "127.0.0.1", port: int = 8080) -> str | None:
    """The base URL if a healthy OpenAI-compatible server answers at host:port, else None."""
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
    """

    engine = "llama.cpp"
    default_startup_timeout: float = 120
    stop_timeout: float = 10

    def __init__(self, model: str = "0.5b", host: str = "127.0.0.1", port: int | None = None,
                 startup_timeout: float | None = None, *, n_parallel: int = 8, ctx_per_slot: int = 4096,
                 threads: int | None = None, alias: str = "local", prefill: bool = True) -> None:
        _spec(model)
        self.model, self.host, self.port, self.alias = model, host, port, alias
        self.startup_timeout = self.default_startup_timeout if startup_timeout is None else startup_timeout
        self.n_parallel, self.ctx_per_slot, self.threads = n_parallel, ctx_per_slot, threads
        self.prefill = prefill  # False: llama.cpp does not continue a final assistant message (as hosted APIs)
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
        model_path(self.model)  # install/assemble the weights

    def _command(self, parent_fd: int) -> list[str]:
        """The child's command line; it must exit when ``parent_fd`` (the read end of the lifeline) reads EOF."""
        return [sys.executable, "-m", "capcal_integrations.server", "--model", self.model,
                "--host", self.host, "--port", str(self.port), "--parent-fd", str(parent_fd),
                "--n-parallel", str(self.n_parallel), "--ctx-per-slot", str(self.ctx_per_slot), "--alias", self.alias,
                *(["--threads", str(self.threads)] if self.threads else []), *([] if self.prefill else ["--no-prefill"])]

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
        self._prepare()
        if not self.port:
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        self.log_path = cache_dir() / "logs" / f"{self.engine.lower().replace('.', '')}-{self.model}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
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
        lifeline. Idempotent."""
        proc, self._proc = self._proc, None
        lifeline, self._lifeline = self._lifeline, None
        atexit.unregister(self.stop)
        try:
            if proc is None or proc.poll() is not None:
                return
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=self.stop_timeout)
                    return
                except ProcessLookupError:
                    proc.wait()
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
                "--ctx-per-slot", str(self.ctx_per_slot)]


#: The local engines, by the name ``--engine`` takes.
ENGINES = ("llamacpp", "vllm")


@contextlib.contextmanager
def endpoint(base_url: str | None, model: str | None = None, *, port: int | None = None,
             threads: int | None = None, reuse_default: bool = True,
             engine: str = "llamacpp", hosted: bool = False) -> Iterator[tuple[str, str | None]]:
    """``(base_url, model name to send)`` for the duration of the ``with`` block.

    1. ``base_url``, else ``$CAPCAL_BASE_URL``: used as is; ``model`` is sent unless it names an
       embedded model (then None: let the endpoint pick).
    2. A healthy server already at 127.0.0.1:``port`` (default 8080, unless ``reuse_default`` is
       false: then only a given ``port`` is reused): reused; name None.
    3. Otherwise the embedded server for ``model`` (default "0.5b") is started here with ``engine``
       (``"llamacpp"`` or ``"vllm"``) and stopped on exit.

    ``hosted``: always start the embedded llama.cpp server, with assistant prefill off, and give the
    URL of a :class:`~.gateway.HostedGateway` in front of it (the model as a hosted chat-only API).
    """
    base_url = base_url or os.environ.get("CAPCAL_BASE_URL")
    if hosted:
        if base_url or engine != "llamacpp":
            raise InputError("hosted shows the embedded llama.cpp model as a hosted chat API; to use a hosted API, "
                             "pass its --base-url without it")
        with EmbeddedServer(model=model or "0.5b", port=port, threads=threads, prefill=False) as server, \
                HostedGateway(server.base_url, "chat") as gateway:
            log.info("embedded server at %s shown as a hosted chat-only API at %s", server.base_url, gateway.base_url)
            yield gateway.base_url, None
        return
    if base_url:
        yield base_url, (None if model in MODELS else model)
        return
    embedded = model or "0.5b"
    if embedded not in MODELS:
        raise InputError(f"model {embedded!r} is not an embedded model (choose one of: {', '.join(MODELS)}); "
                         "pass --base-url to use another endpoint")
    reuse_port = port or (8080 if reuse_default else None)
    if reuse_port and (running := find_running("127.0.0.1", reuse_port)):
        log.info("using the server already running at %s", running)
        yield running, None
        return
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    log.info("starting the embedded %s model server with %s (no --base-url given)", embedded, engine)
    extra = {"threads": threads} if engine == "llamacpp" else {}
    with (VllmServer if engine == "vllm" else EmbeddedServer)(model=embedded, port=port, **extra) as server:
        log.info("embedded %s server ready at %s (log %s)", embedded, server.base_url, server.log_path)
        yield server.base_url, None
