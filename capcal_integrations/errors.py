"""Typed errors raised by capcal-integrations.

The tree::

    CapCalError
     ├── InputError              bad arguments: empty query, unknown method, bad option values
     ├── CapabilityError         the endpoint lacks something a method needs (says what, and what still works)
     └── EndpointError           the endpoint failed; carries ``status`` and ``body`` when there was a response
          ├── EndpointTimeout     no answer within ``timeout`` (after retries)
          ├── EndpointUnreachable connection refused / DNS / TLS failure (after retries)
          └── ResponseError       an answer came back but is malformed or lacks the log-probabilities asked for

Retries (408/409/429/5xx, exponential backoff) happen inside the ``openai`` client before any
of these is raised. No error is ever turned into a score or into the input order.
"""

from __future__ import annotations

__all__ = [
    "CapCalError",
    "InputError",
    "CapabilityError",
    "EndpointError",
    "EndpointTimeout",
    "EndpointUnreachable",
    "ResponseError",
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


class EndpointError(CapCalError):
    """The endpoint answered with an error status, or could not be used at all."""

    def __init__(self, message: str, *, status: int | None = None, body: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class EndpointTimeout(EndpointError):
    """The endpoint did not answer in time (after the client's retries)."""


class EndpointUnreachable(EndpointError):
    """The endpoint could not be reached (connection refused, DNS, TLS)."""


class ResponseError(EndpointError):
    """The endpoint answered, but the answer is malformed or lacks the requested log-probabilities."""
