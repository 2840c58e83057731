"""Where a local server is and whether it is up: its URL, a health check, a port bind test; the engines' names.

The engines (:mod:`.llamacpp`, :mod:`.vllm`) and the launcher (:mod:`.launcher`) all need these; here they
depend on none of them, so the three import this module and not each other in a circle.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import urllib.error
import urllib.request

from ..errors import ServerError

__all__ = ["check_port", "ENGINES"]

#: The local engines, by the name ``--engine`` takes (the first: the default); the one list of their names.
ENGINES = ("llamacpp", "vllm")


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
