"""Typed errors raised by capcal-integrations.

The tree::

    CapCalError
     ├── InputError              bad arguments: empty query, unknown method, bad option values
     ├── CapabilityError         the endpoint lacks something a method needs (says what, and what still works)
     ├── EndpointError           the endpoint failed; carries ``status`` and ``body`` when there was a response
     │    │                       (``body``: the answer, or its first BODY_KEPT characters when longer)
     │    ├── EndpointTimeout     no answer within ``timeout`` (after retries)
     │    ├── EndpointUnreachable connection refused / DNS / TLS failure (after retries)
     │    └── ResponseError       an answer came back but is malformed or lacks the log-probabilities asked for
     ├── MissingExtra            an optional dependency is not installed (names the extra; also an ImportError)
     └── SetupError              the local model or server could not be set up
          ├── ModelError          weights could not be installed, assembled, verified or converted
          └── ServerError         a local server could not start (busy port, crash, not healthy in time)

Every message says what failed and, where there is one, what to do. Retries (408/409/429/5xx,
exponential backoff) happen inside the ``openai`` client before any of these is raised. No error is
ever turned into a score or into the input order.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

__all__ = [  # the error types (the package exports them all); excerpt, kept_body, request_url: helpers
    "CapCalError",
    "InputError",
    "CapabilityError",
    "EndpointError",
    "EndpointTimeout",
    "EndpointUnreachable",
    "ResponseError",
    "MissingExtra",
    "SetupError",
    "ModelError",
    "ServerError",
]


class CapCalError(Exception):
    """Base class of every error this library raises on purpose."""


class InputError(CapCalError, ValueError):
    """The caller passed something that cannot be reranked (e.g. an empty query)."""


class CapabilityError(CapCalError):
    """The endpoint cannot give what the chosen method needs.

    ``missing`` names the capability; ``alternatives`` lists methods that would still work.
    """

    def __init__(self, message: str, *, missing: str = "", alternatives: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing
        self.alternatives = alternatives


#: the most of an error answer an error keeps (characters of its JSON rendering): an answer may be megabytes
BODY_KEPT = 16_384


def excerpt(body: Any, limit: int = 160) -> str:
    """A short JSON rendering of ``body`` for error messages; only as much of it is rendered as is shown
    (an answer may be megabytes).

    >>> excerpt({"choices": "x" * 300}, 30)
    '{"choices": "xxxxxxxxxxxxxxxxx…'
    """
    text = ""
    try:
        for piece in json.JSONEncoder(ensure_ascii=False, default=repr).iterencode(body):
            text += piece
            if len(text) > limit:
                break
    except (TypeError, ValueError, RecursionError):
        text = reprlib.repr(body)
    return text if len(text) <= limit else text[:limit] + "…"


def kept_body(body: object) -> object:
    """``body`` as an error keeps it: itself when its JSON rendering is at most :data:`BODY_KEPT` characters,
    else that rendering's start (a string ending in "…"): a 40 MB error answer makes a small error.

    >>> kept_body({"error": "busy"}), len(kept_body("x" * 10**6))
    ({'error': 'busy'}, 16385)
    """
    shown = excerpt(body, BODY_KEPT)
    return shown if len(shown) > BODY_KEPT else body


#: what to do next, by HTTP status (the message says it after what failed)
KEY_HINT = ("the endpoint wants an API key: set CAPCAL_API_KEY with CAPCAL_BASE_URL (a key goes only with its own "
            "URL) or pass api_key=...; for a `capcal serve` server, `capcal key` prints its key")
NOT_FOUND_HINT = "does base_url end in /v1 (e.g. http://127.0.0.1:8080/v1)?"
UNREACHABLE_HINT = "is the server running there? (`capcal serve` starts the embedded one)"


class EndpointError(CapCalError):
    """The endpoint answered with an error status, or could not be used at all.

    Its message names the URL asked (:attr:`url`, credentials redacted) and, where the status says what
    to do, the next step: 401/403 the key (``CAPCAL_API_KEY``), 404 the ``/v1`` of ``base_url``.

    >>> str(EndpointError("GET models: HTTP 401: unauthorized", status=401, url="http://u:pw@h:8080/v1/models"))
    'GET models: HTTP 401: unauthorized (http://***@h:8080/v1/models); the endpoint wants an API key: set \
CAPCAL_API_KEY with CAPCAL_BASE_URL (a key goes only with its own URL) or pass api_key=...; for a `capcal serve` \
server, `capcal key` prints its key'
    """

    def __init__(self, message: str, *, status: int | None = None, body: object = None, url: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = kept_body(body)
        self._url = url

    @property
    def url(self) -> str | None:
        """The URL of the failed request, credentials redacted: the one given, else that of the ``openai``
        error this one was raised from (``raise EndpointError(...) from err``)."""
        url = self._url or request_url(self.__cause__)
        return _redacted(url) if url else None

    def hint(self) -> str:
        """The next step for this failure, or ``""``."""
        if self.status in (401, 403):
            return KEY_HINT
        if self.status == 404:
            return NOT_FOUND_HINT
        return ""

    def __str__(self) -> str:
        message, url, hint = super().__str__(), self.url, self.hint()
        if url and url not in message:
            message += f" ({url})"
        return f"{message}; {hint}" if hint and hint not in message else message


def request_url(err: BaseException | None) -> str | None:
    try:
        return str(err.request.url) if err is not None else None  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - no request behind it (openai raises this property's RuntimeError)
        return None


def _redacted(url: str) -> str:
    from .redaction import redact  # redaction imports nothing of ours; kept local so the tree stays first

    return redact(url)


class EndpointTimeout(EndpointError):
    """The endpoint did not answer in time (after the client's retries)."""


class EndpointUnreachable(EndpointError):
    """The endpoint could not be reached (connection refused, DNS, TLS); the message names the URL.

    >>> str(EndpointUnreachable("GET models: cannot reach the endpoint", url="http://127.0.0.1:9/v1/models"))
    'GET models: cannot reach the endpoint (http://127.0.0.1:9/v1/models); is the server running there? \
(`capcal serve` starts the embedded one)'
    """

    def hint(self) -> str:
        return UNREACHABLE_HINT


class ResponseError(EndpointError):
    """The endpoint answered, but the answer is malformed or lacks the requested log-probabilities.
    ``unreadable``: not even a JSON object (cut short, an HTML page): a failed answer, not a shape that says
    what the endpoint supports (a probe tries it again, then raises: it never reads it as "unsupported")."""

    def __init__(self, message: str, *, unreadable: bool = False, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.unreadable = unreadable


class MissingExtra(CapCalError, ImportError):
    """An optional dependency is missing; the message says how to install it (by default the extra).

    >>> str(MissingExtra("xllamacpp", "embedded"))
    'xllamacpp is not installed: pip install "capcal-integrations[embedded]"'
    """

    def __init__(self, package: str, extra: str, install: str | None = None) -> None:
        install = install or f'pip install "capcal-integrations[{extra}]"'
        super().__init__(f"{package} is not installed: {install}")
        self.package, self.extra = package, extra


class SetupError(CapCalError):
    """The local model or server could not be set up. ``details`` holds the long story (a log tail,
    pip's output), kept out of the one-line message."""

    def __init__(self, message: str, *, details: str = "") -> None:
        super().__init__(message)
        self.details = details


class ModelError(SetupError):
    """The model weights could not be installed, located, assembled, verified or converted."""


class ServerError(SetupError):
    """A local server could not start: busy port, crash during startup, not healthy in time."""
