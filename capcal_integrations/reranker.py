"""``CapCalReranker``: the public entry point. Each call is one
:func:`~capcal_integrations.ranking.strategies.rerank_flow` run by a driver, on its own view of the shared
per-endpoint state (:meth:`~capcal_integrations.endpoints.calls.EndpointState.for_ranking`);
this module only holds configuration and that state."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import openai

from .content_check.check import ContentDecision, Pending
from .content_check.decision import decision_key
from .content_check.judged import arank_judged, fresh_judged, label_decision, rank_judged
from .content_check.registry import adopt, decision_of
from .content_check.saved_decisions import Store
from .endpoints.calls import EndpointState
from .endpoints.probe import capabilities
from .endpoints.routing import ListRoute, for_list
from .errors import InputError
from .options import Options, option_docs
from .ranking.progress import Watched
from .ranking.strategies import rerank_flow
from .transport.background import BackgroundReadings
from .transport.client import Clients
from .transport.drivers import run_async, run_sync, together
from .types import Capabilities, Ranking, Usage

__all__ = ["CapCalReranker"]

log = logging.getLogger("capcal_integrations")


class CapCalReranker:
    """Rerank passages with an LLM listwise reranker, calibrated against position bias.

    Talks to any OpenAI-compatible endpoint that exposes log-probabilities (llama.cpp's server,
    vLLM, SGLang). The connection follows the ``openai`` SDK: keyword-only ``base_url``, ``api_key``,
    ``model``, ``timeout``, ``max_retries``, ``default_headers``, ``default_query``, ``http_client`` /
    ``async_http_client``, or ready ``client`` / ``async_client`` objects (see :mod:`.client`).
    ``base_url`` falls back to ``$CAPCAL_BASE_URL`` then ``$OPENAI_BASE_URL``; ``model`` to
    ``$CAPCAL_MODEL``, then the first model the endpoint lists.

    Every other keyword argument is a ranking option (:class:`~.options.Options`):

    {options}
    """

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                 timeout: float | None = None, max_retries: int | None = None,
                 default_headers: Mapping[str, str] | None = None, default_query: Mapping[str, object] | None = None,
                 http_client: Any = None, async_http_client: Any = None, client: openai.OpenAI | None = None,
                 async_client: openai.AsyncOpenAI | None = None, **options: Any) -> None:
        self.options = Options().replace(**options)
        if model is not None and not (isinstance(model, str) and model):
            raise InputError(f"model must be a non-empty string or None (the first model listed), got {model!r}")
        self._clients = Clients(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries,
                                default_headers=default_headers, default_query=default_query, http_client=http_client,
                                async_http_client=async_http_client, client=client, async_client=async_client)
        self._state = EndpointState(model or os.environ.get("CAPCAL_MODEL"))
        self._limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # decisions kept across processes (.saved_decisions), in the folder of the environment when it was made
        self._state.decisions = Store.here()
        # the content check's readings run on one thread of this endpoint's (shared by with_options copies), over
        # the sync client, or where a transport was given for async alone, over it on the thread's own event loop
        self._readings = BackgroundReadings()
        self._readings_in_thread = (client is not None or http_client is not None
                                    or (async_client is None and async_http_client is None))

    # ------------------------------------------------------------------ configuration

    def with_options(self, **changes: Any) -> CapCalReranker:
        """A copy with other ranking options (same clients, same probed endpoint and caches).

        >>> # rr.with_options(method="vanilla").rerank(query, passages)
        """
        clone = object.__new__(CapCalReranker)
        clone.__dict__.update(self.__dict__)
        clone.options = self.options.replace(**changes)
        if clone.options.concurrency != self.options.concurrency:
            clone._limits = weakref.WeakKeyDictionary()
        return clone

    def settings(self) -> dict[str, Any]:
        """The ranking options in force, as keyword arguments (the inverse of :meth:`with_options`)."""
        return self.options.settings()

    @property
    def method(self) -> str:
        return self.options.method

    @property
    def model(self) -> str | None:
        """The served model's name (known after the first call or :meth:`capabilities`)."""
        return self._state.caps.model if self._state.caps else self._state.model

    @property
    def client(self) -> openai.OpenAI:
        return self._clients.sync

    @property
    def async_client(self) -> openai.AsyncOpenAI:
        """The async client for the running event loop."""
        return self._clients.async_

    def content_decision(self) -> ContentDecision | None:
        """The content check's decision for this reranker's model, prompt and placeholder (print it; save its
        ``to_json()`` and pass it as ``decision=`` to another process), or ``None`` while it is being decided."""
        return decision_of(self._state, self.options)

    def wait_for_readings(self, timeout: float | None = None) -> bool:
        """Block until the content check's background readings handed over so far are done (at most ``timeout``
        seconds; ``True``: none is left). For a script or benchmark that times other work next: a reading in
        flight shares the server with it."""
        return self._readings.wait(timeout)

    def decide(self, judged: Iterable[tuple[str, Sequence[Any], Sequence[int]]]) -> ContentDecision:
        """Decide from judged queries whether to calibrate this model (:mod:`.judged`): ``(query, passages,
        grades)`` triples, each ranked calibrated, in its given order and uncalibrated; "calibrate" (``reads``) once
        an anytime-valid test says calibrating beats the given order by nDCG@10 (at most 2.5 % wrong where it does
        not, however often decide() is called). The queries are pooled with those judged before on this key (a
        query judged before counts once), and the decision is set and kept like the content check's own: every
        reranker on this model and reading options uses it."""
        caps = self.capabilities()
        current = decision_of(self._state, self.options)
        triples, ids = fresh_judged(judged, decision_key(caps.model, caps.weights, self.options), current)
        if not triples:
            return current  # type: ignore[return-value]  # every query judged before: the decision as it was
        scores = rank_judged(self, triples)
        return adopt(self._state, self.options, label_decision(caps, self.options, scores, ids), "labels")

    async def adecide(self, judged: Iterable[tuple[str, Sequence[Any], Sequence[int]]]) -> ContentDecision:
        """Async :meth:`decide`."""
        caps = await self.acapabilities()
        current = await asyncio.to_thread(decision_of, self._state, self.options)
        triples, ids = fresh_judged(judged, decision_key(caps.model, caps.weights, self.options), current)
        if not triples:
            return current  # type: ignore[return-value]
        scores = await arank_judged(self, triples)
        return await asyncio.to_thread(adopt, self._state, self.options, label_decision(caps, self.options, scores, ids),
                                       "labels")

    def capabilities(self) -> Capabilities:
        """Probe the endpoint once (about seven small requests) and cache what it can do."""
        return run_sync(capabilities(self._state), self.client, for_list(self.options.routing_header))[0]

    async def acapabilities(self) -> Capabilities:
        route = for_list(self.options.routing_header)
        return (await run_async(capabilities(self._state), self.async_client, self._limit(), route))[0]

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        limit = self._limits.get(loop)
        if limit is None:
            limit = self._limits[loop] = asyncio.Semaphore(self.options.concurrency)
        return limit

    # ------------------------------------------------------------------ reranking

    def rerank(self, query: str, passages: Sequence[Any], *, progress: Callable[[int], None] | None = None) -> Ranking:
        """Rank ``passages`` (``str``, :class:`~.types.Document`, dicts with ``text`` or objects with
        ``page_content``) for ``query``. Returns a :class:`~.types.Ranking` whose ``order`` is always a
        permutation of ``range(len(passages))``. ``progress``: called with the number of requests asked for so far,
        after each batch (a long ranking's sign of life; the adapters' ``progress=True`` draws it as a bar)."""
        state, route = self._session()
        flow = rerank_flow(state, self.options, query, passages)
        return _with_usage(*run_sync(Watched(flow, progress) if progress else flow, self.client, route,
                                     self.options.deadline))

    async def arerank(self, query: str, passages: Sequence[Any], *,
                      progress: Callable[[int], None] | None = None) -> Ranking:
        """Async :meth:`rerank`: the same flow, driven by the async client."""
        return await self._arerank(query, passages, self._limit(), progress)

    async def _arerank(self, query: str, passages: Sequence[Any], limit: asyncio.Semaphore,
                       progress: Callable[[int], None] | None = None) -> Ranking:
        state, route = self._session()
        flow = rerank_flow(state, self.options, query, passages)
        return _with_usage(*await run_async(Watched(flow, progress) if progress else flow, self.async_client, limit,
                                            route, self.options.deadline))

    def _session(self, background: bool = True) -> tuple[EndpointState, ListRoute | None]:
        """One call's view of the endpoint state (its lists read for the check handed to the reading thread, or,
        ``background=False``, read inside the call) and the list's routing key (a new one per list: .routing)."""
        view = self._state.for_ranking(self.options.routed, self._read_in_thread if background else None)
        return view, for_list(self.options.routing_header, view)

    # ------------------------------------------------------------------ the content check's readings

    def _read_in_thread(self, pending: Pending) -> None:
        """Take a content-check reading off the request path: on this endpoint's reading thread
        (:class:`~.transport.background.BackgroundReadings`), over the sync client, or over the async client on
        the thread's own event loop where only an async transport was given (a caller's loop may close under a
        task: ``asyncio.run`` per call)."""
        readings = self._readings

        def work() -> None:
            view, route = self._session(background=False)
            if self._readings_in_thread:
                reading, _ = run_sync(pending.flow(view), self.client, route)
            else:
                async def read() -> Any:
                    return await run_async(pending.flow(view), self.async_client, self._limit(), route)
                reading, _ = readings.loop().run_until_complete(read())
            pending.deliver(reading)

        readings.submit(work, pending)

    def rerank_many(self, items: Iterable[tuple[str, Sequence[Any]]], *, concurrency: int | None = None) -> list[Ranking]:
        """Rerank several ``(query, passages)`` pairs, ``concurrency`` at a time (threads over the sync
        client); results in input order. The first error (in input order) is raised once the lists being
        ranked have finished; those not started yet are not started."""
        items, concurrency = pairs_of(items), _concurrency(concurrency)
        caps = self.capabilities()  # probe once, not once per thread
        workers = min(concurrency or self.options.concurrency, self._lists_at_once(caps))
        failed = threading.Event()  # set by the first list that raises: no list starts after it

        def one(pair: tuple[Any, Sequence[Any]]) -> Ranking | None:
            if failed.is_set():
                return None  # never looked at: an earlier list (in input order) raised
            try:
                return self.rerank(*pair)
            except BaseException:
                failed.set()
                raise

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, items))  # type: ignore[arg-type]  # raises before reaching a None

    async def arerank_many(self, items: Iterable[tuple[str, Sequence[Any]]], *,
                           concurrency: int | None = None) -> list[Ranking]:
        """Async :meth:`rerank_many`: all queries' requests share one limit of ``concurrency`` in flight.
        On the first error the other lists are cancelled, and it is raised once none is running."""
        items, concurrency = pairs_of(items), _concurrency(concurrency)
        limit = self._limit() if concurrency is None else asyncio.Semaphore(concurrency)
        gate = asyncio.Semaphore(self._lists_at_once(await self.acapabilities()))  # probe once, not once per query

        async def one(query: str, passages: Sequence[Any]) -> Ranking:
            async with gate:
                return await self._arerank(query, passages, limit)

        return await together([one(q, p) for q, p in items])

    def _lists_at_once(self, caps: Capabilities) -> int:
        """How many lists to rank at once. A llama.cpp server keeps one prompt per slot: with more live
        prompts than slots, each request evicts another's cached prompt and the whole prompt is
        recomputed at every step, so at most ``slots // prompts per list`` lists run at once there
        (4 for capcal on the embedded server's 8 slots). Unlimited elsewhere (vLLM shares one cache)."""
        if not caps.slots:
            return 1 << 30
        o = self.options
        prompts = (2 if o.calibrated else 1) * (o.m if o.how.shuffles else 1)
        return max(1, caps.slots // prompts)


def _with_usage(ranking: Ranking, usage: Usage) -> Ranking:
    return replace(ranking, usage=usage)


def pairs_of(items: Any) -> list[tuple[Any, Any]]:
    """``items`` as a list of ``(query, passages)`` pairs, or an :class:`~.errors.InputError` naming the bad one."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InputError(f"items must be an iterable of (query, passages) pairs, got {type(items).__name__}")
    pairs = []
    for i, item in enumerate(items):
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            raise InputError(f"items[{i}] must be a (query, passages) pair, got {type(item).__name__}")
        pairs.append((item[0], item[1]))
    return pairs


def _concurrency(value: Any) -> int | None:
    """``None`` (the reranker's option) or an integer >= 1: ``0`` hung ``arerank_many`` forever."""
    if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise InputError(f"concurrency must be an integer >= 1 or None, got {value!r}")
    return value


CapCalReranker.__doc__ = (CapCalReranker.__doc__ or "").replace(
    "{options}", "\n    ".join(f"{name}: {doc}" for name, doc in option_docs().items()))
