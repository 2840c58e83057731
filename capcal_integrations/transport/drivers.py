"""The only code that does I/O: run a :data:`~capcal_integrations.endpoints.calls.Flow` with an ``openai`` client.

``run_sync`` and ``run_async`` are the two short drivers; everything they run is written once in
:mod:`~capcal_integrations.endpoints` and :mod:`~capcal_integrations.ranking.strategies`.
Retries (408/409/429/5xx with backoff) are the openai
client's own; what is left after them becomes a typed :mod:`.errors` exception, thrown into the flow
(probing catches "unsupported" answers; everything else propagates to the caller). An answer that is not
a JSON object, or whose ``usage`` is malformed, is a :class:`~.errors.ResponseError` thrown the same way.

Nothing is left running behind an error: when one request of an async batch fails, the others are
cancelled and awaited before the error reaches the flow (whose ``finally`` then releases the slot pins
of the batch), and a flow the driver leaves early (cancelled, or an error it does not catch) is closed. The
sync driver sends a batch's calls one after another, except calls pinned to different llama.cpp slots (a
calibrated step's real and empty streams), which it sends together and waits for, every one, before the flow
gets the answers or the first failure: the server then computes both streams in the same batches.

Each answer is read by :mod:`.transfer`: at most :data:`~.transfer.MAX_BODY` bytes. With a ``deadline``
(seconds, :mod:`.deadline`), each request is bounded by the wall clock, whatever the server's pacing (the
sync driver waits for its exchange, run in a worker thread, at most the time left, which is also each
read's timeout; the async driver cancels the batch), with the client's retries off; when it passes, the
requests in flight are abandoned (their connections closed, which makes llama.cpp and vLLM stop them)
and :class:`~.deadline.DeadlinePassed` is thrown into the flow, which returns what it has decided.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import openai

from ..endpoints.answers import excerpt, usage_of
from ..endpoints.calls import Call, Flow
from ..endpoints.routing import ListRoute
from ..errors import EndpointError, EndpointTimeout, EndpointUnreachable, ResponseError, request_url
from ..ranking.deadline import Deadline, DeadlinePassed
from ..types import Usage
from . import transfer

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
    if isinstance(err, openai.APIStatusError):  # its body bounded (.errors.kept_body); raised apart from err (_detached)
        return EndpointError(f"{where}: HTTP {err.status_code}: {excerpt(err.body, 300)}", status=err.status_code,
                             body=err.body, url=request_url(err))
    return ResponseError(f"{where}: unreadable answer ({type(err).__name__}: {err})", unreadable=True)


def _checked(answer: Any, call: Call) -> Any:
    """Every route used answers a JSON object; anything else is malformed."""
    if not isinstance(answer, dict):
        raise ResponseError(f"{call.method} {call.path}: expected a JSON object, got {excerpt(answer)}", body=answer,
                            unreadable=True)
    return answer


def _request(call: Call, route: ListRoute | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body and the ``openai`` request options of ``call``: the list's routing key on it, if any."""
    return route.request(call) if route is not None else (dict(call.body or {}), {})


def _send_sync(client: Any, call: Call, route: ListRoute | None = None, deadline: Deadline | None = None) -> Any:
    body, options = _request(call, route)
    where, wait = f"{call.method} {call.path}", None
    if deadline is not None:  # each read bounded by the time left (or the client's timeout, if shorter) ...
        options = {**options, **deadline.request_options()}  # nothing is sent once it is gone
        own = getattr(client, "timeout", None)
        if isinstance(own, (int, float)) and not isinstance(own, bool) and own < options["timeout"]:
            options["timeout"] = own
        wait = deadline.left()  # ... and the whole exchange by the wall clock (transfer.send)
    try:
        return _checked(transfer.send(client, call.method, _url(client, call), body, options, where, wait), call)
    except transfer.Stopped as err:
        raise DeadlinePassed(abandoned=1) from err
    except openai.APITimeoutError as err:
        if deadline is not None and deadline.left() <= 0:  # cut off by the deadline (the connection is closed)
            raise DeadlinePassed(abandoned=1) from err
        raise _typed(err, call) from err
    except EndpointTimeout as err:
        if deadline is not None and deadline.left() <= 0:
            raise DeadlinePassed(abandoned=1) from err
        raise
    except (openai.OpenAIError, ValueError) as err:
        failure = _detached(err, call)
    raise failure


def _detached(err: Exception, call: Call) -> EndpointError:
    """The typed error of ``err``, raised ``from err`` here unless ``err`` is an HTTP error status: that one is
    returned, for the caller to raise outside its ``except`` block, so that nothing keeps ``err`` (``openai``'s
    error holds the whole answer, twice: a 40 MB error answer would make a 40 MB exception)."""
    failure = _typed(err, call)
    if not isinstance(err, openai.APIStatusError):
        raise failure from err
    return failure


async def _send_async(client: Any, call: Call, limit: asyncio.Semaphore, route: ListRoute | None = None,
                      deadline: Deadline | None = None) -> Any:
    body, options = _request(call, route)
    if deadline is not None:  # bounded by the batch's cancellation (run_async), not by a timeout error
        options = {**options, "max_retries": 0}
    async with limit:
        try:
            return _checked(await transfer.asend(client, call.method, _url(client, call), body, options,
                                                 f"{call.method} {call.path}"), call)
        except (openai.OpenAIError, ValueError) as err:
            failure = _detached(err, call)
    raise failure


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

    def send(self, answers: list[Any] | EndpointError | DeadlinePassed) -> None:
        if isinstance(answers, DeadlinePassed):  # the answers that came back count; the flow returns what it has
            passed = answers
            self.usage = sum((usage_of(a) for a in passed.answered), self.usage + Usage(requests=passed.abandoned))
            self.calls = self._advance(lambda: self.flow.throw(passed))
            return
        if not isinstance(answers, EndpointError):
            try:
                usage = sum((usage_of(answer) for answer in answers), Usage())
            except ResponseError as err:
                answers = err
            else:
                self.usage = self.usage + usage
        if isinstance(answers, EndpointError):
            error = answers
            self.calls = self._advance(lambda: self.flow.throw(error))
            return
        self.calls = self._advance(lambda: self.flow.send(answers))

    def close(self) -> None:
        """Close the flow if it has not returned (its ``finally`` blocks run: slot pins are released)."""
        if self.calls is not None:
            self.flow.close()


def run_sync(flow: Flow[T], client: Any, route: ListRoute | None = None, deadline: float | None = None
             ) -> tuple[T, Usage]:
    """Drive ``flow`` with a sync ``openai.OpenAI`` client, a batch's calls one after another (those pinned to
    different llama.cpp slots together: :func:`_round_sync`); every call carries
    ``route``'s key (:mod:`.routing`) when one is given, and is bounded by the ``deadline`` if any."""
    run, clock = _Run(flow), None if deadline is None else Deadline(deadline)
    try:
        while run.calls is not None:
            run.send(_round_sync(client, run.calls, route, clock))
    finally:
        run.close()
    return run.result, run.usage


def _round_sync(client: Any, calls: list[Call], route: ListRoute | None, clock: Deadline | None
                ) -> list[Any] | EndpointError | DeadlinePassed:
    """One batch's answers, or what to throw into the flow. Calls pinned to different llama.cpp slots are sent
    together, each in a thread of its own, so that the server computes them in the same batches (a calibrated
    step's real and empty streams: one pass of the model for both, not two); the round returns once every one
    has come back, and the first failure in the calls' order is what the flow gets. Other calls go one after
    another, and the first failure stops the round."""
    if len(calls) > 1 and _apart(calls):
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:  # leaving the block waits for every call
            futures = [pool.submit(_send_sync, client, c, route, clock) for c in calls]
        failures = [f.exception() for f in futures if f.exception() is not None]
        if not failures:
            return [f.result() for f in futures]
        if not isinstance(failures[0], (EndpointError, DeadlinePassed)):
            raise failures[0]
        if isinstance(failures[0], EndpointError):
            return failures[0]
        return DeadlinePassed([f.result() for f in futures if f.exception() is None],
                              sum(getattr(x, "abandoned", 0) for x in failures))
    answers: list[Any] = []
    try:
        for c in calls:
            answers.append(_send_sync(client, c, route, clock))
    except EndpointError as err:
        return err
    except DeadlinePassed as passed:
        return DeadlinePassed(answers, passed.abandoned)
    return answers


def _apart(calls: list[Call]) -> bool:
    """Every call pinned to a llama.cpp slot (:attr:`~.calls.Call.slot`), no two to the same one."""
    slots = [c.slot for c in calls]
    return None not in slots and len(set(slots)) == len(slots)


async def run_async(flow: Flow[T], client: Any, limit: asyncio.Semaphore, route: ListRoute | None = None,
                    deadline: float | None = None) -> tuple[T, Usage]:
    """Drive ``flow`` with an ``openai.AsyncOpenAI`` client; each batch's calls run concurrently
    (at most ``limit`` in flight, shared with other flows), and when one fails the others are cancelled
    and awaited before the error is thrown into the flow (see :func:`together`). With a ``deadline``, a
    batch still running when it passes is cancelled the same way."""
    run, clock = _Run(flow), None if deadline is None else Deadline(deadline)
    try:
        while run.calls is not None:
            try:
                if clock is not None and clock.left() <= 0:
                    raise DeadlinePassed()
                answers: list[Any] | EndpointError | DeadlinePassed = await together(
                    [_send_async(client, c, limit, route, clock) for c in run.calls],
                    timeout=None if clock is None else clock.left())
            except (EndpointError, DeadlinePassed) as err:
                answers = err
            run.send(answers)
    finally:
        run.close()
    return run.result, run.usage


async def together(coroutines: list[Coroutine[Any, Any, T]], timeout: float | None = None) -> list[T]:
    """Run ``coroutines`` concurrently; their results in order. When one fails, the others are cancelled
    and awaited, then the first failure (in the order given) is raised: nothing is still running when
    the error reaches the caller (``asyncio.TaskGroup``'s semantics, which Python 3.10 lacks; a plain
    ``asyncio.gather`` leaves the others running). The same when the caller is cancelled, and after
    ``timeout`` seconds: then :class:`~.deadline.DeadlinePassed` carries the answers that came back."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in tasks:  # retrieved, so that asyncio does not log them as never retrieved
            if not task.cancelled():
                task.exception()
    failures = [t for t in tasks if t in done and not t.cancelled() and t.exception() is not None]
    if failures:
        raise failures[0].exception()
    if len(done) < len(tasks):  # the timeout: what came back, and how many were abandoned
        raise DeadlinePassed([t.result() for t in tasks if t in done], len(tasks) - len(done))
    return [t.result() for t in tasks]
