"""One HTTP exchange with an endpoint, bounded in size and, under a deadline, in wall-clock time.

The ``openai`` client sends the request (its headers, key, retries on 408/409/429/5xx); the answer's
body is read here, incrementally, so that two bounds hold whatever the server sends:

* **size**: at most :data:`MAX_BODY` bytes (after any content decoding) are read; a longer answer is a
  :class:`~.errors.ResponseError` that names the bound, raised before anything is parsed;
* **time**: under a :class:`~.deadline.Deadline`, a read timeout alone bounds each read, not the whole
  answer (a server that trickles a byte every 0.15 s never trips it). So the sync exchange runs in a
  worker thread the caller waits for at most the time left, and the async one is cancelled by the
  driver (:func:`~.drivers.together`); either way the reading stops at the next chunk and the
  connection is closed, which tells llama.cpp and vLLM to stop the request.

Error messages quote an excerpt of the answer (:func:`~.answers.excerpt`), never the whole of it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..endpoints.answers import excerpt
from ..errors import EndpointTimeout, EndpointUnreachable, ResponseError
from .client import http_library

httpx2 = http_library()  # the installed openai's HTTP library: httpx2 (openai 3.x) or httpx (2.x)

__all__ = ["MAX_BODY", "send", "asend", "decode", "Stopped"]

#: The largest answer read, in bytes (after content decoding): the largest this library's requests get
#: back (a prompt list's top-1000 alternatives, a long ``/tokenize``) is about a tenth of it.
MAX_BODY = 8 * 2**20
_STREAMED = {"X-Stainless-Raw-Response": "stream"}  # the openai client returns the response unread


class Stopped(Exception):  # noqa: N818 - a signal: the caller stopped waiting (its deadline passed)
    """Raised in a worker thread whose caller no longer waits for its answer."""


def _streamed(options: Mapping[str, Any]) -> dict[str, Any]:
    return {**options, "headers": {**(options.get("headers") or {}), **_STREAMED}}


def _transport_errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """(timeouts, other transport failures) of httpx2 and, if a client of it is in use, legacy httpx."""
    modules = list(dict.fromkeys([httpx2, *([sys.modules["httpx"]] if "httpx" in sys.modules else [])]))
    return tuple(m.TimeoutException for m in modules), tuple(m.HTTPError for m in modules)


def decode(data: bytes | bytearray, where: str) -> Any:
    """The JSON value of an answer's body; a :class:`~.errors.ResponseError` quoting its start otherwise.

    >>> decode(b'{"a": 1}', "GET models")
    {'a': 1}
    >>> decode(b"<html>" + b"x" * 10**6, "GET models")
    Traceback (most recent call last):
    ...
    capcal_integrations.errors.ResponseError: GET models: the answer is not JSON: "<html>xxxxxxxxxxxxxxxxxxx…
    """
    try:
        return json.loads(bytes(data))
    except (ValueError, RecursionError):
        head = bytes(data[:100]).decode("utf-8", "replace")
        raise ResponseError(f"{where}: the answer is not JSON: {excerpt(head, 26)}", body=head, unreadable=True) from None


def _grow(body: bytearray, chunk: bytes, where: str) -> None:
    """``chunk`` added to ``body``; a :class:`~.errors.ResponseError` past :data:`MAX_BODY` bytes."""
    body += chunk
    if len(body) > MAX_BODY:
        raise ResponseError(f"{where}: the answer is larger than the bound of {MAX_BODY} bytes (MAX_BODY); it starts "
                            f"{excerpt(bytes(body[:160]).decode('utf-8', 'replace'), 40)}")


def _collect(chunks: Iterable[bytes], where: str, stop: Callable[[], bool] | None = None) -> bytearray:
    """The body from ``chunks``, refused past :data:`MAX_BODY` bytes; :class:`Stopped` as soon as ``stop()``."""
    body = bytearray()
    for chunk in chunks:
        if stop is not None and stop():
            raise Stopped()
        _grow(body, chunk, where)
    return body


def _exchange(client: Any, method: str, url: str, body: Any, options: Mapping[str, Any], where: str,
              stop: Callable[[], bool] | None = None) -> Any:
    kwargs = {"body": body} if method == "POST" else {}
    response = getattr(client, method.lower())(url, cast_to=httpx2.Response, options=_streamed(options), **kwargs)
    try:
        with _reading(where):
            return decode(_collect(response.iter_bytes(), where, stop), where)
    finally:
        response.close()


@contextmanager
def _reading(where: str) -> Iterator[None]:
    """The transport's errors while an answer is read, as the library's: a timeout, or a broken connection."""
    timeouts, failures = _transport_errors()
    try:
        yield
    except timeouts as err:
        raise EndpointTimeout(f"{where}: the answer stopped coming ({type(err).__name__})") from None
    except failures as err:
        raise EndpointUnreachable(f"{where}: the connection broke while reading the answer ({type(err).__name__})"
                                  ) from None


def send(client: Any, method: str, url: str, body: Any, options: Mapping[str, Any], where: str,
         wait: float | None = None) -> Any:
    """One exchange with a sync ``openai`` client: the answer's JSON. With ``wait`` (seconds), the exchange
    runs in a worker thread and :class:`Stopped` is raised when it has not finished by then; the thread
    then stops reading at its next chunk and closes the connection (a read timeout ends it otherwise)."""
    if wait is None:
        return _exchange(client, method, url, body, options, where)
    done, outcome, abandoned = threading.Event(), {}, threading.Event()

    def work() -> None:
        try:
            outcome["answer"] = _exchange(client, method, url, body, options, where, abandoned.is_set)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
            outcome["error"] = err
        finally:
            done.set()

    threading.Thread(target=work, name="capcal-request", daemon=True).start()
    if not done.wait(max(wait, 0.0)):
        abandoned.set()
        raise Stopped()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["answer"]


async def asend(client: Any, method: str, url: str, body: Any, options: Mapping[str, Any], where: str) -> Any:
    """One exchange with an async ``openai`` client: the answer's JSON (its deadline is the caller's
    cancellation, which closes the response)."""
    kwargs = {"body": body} if method == "POST" else {}
    response = await getattr(client, method.lower())(url, cast_to=httpx2.Response, options=_streamed(options),
                                                      **kwargs)
    try:
        with _reading(where):
            data = bytearray()
            async for chunk in response.aiter_bytes():
                _grow(data, chunk, where)
            return decode(data, where)
    finally:
        await response.aclose()

