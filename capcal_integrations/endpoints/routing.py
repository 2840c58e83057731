"""One routing key per list, so that a router in front of several servers sends every request of a
list to the same one.

A calibrated ranking is many short requests per list (the probe, ``/tokenize``, one prompt list per
decoding step) that share long prefixes: it is cheap only while they all reach the server that holds
the list's prefix in its cache. Routers pin requests to a server by a key they read from a header
(vllm-router's ``consistent_hash``: ``X-Session-ID``, then ``X-User-ID``, ...; LiteLLM:
``x-litellm-session-id``; the production-stack router: a header it is configured with) or from the
body's ``user`` field. Without a key, vllm-router hashes the whole body, which differs at every step.

:func:`for_list` gives each list a :class:`ListRoute`: a fresh random key (it says nothing about the
query or the passages), sent in the ``Options.routing_header`` header on every request of the list,
and in the body's ``user`` field on the OpenAI routes (``completions``, ``chat/completions``) of the
servers known to take it (``base.TAKES_USER``: llama.cpp ignores it, vLLM accepts it). Elsewhere (hosted APIs and gateways,
some of which refuse parameters they do not know) the header alone is sent; the probe's own requests,
sent before the server is known, carry the header only.

Slot pins are a separate matter: ``Options.routed`` says that the endpoint may send requests to more
than one server; then no llama.cpp slot is pinned (a slot number means nothing across servers) and
llama.cpp prompts go as token ids only (:mod:`.endpoints.llamacpp`), since routers validate the ``prompt`` field
and refuse llama.cpp's mixed text-and-ids prompts (vllm-router answers 422).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import OPENAI_ROUTES, TAKES_USER

if TYPE_CHECKING:
    from .calls import Call, EndpointState

__all__ = ["ListRoute", "for_list", "new_key", "check_header"]

#: Headers a routing key must not replace: the request would no longer authenticate or parse.
RESERVED = frozenset({"authorization", "content-type", "content-length", "host", "transfer-encoding",
                      "connection", "accept", "user-agent"})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)


def new_key() -> str:
    """A random key for one list: 128 bits from the operating system, derived from nothing.

    >>> len(new_key()), new_key() != new_key()
    (32, True)
    """
    return secrets.token_hex(16)


def check_header(name: Any) -> str | None:
    """``name`` if it can carry a routing key, else a message saying why not (``None``: it can).

    >>> check_header("X-Session-ID") is None, check_header("x-litellm-session-id") is None
    (True, True)
    >>> check_header("Authorization")
    'routing_header must not be Authorization: the request needs that header for itself'
    >>> check_header("X Session")
    "routing_header must be an HTTP header name (letters, digits, '-', ...), got 'X Session'"
    """
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        return f"routing_header must be an HTTP header name (letters, digits, '-', ...), got {name!r}"
    if name.lower() in RESERVED:
        return f"routing_header must not be {name}: the request needs that header for itself"
    return None


@dataclass(frozen=True)
class ListRoute:
    """The key of one list and how it goes on each request (:meth:`request`). ``state`` is the list's
    view of the endpoint: once probed, its capabilities say whether the body may carry ``user``."""

    header: str
    key: str
    state: EndpointState | None = None

    def request(self, call: Call) -> tuple[dict[str, Any], dict[str, Any]]:
        """The body to send for ``call`` and the ``openai`` request options that add the header.

        >>> from capcal_integrations.endpoints.calls import Call
        >>> route = ListRoute("X-Session-ID", "k1")
        >>> route.request(Call("POST", "/tokenize", {"content": "x"}, root=True))
        ({'content': 'x'}, {'headers': {'X-Session-ID': 'k1'}})
        """
        body = dict(call.body or {})
        caps = self.state.caps if self.state is not None else None
        if (call.method == "POST" and not call.root and call.path in OPENAI_ROUTES and caps is not None
                and caps.server in TAKES_USER and "user" not in body):
            body = {"user": self.key, **body}  # first: vllm-router reads the first "user" it finds in the text
        return body, {"headers": {self.header: self.key}}


def for_list(header: str | None, state: EndpointState | None = None) -> ListRoute | None:
    """A new :class:`ListRoute` for one list (``None`` when ``header`` is ``None``: no key is sent)."""
    return None if header is None else ListRoute(header, new_key(), state)
