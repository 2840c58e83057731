"""``CapCalReranker``: the public entry point (configuration, caching, sync and async drivers)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace
from typing import Any

import openai

from .drivers import run_async, run_sync
from .errors import InputError
from .prompts import TEMPLATES, PromptTemplate, resolve_template
from .protocol import probe
from .strategies import Options, rerank_flow
from .types import Capabilities, Ranking, as_document

log = logging.getLogger(__name__)

__all__ = ["CapCalReranker", "resolve_base_url", "OPTION_NAMES"]

#: The ranking options of :class:`CapCalReranker`, as its keyword arguments and :meth:`~CapCalReranker.with_options` name them.
OPTION_NAMES = ("method", "alpha", "calibration", "placeholder", "template", "labels", "probability", "window", "stride",
                "m", "seed", "max_passage_words", "max_context", "top_logprobs", "concurrency")

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_RETRIES = 2
_NO_ENDPOINT = (
    "no endpoint configured: pass base_url=... (or client=...), or set CAPCAL_BASE_URL or OPENAI_BASE_URL. "
    "For the embedded local model run `capcal serve` in another terminal and use base_url='http://127.0.0.1:8080/v1'."
)


def resolve_base_url(base_url: str | None = None) -> str:
    """``base_url``, else ``$CAPCAL_BASE_URL``, else ``$OPENAI_BASE_URL``; an :class:`InputError` that
    says how to start the embedded server when none is set."""
    url = base_url or os.environ.get("CAPCAL_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
    if not url:
        raise InputError(_NO_ENDPOINT)
    return url


class _Shared:
    """State shared by a reranker and its :meth:`CapCalReranker.with_options` copies: the clients,
    the probed capabilities, tokenized labels and rendered chat templates."""

    def __init__(self, client: Any, async_client: Any, model: str | None) -> None:
        self.client, self.async_client, self.model = client, async_client, model
        self.caps: Capabilities | None = None
        self.cache: dict[str, dict] = {"labels": {}, "templates": {}, "slots": {}}
        self.lock = threading.Lock()
        self.limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.loop_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CapCalReranker:
    """Rerank passages with an LLM listwise reranker, calibrated against position bias.

    Talks to any OpenAI-compatible endpoint that exposes log-probabilities (llama.cpp's server,
    vLLM, SGLang). Configuration follows the ``openai`` SDK: keyword-only ``base_url``, ``api_key``,
    ``model``, ``timeout``, ``max_retries``, or ready ``client`` / ``async_client`` objects.

    Args:
        method: ``"capcal"`` (default), ``"vanilla"``, ``"first-token"``, ``"first-token-capcal"``
            or ``"psc"``.
        alpha: ``"adaptive"`` (the released rule ``min(5 H / log|C|, 2)``) or a fixed strength.
        calibration: ``"additive"`` (the paper's ``p - alpha (q - 1/|C|)``) or ``"log"``.
        placeholder: the passage body of the content-free prompt (``""`` allowed).
        template: a :class:`~.prompts.PromptTemplate` or ``"rank_zephyr"`` / ``"rank_gpt"``.
        labels: ``"numeric"`` (``[1]``..) or ``"alpha"`` (``[A]``..).
        probability: ``"joint"`` (exact joint label probability) or ``"trie"`` (cheaper).
        window, stride: sliding window for long lists (20 and 10).
        m, seed: shuffles for ``psc``.
        max_passage_words: words kept per passage before the token budget applies (300).
        max_context: context size in tokens; default: what the server reports.
        top_logprobs: top-k asked per request (the endpoint's maximum is used for re-asks).
        concurrency: requests in flight at once for the async API and ``*_many``.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        client: openai.OpenAI | None = None,
        async_client: openai.AsyncOpenAI | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        method: str = "capcal",
        alpha: float | str = "adaptive",
        calibration: str = "additive",
        placeholder: str | None = None,
        template: PromptTemplate | str = "rank_zephyr",
        labels: str = "numeric",
        probability: str = "joint",
        window: int = 20,
        stride: int = 10,
        m: int = 5,
        seed: int = 0,
        max_passage_words: int | None = 300,
        max_context: int | None = None,
        top_logprobs: int = 20,
        concurrency: int = 8,
    ) -> None:
        template = resolve_template(template)
        options = dict(method=method, alpha=alpha, calibration=calibration, template=template, label_style=labels,
                       probability=probability, window=window, stride=stride, m=m, seed=seed,
                       max_passage_words=max_passage_words, max_context=max_context, top_logprobs=top_logprobs)
        if placeholder is not None:
            options["placeholder"] = placeholder
        self.options = Options(**options)
        if concurrency < 1:
            raise InputError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        if client is None and async_client is None:
            url = resolve_base_url(base_url)
            key = api_key or os.environ.get("OPENAI_API_KEY") or "not-needed"
            client = openai.OpenAI(base_url=url, api_key=key, timeout=timeout, max_retries=max_retries)
        self._shared = _Shared(client, async_client, model or os.environ.get("CAPCAL_MODEL"))

    # ------------------------------------------------------------------ configuration

    def with_options(self, **changes: Any) -> CapCalReranker:
        """A copy with other ranking options (same clients, same probed endpoint and caches).

        >>> # rr.with_options(method="vanilla").rerank(query, passages)
        """
        clone = object.__new__(CapCalReranker)
        clone.__dict__.update(self.__dict__)
        if "labels" in changes:
            changes["label_style"] = changes.pop("labels")
        if "template" in changes:
            changes["template"] = resolve_template(changes["template"])
        clone.concurrency = changes.pop("concurrency", self.concurrency)
        unknown = set(changes) - {f.name for f in fields(Options)}
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(sorted(unknown))}")
        clone.options = replace(self.options, **changes)
        return clone

    def settings(self) -> dict[str, Any]:
        """The ranking options in force, as keyword arguments (the inverse of :meth:`with_options`).
        A built-in template is given by name."""
        o = self.options
        values = {name: getattr(o, name) for name in OPTION_NAMES if hasattr(o, name)}
        values.update(labels=o.label_style, concurrency=self.concurrency,
                      template=o.template.name if TEMPLATES.get(o.template.name) is o.template else o.template)
        return values

    @property
    def method(self) -> str:
        return self.options.method

    @property
    def model(self) -> str | None:
        """The served model's name (known after the first call or :meth:`capabilities`)."""
        return self._shared.caps.model if self._shared.caps else self._shared.model

    @property
    def client(self) -> openai.OpenAI:
        shared = self._shared
        if shared.client is None:
            a = shared.async_client
            shared.client = openai.OpenAI(base_url=str(a.base_url), api_key=a.api_key, timeout=a.timeout,
                                          max_retries=a.max_retries)
        return shared.client

    @property
    def async_client(self) -> openai.AsyncOpenAI:
        """The async client: the one given, else one per running event loop (an httpx pool cannot
        outlive the loop it was made in, and scripts often call ``asyncio.run`` more than once)."""
        shared = self._shared
        if shared.async_client is not None:
            return shared.async_client
        loop = asyncio.get_running_loop()
        made = shared.loop_clients.get(loop)
        if made is None:
            c = shared.client
            made = shared.loop_clients[loop] = openai.AsyncOpenAI(
                base_url=str(c.base_url), api_key=c.api_key, timeout=c.timeout, max_retries=c.max_retries)
        return made

    def capabilities(self) -> Capabilities:
        """Probe the endpoint once (about six small requests) and cache what it can do."""
        shared = self._shared
        with shared.lock:
            if shared.caps is None:
                shared.caps, _ = run_sync(probe(shared.model, self.options.max_context), self.client)
        return shared.caps

    async def acapabilities(self) -> Capabilities:
        shared = self._shared
        if shared.caps is None:
            caps, _ = await run_async(probe(shared.model, self.options.max_context), self.async_client, self._limit())
            shared.caps = shared.caps or caps
        return shared.caps

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        limit = self._shared.limits.get(loop)
        if limit is None:
            limit = self._shared.limits[loop] = asyncio.Semaphore(self.concurrency)
        return limit

    # ------------------------------------------------------------------ reranking

    @staticmethod
    def _validated(query: str, passages: Sequence[Any]) -> tuple[str, list]:
        """Check the input before any request is made."""
        if not isinstance(query, str) or not query.strip():
            raise InputError("query must be a non-empty string")
        try:
            return query.strip(), [as_document(p) for p in passages]
        except TypeError as err:
            raise InputError(str(err)) from err

    def _flow(self, caps: Capabilities, query: str, passages: Sequence[Any]):
        query, docs = self._validated(query, passages)
        return rerank_flow(caps, self.options, query, docs, self._shared.cache)

    def rerank(self, query: str, passages: Sequence[Any]) -> Ranking:
        """Rank ``passages`` (``str``, :class:`~.types.Document`, dicts with ``text`` or objects with
        ``page_content``) for ``query``. Returns a :class:`~.types.Ranking` whose ``order`` is always a
        permutation of ``range(len(passages))``."""
        passages = list(passages)
        self._validated(query, passages)
        if len(passages) <= 1:
            return self._flow_result_trivial(query, passages)
        caps = self.capabilities()
        ranking, usage = run_sync(self._flow(caps, query, passages), self.client)
        return replace(ranking, usage=usage)

    async def arerank(self, query: str, passages: Sequence[Any]) -> Ranking:
        """Async :meth:`rerank`: the same flow, driven by the async client."""
        return await self._arerank(query, passages, self._limit())

    async def _arerank(self, query: str, passages: Sequence[Any], limit: asyncio.Semaphore) -> Ranking:
        passages = list(passages)
        self._validated(query, passages)
        if len(passages) <= 1:
            return self._flow_result_trivial(query, passages)
        caps = await self.acapabilities()
        ranking, usage = await run_async(self._flow(caps, query, passages), self.async_client, limit)
        return replace(ranking, usage=usage)

    def _flow_result_trivial(self, query: str, passages: list) -> Ranking:
        flow = self._flow(Capabilities("", False, 0, ""), query, passages)  # validates; needs no endpoint
        try:
            next(flow)
        except StopIteration as stop:
            return stop.value
        raise AssertionError("a list of at most one passage needs no model call")

    def rerank_many(self, items: Iterable[tuple[str, Sequence[Any]]], *, concurrency: int | None = None) -> list[Ranking]:
        """Rerank several ``(query, passages)`` pairs, ``concurrency`` at a time (threads over the sync
        client); results in input order. The first error is raised."""
        items = list(items)
        self.capabilities()
        with ThreadPoolExecutor(max_workers=concurrency or self.concurrency) as pool:
            return list(pool.map(lambda qp: self.rerank(*qp), items))

    async def arerank_many(self, items: Iterable[tuple[str, Sequence[Any]]], *,
                           concurrency: int | None = None) -> list[Ranking]:
        """Async :meth:`rerank_many`: all queries' requests share one limit of ``concurrency`` in flight."""
        limit = self._limit() if concurrency is None else asyncio.Semaphore(concurrency)
        await self.acapabilities()  # probe once, not once per query
        return list(await asyncio.gather(*(self._arerank(q, p, limit) for q, p in items)))
