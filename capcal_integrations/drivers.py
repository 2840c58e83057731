"""The only code that does I/O: run a :data:`~.protocol.Flow` with an ``openai`` client.

``run_sync`` and ``run_async`` are the two short drivers; everything they run is written once in
:mod:`.protocol` and :mod:`.strategies`. Retries (408/409/429/5xx with backoff) are the openai
client's own; what is left after them becomes a typed :mod:`.errors` exception, thrown into the flow
(probing catches "unsupported" answers; everything else propagates to the caller).
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import openai

from .errors import EndpointError, EndpointTimeout, EndpointUnreachable, ResponseError
from .protocol import Call, Flow, usage_of
from .types import Usage

T = TypeVar("T")


def server_root(base_url: str) -> str:
    """``http://host:port/v1/`` -> ``http://host:port`` (llama.cpp and vLLM serve extras at the root).

    >>> server_root("http://127.0.0.1:8080/v1/"), server_root("https://x.example/api")
    ('http://127.0.0.1:8080', 'https://x.example/api')
    """
    url = str(base_url).rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _url(client: Any, call: Call) -> str:
    return server_root(str(client.base_url)) + call.path if call.root else "/" + call.path


def _typed(err: Exception, call: Call) -> EndpointError:
    where = f"{call.method} {call.path}"
    if isinstance(err, openai.APITimeoutError):
        return EndpointTimeout(f"{where}: no answer in time ({err})")
    if isinstance(err, openai.APIConnectionError):
        return EndpointUnreachable(f"{where}: cannot reach the endpoint ({err})")
    if isinstance(err, openai.APIStatusError):
        return EndpointError(f"{where}: HTTP {err.status_code}: {str(err.body)[:300]}", status=err.status_code, body=err.body)
    return ResponseError(f"{where}: unreadable answer ({type(err).__name__}: {err})")


def _checked(answer: Any, call: Call) -> Any:
    if not isinstance(answer, (dict, list)):
        raise ResponseError(f"{call.method} {call.path}: expected JSON, got {str(answer)[:200]!r}", body=answer)
    return answer


def _send_sync(client: Any, call: Call) -> Any:
    try:
        if call.method == "GET":
            return _checked(client.get(_url(client, call), cast_to=object), call)
        return _checked(client.post(_url(client, call), cast_to=object, body=dict(call.body or {})), call)
    except (openai.OpenAIError, ValueError) as err:
        raise _typed(err, call) from err


async def _send_async(client: Any, call: Call, limit: asyncio.Semaphore) -> Any:
    async with limit:
        try:
            if call.method == "GET":
                return _checked(await client.get(_url(client, call), cast_to=object), call)
            return _checked(await client.post(_url(client, call), cast_to=object, body=dict(call.body or {})), call)
        except (openai.OpenAIError, ValueError) as err:
            raise _typed(err, call) from err


class _Run:
    """One flow being driven: the calls it waits for (``None`` once it has returned), its result and
    the usage the answers reported. An :class:`EndpointError` is thrown into the flow, which may
    handle it (probing does) or let it propagate to the caller."""

    def __init__(self, flow: Flow[Any]) -> None:
        self.flow, self.usage, self.result = flow, Usage(), None
        self.calls: list[Call] | None = self._advance(lambda: next(flow))

    def _advance(self, step: Any) -> list[Call] | None:
        try:
            return step()
        except StopIteration as stop:
            self.result = stop.value
            return None

    def send(self, answers: list[Any] | EndpointError) -> None:
        if isinstance(answers, EndpointError):
            self.calls = self._advance(lambda: self.flow.throw(answers))
            return
        for answer in answers:
            self.usage = self.usage + usage_of(answer)
        self.calls = self._advance(lambda: self.flow.send(answers))


def run_sync(flow: Flow[T], client: Any) -> tuple[T, Usage]:
    """Drive ``flow`` with a sync ``openai.OpenAI`` client, one call after another."""
    run = _Run(flow)
    while run.calls is not None:
        try:
            answers: list[Any] | EndpointError = [_send_sync(client, c) for c in run.calls]
        except EndpointError as err:
            answers = err
        run.send(answers)
    return run.result, run.usage


async def run_async(flow: Flow[T], client: Any, limit: asyncio.Semaphore) -> tuple[T, Usage]:
    """Drive ``flow`` with an ``openai.AsyncOpenAI`` client; each batch's calls run concurrently
    (at most ``limit`` in flight, shared with other flows)."""
    run = _Run(flow)
    while run.calls is not None:
        try:
            answers: list[Any] | EndpointError = list(await asyncio.gather(*(_send_async(client, c, limit)
                                                                              for c in run.calls)))
        except EndpointError as err:
            answers = err
        run.send(answers)
    return run.result, run.usage
