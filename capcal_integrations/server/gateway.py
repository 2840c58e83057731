"""A loopback gateway that shows a local server to clients as a hosted API would.

Hosted OpenAI-compatible APIs (OpenAI, Together, Fireworks, ...) expose ``/v1/models`` and
``/v1/chat/completions`` (some also a plain ``/v1/completions``), cap ``top_logprobs`` at 20, name
tokens by their text only (no ids), refuse parameters they do not know, and have no ``/tokenize``,
``/apply-template`` or ``/props``. :class:`HostedGateway` forwards exactly that surface to a real local
server (best started with assistant prefill off, ``EmbeddedServer(prefill=False)``), so what the
library does on a hosted API runs here against a real model:

* ``kind="chat"``: chat completions only;
* ``kind="completions"``: also ``/v1/completions`` with text prompts (a string or a list of strings),
  answered in the legacy logprobs shape (``tokens``, ``top_logprobs`` as ``{text: logprob}``);
* ``kind="chat-prefill"``: chat completions and the upstream's ``/tokenize``, in front of a server that
  continues a final assistant message: an engine with chat prefill but no prompt lists, read by the
  library's ``chat`` transport.

Everything else is a 404. The gateway counts the requests it forwarded (:attr:`HostedGateway.requests`).
With ``api_key`` (as ``capcal demo --hosted`` starts it), every request must carry it (``Authorization:
Bearer KEY``, else 401, as a hosted API answers), and the gateway sends the same key to the upstream server.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..transport.client import http_library

__all__ = ["HostedGateway", "KINDS", "MAX_TOP_LOGPROBS"]

KINDS = ("chat", "completions", "chat-prefill")
MAX_TOP_LOGPROBS = 20
_CHAT_PARAMS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
                "seed", "logprobs", "top_logprobs", "stream", "presence_penalty", "frequency_penalty", "logit_bias",
                "user", "response_format"}
_COMPLETION_PARAMS = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
                      "echo", "stream", "presence_penalty", "frequency_penalty", "logit_bias", "user", "suffix"}


class HostedGateway:
    """Forward the hosted surface of ``kind`` to ``upstream`` (a base URL ending in ``/v1``) from
    http://127.0.0.1:PORT/v1; a context manager."""

    def __init__(self, upstream: str, kind: str = "chat", *, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown gateway kind {kind!r}; choose one of {', '.join(KINDS)}")
        self.upstream, self.kind = upstream.rstrip("/"), kind
        self.requests: Counter[str] = Counter()
        self._key = api_key
        self._http = http_library().Client(timeout=600,  # httpx or httpx2, as the openai installed
                                           headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> HostedGateway:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="hosted-gateway", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._http.close()

    def __enter__(self) -> HostedGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:  # never the key
        return f"HostedGateway({self.upstream!r}, {self.kind!r}, api_key={'***' if self._key else None})"

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may pass (any, without a key)."""
        if not self._key:
            return True
        return hmac.compare_digest((authorization or "").encode(), f"Bearer {self._key}".encode())

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """The gateway's answer to one request: ``(status, JSON body)``."""
        if method == "GET" and path == "/v1/models":
            status, listing = self._forward("GET", path, None)
            for entry in (listing or {}).get("data", []) if isinstance(listing, dict) else []:
                entry["owned_by"] = "organization-owner"  # not "llamacpp": a hosted API says nothing about its engine
                entry.pop("meta", None)
            return status, listing
        if self.kind == "chat-prefill" and method == "POST" and path == "/tokenize":
            return self._forward("POST", path, body)
        routes = {"/v1/chat/completions": ("top_logprobs", _CHAT_PARAMS)}
        if self.kind == "completions":
            routes["/v1/completions"] = ("logprobs", _COMPLETION_PARAMS)
        if method != "POST" or path not in routes:
            return 404, _error(f"Unknown request URL: {method} {path}", "invalid_request_error")
        if not isinstance(body, dict):
            return 400, _error("We could not parse the JSON body of your request.", "invalid_request_error")
        top_name, known = routes[path]
        unknown = sorted(set(body) - known)
        if unknown:
            return 400, _error(f"Unrecognized request argument supplied: {unknown[0]}", "invalid_request_error")
        top = body.get(top_name)
        if isinstance(top, int) and not isinstance(top, bool) and top > MAX_TOP_LOGPROBS:
            return 400, _error(f"Invalid '{top_name}': integer above maximum value. Expected a value <= "
                               f"{MAX_TOP_LOGPROBS}, but got {top} instead.", "invalid_request_error")
        prompt = body.get("prompt")
        if path == "/v1/completions" and not (isinstance(prompt, str) or (
                isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt))):
            return 400, _error("'prompt' must be a string or a list of strings", "invalid_request_error")
        status, answer = self._forward("POST", path, body)
        if status == 200 and isinstance(answer, dict):
            for choice in answer.get("choices") or []:
                if path == "/v1/completions":
                    _legacy_logprobs(choice)
                else:
                    _drop_ids(choice.get("logprobs"))
        return status, answer

    def _forward(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        self.requests[path] += 1
        response = self._http.request(method, self.upstream.removesuffix("/v1") + path, json=body)
        try:
            return response.status_code, response.json()
        except ValueError:
            return 502, _error(f"upstream answered {response.status_code} without JSON", "upstream_error")


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _drop_ids(logprobs: Any) -> None:
    """Chat logprobs as OpenAI returns them: ``token``, ``logprob``, ``bytes``, ``top_logprobs``; no ids."""
    for position in (logprobs or {}).get("content") or [] if isinstance(logprobs, dict) else []:
        position.pop("id", None)
        for alternative in position.get("top_logprobs") or []:
            alternative.pop("id", None)


def _legacy_logprobs(choice: dict[str, Any]) -> None:
    """Completions logprobs in the legacy shape hosted completions return (tokens collide by text)."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return
    choice["logprobs"] = {
        "tokens": [p.get("token", "") for p in content],
        "token_logprobs": [p.get("logprob") for p in content],
        "top_logprobs": [{a.get("token", ""): a.get("logprob") for a in p.get("top_logprobs") or []} for p in content],
    }


def _handler(gateway: HostedGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = ...
            if gateway.authorized(self.headers.get("Authorization")):
                status, answer = gateway.answer(method, self.path.split("?")[0], body)
            else:
                status, answer = 401, _error("Incorrect API key provided.", "invalid_request_error")
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._reply("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._reply("POST")

        def log_message(self, *args: Any) -> None:  # quiet: requests are counted instead
            pass

    return Handler
