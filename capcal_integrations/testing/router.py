"""A rig, not a double: two real llama.cpp servers (the ``[embedded]`` extra) behind vllm-router
(``--policy consistent_hash``, ``pip install vllm-router``), on loopback, for measuring what a router does
with a ranking's requests (tests/test_router_e2e.py; the ``router`` run of benchmarks/results/cost/cost.md). Not imported by
:mod:`capcal_integrations.testing`; import it as ``capcal_integrations.testing.router``.

What reached which server is read from two records:

* the servers' own logs: llama.cpp logs each completion prompt it runs (one task per prompt of a
  prompt list) with the prompt tokens it evaluated, i.e. did not find in its cache (:meth:`Rig.tasks`);
* a counting proxy in front of each server, since llama.cpp logs nothing for ``/tokenize``,
  ``/apply-template``, ``/props`` or ``/v1/models``: it records each request's path and the routing
  key it arrived with (header and body ``user``), then forwards it unchanged (:attr:`Rig.seen`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..server import EmbeddedServer

__all__ = ["Rig", "Seen", "router_binary", "free_port"]

_TASK = re.compile(r"\| task (\d+) \| prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")


def router_binary() -> str | None:
    """The ``vllm-router`` launcher of this Python's environment (the registry's wheel), else on PATH."""
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else shutil.which("vllm-router")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Seen:
    """One request as it reached a server."""

    backend: int
    method: str
    path: str
    key: str | None  # the routing header's value
    user: str | None  # the body's ``user``


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, backend: int, target_port: int, header: str, seen: list[Seen], lock: threading.Lock) -> None:
        self.backend, self.target_port, self.header, self.seen, self.lock = backend, target_port, header, seen, lock
        super().__init__(("127.0.0.1", 0), _Forward)


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            user = json.loads(body).get("user") if body else None
        except (ValueError, AttributeError):
            user = None
        if self.path != "/health":  # the router's own health checks
            with self.server.lock:
                self.server.seen.append(Seen(self.server.backend, self.command, self.path.split("?")[0],
                                             self.headers.get(self.server.header), user))
        conn = http.client.HTTPConnection("127.0.0.1", self.server.target_port, timeout=3600)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward

    def log_message(self, *args: object) -> None:  # quiet
        pass


class Rig:
    """Two embedded llama.cpp servers (one thread each: they share the machine's 2 cores), a counting
    proxy before each, and vllm-router before both. A context manager; everything started is stopped."""

    def __init__(self, model: str = "0.5b", *, policy: str = "consistent_hash", header: str = "X-Session-ID",
                 n_parallel: int = 4, log_dir: Path | None = None, api_key: str | None = None) -> None:
        self.model, self.policy, self.header, self.n_parallel = model, policy, header, n_parallel
        self.api_key = api_key  # the workers' key, given to vllm-router too (``--api-key``: docs/scaling-out.md)
        self.log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        self.servers: list[EmbeddedServer] = []
        self.proxies: list[_Proxy] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._router: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.router_log: Path | None = None

    @property
    def url(self) -> str:
        """The router's base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def backends(self) -> list[str]:
        """Each server's own base URL (no proxy, no router): a direct single-server run."""
        return [s.base_url for s in self.servers]

    def start(self) -> Rig:
        binary = router_binary()
        if binary is None:
            raise RuntimeError("vllm-router is not installed: pip install vllm-router")
        try:
            for k in range(2):
                server = EmbeddedServer(model=self.model, n_parallel=self.n_parallel, threads=1,
                                        api_key=self.api_key).start()
                self.servers.append(server)
                proxy = _Proxy(k, server.port, self.header, self.seen, self._lock)
                threading.Thread(target=proxy.serve_forever, daemon=True).start()
                self.proxies.append(proxy)
            self.port = free_port()
            workers = [f"http://127.0.0.1:{p.server_address[1]}" for p in self.proxies]
            self.router_log = self.log_dir / f"vllm-router-{self.port}.log"
            with open(self.router_log, "wb") as log:
                self._router = subprocess.Popen(
                    [binary, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *workers,
                     "--policy", self.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                     "--request-timeout-secs", "3600", "--log-level", "warning",
                     # one argument: a key that starts with "-" (token_urlsafe's alphabet has it) is not read as a flag
                     *([f"--api-key={self.api_key}"] if self.api_key else [])],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self._wait_router()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_router(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._router is not None
            if self._router.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self._router.returncode}; see {self.router_log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"vllm-router not healthy after {timeout:g} s; see {self.router_log}")

    def stop(self) -> None:
        router, self._router = self._router, None
        if router is not None and router.poll() is None:
            os.killpg(router.pid, signal.SIGTERM)
            try:
                router.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(router.pid, signal.SIGKILL)
                router.wait(10)
        for proxy in self.proxies:
            proxy.shutdown()
            proxy.server_close()
        self.proxies = []
        for server in self.servers:
            server.stop()
        self.servers = []

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what reached which server

    def mark(self) -> tuple[int, list[int]]:
        """Where the records are now: (requests seen, each server's log size)."""
        with self._lock:
            count = len(self.seen)
        return count, [s.log_path.stat().st_size if s.log_path else 0 for s in self.servers]

    def since(self, mark: tuple[int, list[int]]) -> list[Seen]:
        with self._lock:
            return list(self.seen[mark[0]:])

    def tasks(self, mark: tuple[int, list[int]]) -> list[list[int]]:
        """Per server, the prompt tokens it evaluated (not found in its cache) for each completion
        prompt it ran since ``mark``: the servers' own log."""
        out = []
        for server, offset in zip(self.servers, mark[1]):
            assert server.log_path is not None
            with open(server.log_path, "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            out.append([int(m.group(2)) for m in _TASK.finditer(text)])
        return out
