"""One client configuration from which both ``openai`` clients are built.

Pass the settings (openai-python's vocabulary: ``base_url``, ``api_key``, ``timeout``, ``max_retries``,
``default_headers``, ``default_query``, ``http_client`` / ``async_http_client`` for proxies or custom
transports) or ready ``client`` / ``async_client`` objects. Given one ready client, the other is built
from *its* settings (URL, key, organization, project, headers, query, timeout, retries), so nothing
the user configured is lost; an explicit ``timeout`` or ``max_retries`` is applied to ready clients
too. Only a custom transport cannot cross from sync to async (an ``httpx.Client`` cannot serve
asyncio): pass ``async_http_client`` or ``async_client`` for that.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import logging
import math
import numbers
import os
import urllib.parse
import weakref
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import openai

from ..errors import InputError
from ..redaction import redact, redact_queries

log = logging.getLogger(__name__)

__all__ = ["Clients", "resolve_endpoint", "credentials_out_of_url", "warn_bare_url", "http_library", "DEFAULT_TIMEOUT",
           "DEFAULT_MAX_RETRIES", "PAIRS", "OPENAI_URL"]

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_RETRIES = 2
_NO_ENDPOINT = (
    "no endpoint configured: pass base_url=... (or client=...), or set CAPCAL_BASE_URL or OPENAI_BASE_URL. "
    "For the embedded local model run `capcal serve` in another terminal, then "
    "export CAPCAL_BASE_URL=$(capcal key --url) CAPCAL_API_KEY=$(capcal key)."
)


def http_library() -> ModuleType:
    """The HTTP library the installed ``openai`` is built on: ``httpx2`` for openai 3.x, ``httpx`` for 2.x.
    An ``http_client`` / ``async_http_client`` (proxies, custom transports, ``MockTransport``) must be one of
    its ``Client`` / ``AsyncClient``; both libraries have the same API.

    >>> http_library().__name__ == ("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    True
    """
    return importlib.import_module("httpx2" if _OPENAI_MAJOR >= 3 else "httpx")


_OPENAI_MAJOR = int(openai.__version__.split(".")[0])


#: OpenAI's own URL: ``$OPENAI_API_KEY`` goes there when no ``$OPENAI_BASE_URL`` names another
OPENAI_URL = "https://api.openai.com/v1"
#: the pairs of environment variables: a key goes only to the URL of its own pair
PAIRS = (("CAPCAL_BASE_URL", "CAPCAL_API_KEY"), ("OPENAI_BASE_URL", "OPENAI_API_KEY"))
NO_KEY = "not-needed"  # what keyless servers get (openai's client needs a string)


def _same(a: str | None, b: str | None) -> bool:
    return bool(a and b) and a.rstrip("/") == b.rstrip("/")  # type: ignore[union-attr]


def resolve_endpoint(base_url: str | None = None, api_key: str | None = None) -> tuple[str, str]:
    """The URL and the key to send it, each key only with its own URL:

    * the URL: ``base_url``, else ``$CAPCAL_BASE_URL``, else ``$OPENAI_BASE_URL``; none: an :class:`InputError`
      that says how to start the embedded server (``$CAPCAL_API_KEY`` alone names no URL: the library does not
      guess that whatever listens on 127.0.0.1:8080 is your ``capcal serve``);
    * the key: ``api_key``, else the environment's key of the URL's own pair (:data:`PAIRS`): ``$CAPCAL_API_KEY``
      when the URL is ``$CAPCAL_BASE_URL``, ``$OPENAI_API_KEY`` when it is ``$OPENAI_BASE_URL`` (or OpenAI's own
      URL with no ``$OPENAI_BASE_URL``), else none. ``$CAPCAL_API_KEY`` with a URL from ``$OPENAI_BASE_URL`` and no
      ``$OPENAI_API_KEY`` is an :class:`InputError` saying which goes with which.
    """
    env = os.environ
    url = base_url or env.get("CAPCAL_BASE_URL") or env.get("OPENAI_BASE_URL")
    if not url:
        raise InputError(_NO_ENDPOINT if not env.get("CAPCAL_API_KEY") else _KEY_WITHOUT_URL)
    if urllib.parse.urlsplit(url).query:  # the client appends /completions after it: ?key=K/completions
        raise InputError(f"base_url must not carry a query string ({redact_queries(redact(url))}): the routes are "
                         "appended after it, and a key there shows in request logs; pass the key as api_key=... "
                         "(or extra query parameters as default_query={...})")
    if api_key:
        return url, api_key
    for url_name, key_name in PAIRS:
        if env.get(key_name) and (_same(url, env.get(url_name)) or (
                key_name == "OPENAI_API_KEY" and not env.get(url_name) and _same(url, OPENAI_URL))):
            return url, env[key_name]
    if not base_url and env.get("CAPCAL_API_KEY") and not env.get("CAPCAL_BASE_URL"):
        raise InputError("CAPCAL_API_KEY is set but the URL comes from OPENAI_BASE_URL, and a key goes only with its "
                         "own URL: CAPCAL_API_KEY with CAPCAL_BASE_URL, OPENAI_API_KEY with OPENAI_BASE_URL. For your "
                         "capcal serve: export CAPCAL_BASE_URL=$(capcal key --url); for the OPENAI_BASE_URL endpoint: "
                         "set OPENAI_API_KEY (or pass api_key=...)")
    withheld = [k for u, k in PAIRS if env.get(k)]
    if withheld:
        log.info("no key sent to %s: %s go(es) only with its own URL (%s); pass api_key=... for this one", redact(url),
                 " and ".join(withheld), ", ".join(f"{k} with {u}" for u, k in PAIRS))
    return url, NO_KEY


_KEY_WITHOUT_URL = ("CAPCAL_API_KEY is set but no URL is: a key goes only with its own URL. For your capcal serve: "
                    "export CAPCAL_BASE_URL=$(capcal key --url) (or pass base_url=...)")


_bare_warned: set[str] = set()


def warn_bare_url(url: str) -> bool:
    """One WARNING per URL for a ``base_url`` with no path at all (``http://host:8080``): llama.cpp answers there
    too, so it works until the same code meets vLLM, SGLang or a hosted API, which serve only under ``/v1``
    (a 404 then). Whether it warned.

    >>> warn_bare_url("http://127.0.0.1:8080/v1"), warn_bare_url("https://x.example/api"), warn_bare_url("http://h:1")
    (False, False, True)
    """
    parts = urllib.parse.urlsplit(url)
    if parts.path.strip("/") or not parts.netloc or url in _bare_warned:
        return False
    _bare_warned.add(url)
    fixed = urllib.parse.urlunsplit(parts._replace(path="/v1"))
    log.warning("base_url %s has no /v1: llama.cpp answers there too, but vLLM, SGLang and hosted APIs serve only "
                "under /v1 (HTTP 404 there); use %s", redact(url), redact(fixed))
    return True


def credentials_out_of_url(url: str, headers: Mapping[str, str] | None) -> tuple[str, Mapping[str, str] | None]:
    """``url`` without ``user:password@``, and ``headers`` with the same credentials as HTTP Basic authorization
    (what httpx would have sent for them): no URL the library or httpx logs can hold them.

    >>> credentials_out_of_url("http://u:p%40ss@h:1/v1", None)
    ('http://h:1/v1', {'Authorization': 'Basic dTpwQHNz'})
    >>> credentials_out_of_url("http://h:1/v1", {"X": "1"})
    ('http://h:1/v1', {'X': '1'})
    """
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, headers
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()).decode()
    given = dict(headers or {})
    if not any(k.lower() == "authorization" for k in given):
        given["Authorization"] = f"Basic {token}"
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), given


def _settings_of(client: openai.OpenAI | openai.AsyncOpenAI) -> dict[str, Any]:
    return {"base_url": str(client.base_url), "api_key": client.api_key, "organization": client.organization,
            "project": client.project, "timeout": client.timeout, "max_retries": client.max_retries,
            "default_headers": dict(client._custom_headers) or None, "default_query": dict(client._custom_query) or None}


def _check_limits(timeout: Any, max_retries: Any) -> None:
    """``timeout`` (seconds, or an ``httpx.Timeout``) is a finite number > 0; ``max_retries`` an integer >= 0."""
    if isinstance(timeout, bool) or (isinstance(timeout, numbers.Real) and not (math.isfinite(timeout) and timeout > 0)):
        raise InputError(f"timeout must be a finite number of seconds > 0 (or an httpx.Timeout), got {timeout!r}")
    if max_retries is not None and not (isinstance(max_retries, int) and not isinstance(max_retries, bool)
                                        and max_retries >= 0):
        raise InputError(f"max_retries must be an integer >= 0, got {max_retries!r}")


class Clients:
    """The sync client and the async clients of one endpoint. The async client is one per event
    loop when this class builds it (an httpx pool cannot outlive the loop it was made in, and scripts
    often call ``asyncio.run`` more than once)."""

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None, timeout: float | None = None,
                 max_retries: int | None = None, default_headers: Mapping[str, str] | None = None,
                 default_query: Mapping[str, object] | None = None, http_client: Any = None,
                 async_http_client: Any = None, client: openai.OpenAI | None = None,
                 async_client: openai.AsyncOpenAI | None = None) -> None:
        _check_limits(timeout, max_retries)
        overrides = {k: v for k, v in (("timeout", timeout), ("max_retries", max_retries)) if v is not None}
        if overrides:
            client = client.with_options(**overrides) if client is not None else None
            async_client = async_client.with_options(**overrides) if async_client is not None else None
        ready = client or async_client
        if ready is not None:
            if base_url or api_key or default_headers or default_query or http_client:
                raise InputError("pass either a ready client or connection settings (base_url, api_key, headers, "
                                 "http_client), not both")
            self.settings = _settings_of(ready)
        else:
            url, key = resolve_endpoint(base_url, api_key)
            url, default_headers = credentials_out_of_url(url, default_headers)
            self.settings = {
                "base_url": url,
                "api_key": key,
                "timeout": DEFAULT_TIMEOUT if timeout is None else timeout,
                "max_retries": DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
                "default_headers": default_headers, "default_query": default_query}
        self._client, self._http_client = client, http_client
        self._async_client, self._async_http_client = async_client, async_http_client
        self._per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        warn_bare_url(str(self.settings["base_url"]))

    @property
    def base_url(self) -> str:
        return self.settings["base_url"]

    @property
    def sync(self) -> openai.OpenAI:
        """The sync client (the one given, else built once from the settings)."""
        if self._client is None:
            self._client = openai.OpenAI(**self.settings, http_client=self._http_client)
        return self._client

    @property
    def async_(self) -> openai.AsyncOpenAI:
        """The async client for the running event loop."""
        if self._async_client is not None:
            return self._async_client
        if self._async_http_client is not None:  # the user's transport: one client, bound to their loop
            self._async_client = openai.AsyncOpenAI(**self.settings, http_client=self._async_http_client)
            return self._async_client
        loop = asyncio.get_running_loop()
        made = self._per_loop.get(loop)
        if made is None:
            made = self._per_loop[loop] = openai.AsyncOpenAI(**self.settings)
        return made
