"""Where a command sends its requests, and with which key: :class:`Endpoint`, what
:func:`~.launcher.endpoint` yields (the pair ``(base_url, model)`` and the ``api_key`` to send there).

The key is the local server's own, :data:`NO_KEY` for one that checks none, or None for an endpoint the caller
named; never the ambient ``$OPENAI_API_KEY`` for a server the launcher found or started.
"""

from __future__ import annotations

__all__ = ["Endpoint", "NO_KEY"]

#: Sent to a local server that checks no key (the hosted gateway): any key, so long as the openai
#: client does not fall back on ``$OPENAI_API_KEY``.
NO_KEY = "no-key"


class Endpoint(tuple):
    """What :func:`~.launcher.endpoint` yields: the pair ``(base_url, model)`` (so ``as (url, model)`` still
    unpacks), plus :attr:`api_key`, the key to send there.

    ``api_key`` is the local server's own key (or :data:`NO_KEY` for one that checks none), and None
    for an endpoint the caller named: then the caller's own key applies (``--api-key``, else the
    openai client's ``$OPENAI_API_KEY``).

    >>> e = Endpoint("http://127.0.0.1:8080/v1", None, "k")
    >>> url, model = e
    >>> (url, model, e.api_key, e == ("http://127.0.0.1:8080/v1", None))
    ('http://127.0.0.1:8080/v1', None, 'k', True)
    """

    api_key: str | None

    def __new__(cls, base_url: str, model: str | None, api_key: str | None = None) -> Endpoint:
        self = super().__new__(cls, (base_url, model))
        self.api_key = api_key
        return self

    @property
    def base_url(self) -> str:
        return self[0]

    @property
    def model(self) -> str | None:
        return self[1]

    def __repr__(self) -> str:  # never the key
        return f"Endpoint({self[0]!r}, {self[1]!r}, api_key={'***' if self.api_key else None})"
