"""The fake endpoint on a real socket, for what a custom transport cannot reach: another process, a
pickled adapter, the command line, anything configured by ``base_url`` alone."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

from .endpoint import Handler, httpx2, make_handler

__all__ = ["Loopback", "Seen"]


class Seen(NamedTuple):
    """One request a :class:`Loopback` server answered."""

    method: str
    path: str
    auth: str | None
    status: int
    body: str  # the request's body; with ``raw=True`` its request line and headers first


class Loopback:
    """The fake endpoint (``handler``, default :func:`~.endpoint.make_handler`: the llama.cpp dialect) on
    127.0.0.1, a free port unless ``port``; a context manager. ``base_url`` is its ``.../v1``. ``key``: every
    route but ``/health`` wants ``Authorization: Bearer key`` (401 otherwise), as ``capcal serve`` does.
    Records what it was asked (``seen``). Needs only the standard library and the installed openai's HTTP
    library (both openai majors). For example ``with Loopback(key="k") as fake:``, then
    ``CapCalReranker(base_url=fake.base_url, api_key="k")``."""

    def __init__(self, *, key: str | None = None, port: int = 0, handler: Handler | None = None,
                 health: bytes = b'{"status": "ok"}', raw: bool = False) -> None:
        """``health``: what ``/health`` answers (200); ``raw``: record each request's line and headers too (to look
        for a secret anywhere in them)."""
        self.key = key
        self.seen: list[Seen] = []
        fake, outer = make_handler() if handler is None else handler, self

        class Answer(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization")
                if self.path == "/health":
                    status, content = 200, health
                elif outer.key and auth != f"Bearer {outer.key}":
                    status, content = 401, b'{"error": {"message": "Invalid API Key", "code": 401}}'
                else:
                    answer = fake(httpx2.Request(self.command, "http://fake" + self.path, content=body))
                    status, content = answer.status_code, answer.content
                text = body.decode(errors="replace")
                outer.seen.append(Seen(self.command, self.path, auth, status,
                                       f"{self.requestline}\n{self.headers}\n{text}" if raw else text))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Answer)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Loopback:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
