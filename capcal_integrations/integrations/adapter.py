"""What the framework adapters share: their pydantic settings, how they build the core reranker (from
connection settings, a :class:`~capcal_integrations.CapCalReranker`, or the user's own LLM object:
:meth:`RerankerSettings.from_llm`), and what their end events carry (:func:`rerank_summary`).

``llamaindex_ext.CapCalRerank`` and ``langchain_ext.CapCalRerank`` both inherit :class:`RerankerSettings`
(before the framework's base class). Its ranking fields are generated from
:class:`~capcal_integrations.options.Options`, so a new option of the core appears in both adapters
with its documentation. pydantic comes with ``openai``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model

from ..content_check.decision import ContentDecision
from ..errors import InputError
from ..options import OPTION_NAMES, Options
from ..prompts.render import PromptTemplate  # noqa: F401 - in the signature IDEs see
from ..redaction import redact
from ..reranker import CapCalReranker
from ..types import Ranking
from .llm_clients import clients_of

__all__ = ["RerankerSettings", "rerank_summary", "metadata_key", "METADATA_KEY", "FALLBACK_METADATA_KEY"]

_CONNECTION = ("base_url", "model", "timeout", "max_retries")
#: what the adapters add to a returned item's metadata goes under this one key ...
METADATA_KEY = "capcal"
#: ... or under this one where the item's own metadata already has a ``"capcal"`` entry (kept as it was)
FALLBACK_METADATA_KEY = "capcal_rerank"
_SECRET_NAME = re.compile(r"auth|key|token|secret|password|sig", re.I)


def metadata_key(metadata: Mapping[str, Any]) -> str:
    """The key under which the adapters put their details in a returned item's ``metadata``: ``"capcal"``,
    or ``"capcal_rerank"`` where the caller's metadata already holds a ``"capcal"`` of its own (then
    ``"capcal_rerank_2"``, ...): a user's entries are never overwritten.

    >>> metadata_key({}), metadata_key({"capcal": "mine"}), metadata_key({"capcal": 1, "capcal_rerank": 2})
    ('capcal', 'capcal_rerank', 'capcal_rerank_2')
    """
    if METADATA_KEY not in metadata:
        return METADATA_KEY
    key, n = FALLBACK_METADATA_KEY, 1
    while key in metadata:
        n += 1
        key = f"{FALLBACK_METADATA_KEY}_{n}"
    return key


def _option_fields() -> dict[str, Any]:
    hints = typing.get_type_hints(Options)
    return {f.name: ((f.metadata["accepts"] or hints[f.name]) | None, Field(None, description=f.metadata["doc"]))
            for f in fields(Options)}


_RankingOptions = create_model("_RankingOptions", __config__=ConfigDict(arbitrary_types_allowed=True),
                               **_option_fields())


class RerankerSettings(_RankingOptions):
    """The options of an adapter: ``top_n``, the connection (init only) and every ranking option.

    Pass either ``reranker=CapCalReranker(...)`` (its clients and caches are shared) or the
    connection settings (``base_url``, ``model``, ``api_key``, ``client``, ``async_client``, ...), or
    build it from an LLM object the application already has with :meth:`from_llm`.
    Ranking options left ``None`` take the core's defaults and are then filled in with the values in
    force; changing one later (``rerank.method = "vanilla"``) applies from the next call. ``depth`` left
    ``None`` follows ``top_n``: only the places returned are decoded (set ``depth`` to the list length,
    or ``top_n=None``, to decode every place).
    """

    # a misspelt option is an error; an assignment (``rerank.top_n = 0``) is checked as the constructor checks
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", validate_assignment=True)

    top_n: int | None = Field(5, ge=1, description="Items to return, best first; None returns all, reordered.")
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint (init only; credentials in it are shown as ***); default "
                          "$CAPCAL_BASE_URL, then $OPENAI_BASE_URL.")
    model: str | None = Field(None, description="Served model name (init only); default: the first served.")
    timeout: float | None = Field(None, description="Request timeout in seconds (init only).")
    max_retries: int | None = Field(None, description="Retries on 408/409/429/5xx (init only).")
    progress: bool | None = Field(None, description="A bar on stderr counting each ranking's requests as they go "
                                                    "(tqdm); None: only when stderr is a terminal.")

    _reranker: CapCalReranker = PrivateAttr()
    _last_ranking: Ranking | None = PrivateAttr(default=None)

    if typing.TYPE_CHECKING:  # what IDEs show: every field (tests/test_adapter_copies.py checks it against the model)
        def __init__(self, *, reranker: CapCalReranker | None = None, api_key: str | None = None, client: Any = None,
                     async_client: Any = None, top_n: int | None = 5, base_url: str | None = None, model: str | None = None,
                     timeout: float | None = None, max_retries: int | None = None, progress: bool | None = None,
                     preset: str | None = None,
                     method: str | None = None, alpha: float | str | None = None, guard: float | str | None = None,
                     check_lists: int | None = None, check_wait: bool | None = None, decision: str | None = None,
                     calibration: str | None = None,
                     normalise: bool | None = None, placeholder: str | None = None,
                     template: str | PromptTemplate | None = None, prompt: str | None = None, decoding: str | None = None,
                     labels: str | None = None, probability: str | None = None, window: int | None = None,
                     stride: int | None = None, depth: int | None = None, deadline: float | None = None, m: int | None = None,
                     seed: int | None = None, max_passage_words: int | None = None, max_context: int | None = None,
                     top_logprobs: int | None = None, concurrency: int | None = None, routing_header: str | None = None,
                     routed: bool | None = None) -> None: ...
    else:
        def __init__(self, *, reranker: CapCalReranker | None = None, api_key: str | None = None,
                     client: Any = None, async_client: Any = None, **fields: Any) -> None:
            try:
                super().__init__(**fields)
            except ValidationError as err:  # the library's error, as every other bad argument
                raise InputError(_said(err)) from None
            connection = {k: fields[k] for k in _CONNECTION if fields.get(k) is not None}  # as given (base_url unredacted)
            connection.update((k, v) for k, v in (("api_key", api_key), ("client", client),
                                                  ("async_client", async_client)) if v is not None)
            if reranker is not None and connection:
                raise InputError(f"pass either reranker=... or connection settings ({', '.join(connection)}), not both")
            # an option given as None means None (guard=None: always calibrate), not "the default"
            options = {k: getattr(self, k) for k in OPTION_NAMES if k in fields or getattr(self, k) is not None}
            base = reranker or CapCalReranker(**connection)
            self._reranker = base.with_options(**options) if options else base
            shown = base._clients.settings  # what runs, so a dump can rebuild it (from_dict) and never holds a credential
            self.base_url = redact(str(shown["base_url"]))
            self.model = self._reranker.model
            for name in ("timeout", "max_retries"):
                if getattr(self, name) is None and isinstance(shown.get(name), (int, float)):
                    setattr(self, name, shown[name])
            for name, value in self._reranker.settings().items():  # so the config shows what runs
                if getattr(self, name) is None:
                    setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        """Fields are checked on assignment as in the constructor: an :class:`InputError` (``top_n = 0``, an
        unknown method), never a silent empty result."""
        if name in OPTION_NAMES and value is not None and "_reranker" in (self.__pydantic_private__ or {}):
            self._reranker.with_options(**{name: value})  # the core's own check
        try:
            super().__setattr__(name, value)
        except ValidationError as err:
            raise InputError(_said(err)) from None

    # ------------------------------------------------------------------ copies and pickles

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        """A deep copy that shares the core reranker (its HTTP clients and endpoint caches are not data);
        ``model_copy(deep=True)`` uses it too."""
        memo = {} if memo is None else memo
        memo[id(self._reranker)] = self._reranker
        return BaseModel.__deepcopy__(self, memo)

    def __getstate__(self) -> dict[str, Any]:
        """The fields and how to reconnect, never a credential: the key is read again from the environment
        when unpickled (``$CAPCAL_API_KEY``, then ``$OPENAI_API_KEY``). A custom HTTP client does not travel."""
        state = BaseModel.__getstate__(self)
        private = dict(state.get("__pydantic_private__") or {})
        private["_reranker"] = None
        state["__pydantic_private__"] = private
        state["capcal_connection"] = _connection_of(self._reranker)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        connection = state.pop("capcal_connection")
        BaseModel.__setstate__(self, state)
        needs_key = connection.pop("needs_key")
        if needs_key and not (os.environ.get("CAPCAL_API_KEY") or os.environ.get("OPENAI_API_KEY")):
            raise InputError(f"this {type(self).__name__} was pickled without its API key (keys never go into a "
                             "pickle): set CAPCAL_API_KEY (or OPENAI_API_KEY) in this process before unpickling")
        object.__setattr__(self, "__pydantic_private__", {**(self.__pydantic_private__ or {}),
                                                          "_reranker": CapCalReranker(**connection)})

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.__signature__ = _signature(cls)  # type: ignore[misc]  # every field, not ``**fields``

    @classmethod
    def from_llm(cls, llm: Any, *, model: str | None = None, **fields: Any) -> Any:
        """The adapter on the endpoint of an LLM object the application already has: LangChain's
        ``ChatOpenAI`` / ``OpenAI`` (langchain-openai) or LlamaIndex's ``OpenAI`` / ``OpenAILike``
        (llama-index-llms-openai / -openai-like), or any object holding ``openai`` clients the same way.

        Its ``openai`` client is reused as it is: base URL, key, organization, timeout, retries, headers
        and HTTP client (proxies, custom transports). The async client is reused where the object was
        given its own async HTTP client; otherwise one is built per event loop from the same settings.
        The key stays inside the ``openai`` clients: it is not a field of the adapter, so it appears in no
        repr, dump or trace. ``model`` defaults to the object's model. Every other keyword is a field of
        the adapter (``top_n``, ranking options). An object with no OpenAI-compatible endpoint behind it is
        an :class:`~capcal_integrations.errors.InputError`.

        >>> # rerank = CapCalRerank.from_llm(ChatOpenAI(base_url=..., model=...), top_n=5)
        """
        sync, async_, llm_model = clients_of(llm)
        reranker = CapCalReranker(client=sync, async_client=async_, model=model or llm_model)
        return cls(reranker=reranker, **fields)

    @property
    def reranker(self) -> CapCalReranker:
        """The core reranker with the current options (``depth`` from ``top_n`` when not set)."""
        options = {k: getattr(self, k) for k in OPTION_NAMES}
        if options["depth"] is None and self.top_n is not None:
            options["depth"] = self.top_n
        return self._reranker.with_options(**options)

    @contextlib.contextmanager
    def _progress(self, passages: int) -> Iterator[Callable[[int], None] | None]:
        """The ``progress`` callback of one ranking: a tqdm bar of its requests (``progress``; ``None``: when stderr
        is a terminal), closed when the ranking ends; ``None`` when off."""
        on = self.progress if self.progress is not None else sys.stderr.isatty()
        if not on:
            yield None
            return
        from tqdm import tqdm

        with tqdm(desc=f"capcal: ranking {passages} passages", unit=" requests", leave=False) as bar:
            yield lambda asked: bar.update(asked - bar.n)

    def decide(self, retriever: Any, dataset: Any) -> ContentDecision:
        """Decide from ``dataset``'s labels whether to calibrate this model, with ``retriever`` as the first stage:
        the adapter's ``judged`` triples (its framework's retriever and dataset, graded) through
        :meth:`CapCalReranker.decide <capcal_integrations.CapCalReranker.decide>`
        with this adapter's reranker and options. The decision is kept like the content check's own."""
        return self.reranker.decide(self.judged(retriever, dataset))  # type: ignore[attr-defined]

    async def adecide(self, retriever: Any, dataset: Any) -> ContentDecision:
        """Async :meth:`decide`."""
        return await self.reranker.adecide(await self.ajudged(retriever, dataset))  # type: ignore[attr-defined]

    @property
    def last_ranking(self) -> Ranking | None:
        """The full Ranking of the latest call on this instance (with concurrent queries, read each
        item's ``metadata["capcal"]`` instead)."""
        return self._last_ranking


def _said(err: ValidationError) -> str:
    """A pydantic error as one line: ``field: what is wrong (got value)``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']} (got {e.get('input')!r})"
                     for e in err.errors())


def _connection_of(reranker: CapCalReranker) -> dict[str, Any]:
    """How to rebuild ``reranker``'s clients in another process, without the key; an :class:`InputError` where
    a credential sits elsewhere (in the URL, a header or a query parameter), since it must not be pickled."""
    settings = reranker._clients.settings
    url = str(settings["base_url"])
    headers, query = dict(settings.get("default_headers") or {}), dict(settings.get("default_query") or {})
    hidden = [f"header {k}" for k in headers if _SECRET_NAME.search(k)] + [f"query {k}" for k in query
                                                                             if _SECRET_NAME.search(k)]
    if redact(url) != url or hidden:
        where = ", ".join(hidden) or "base_url"
        raise InputError(f"this adapter carries a credential in its {where}, which never goes into a pickle: pass the "
                         "key as api_key=... or $CAPCAL_API_KEY (re-read when unpickled) and a base_url without it")
    connection = {"base_url": url, "model": reranker._state.model, "default_headers": headers or None,
                  "default_query": query or None, "needs_key": settings.get("api_key") not in (None, "not-needed")}
    for name in ("timeout", "max_retries", "organization", "project"):
        if settings.get(name) is not None:
            connection[name] = settings[name]
    return connection


def _signature(cls: type) -> inspect.Signature:
    """``cls``'s constructor as IDEs and ``help()`` should show it: the connection keywords, then every field."""
    explicit = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
                for name, annotation in (("reranker", "CapCalReranker | None"), ("api_key", "str | None"),
                                         ("client", "openai.OpenAI | None"),
                                         ("async_client", "openai.AsyncOpenAI | None"))]
    from_fields = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info.get_default(),
                                     annotation=info.annotation)
                   for name, info in cls.model_fields.items()]
    return inspect.Signature(explicit + from_fields)


def rerank_summary(ranking: Ranking, model: str | None, seconds: float) -> dict[str, Any]:
    """What an adapter's end event carries about one reranking: the method that ran, the model, the
    usage (HTTP requests, prompt, completion and cached tokens as the server reported them), the wall
    time, how many places were decided (``decoded``, None: all), whether the top window kept its first-stage
    order because the model showed no content signal (``kept_given_order``), whether the deadline cut it
    (``partial``) and the notes.

    >>> from capcal_integrations.types import Usage
    >>> s = rerank_summary(Ranking((1, 0), (0.2, 0.9), "capcal", usage=Usage(4, 900, 4, 700)), "local", 0.51234)
    >>> s["usage"], s["seconds"], s["partial"]
    ({'requests': 4, 'prompt_tokens': 900, 'completion_tokens': 4, 'cached_tokens': 700}, 0.512, False)
    """
    usage = ranking.usage
    return {"method": ranking.method, "model": model,
            "usage": {"requests": usage.requests, "prompt_tokens": usage.prompt_tokens,
                      "completion_tokens": usage.completion_tokens, "cached_tokens": usage.cached_tokens},
            "seconds": round(seconds, 3), "passages": len(ranking.order), "decoded": ranking.decoded,
            "kept_given_order": ranking.kept_given_order, "partial": ranking.partial, "notes": list(ranking.notes)}
