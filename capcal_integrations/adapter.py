"""What the framework adapters share: their pydantic settings, how they build the core reranker (from
connection settings, a :class:`~capcal_integrations.CapCalReranker`, or the user's own LLM object:
:meth:`RerankerSettings.from_llm`), and what their end events carry (:func:`rerank_summary`).

``llamaindex_ext.CapCalRerank`` and ``langchain_ext.CapCalRerank`` both inherit :class:`RerankerSettings`
(before the framework's base class). Its ranking fields are generated from
:class:`~capcal_integrations.options.Options`, so a new option of the core appears in both adapters
with its documentation. pydantic comes with ``openai``.
"""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any

import openai
from pydantic import ConfigDict, Field, PrivateAttr, create_model

from .errors import InputError
from .options import OPTION_NAMES, Options
from .reranker import CapCalReranker
from .types import Ranking

__all__ = ["RerankerSettings", "clients_of", "rerank_summary"]

_CONNECTION = ("base_url", "model", "timeout", "max_retries")


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

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")  # a misspelt option is an error

    top_n: int | None = Field(5, ge=1, description="Items to return, best first; None returns all, reordered.")
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint (init only); default $CAPCAL_BASE_URL, then $OPENAI_BASE_URL.")
    model: str | None = Field(None, description="Served model name (init only); default: the first served.")
    timeout: float | None = Field(None, description="Request timeout in seconds (init only).")
    max_retries: int | None = Field(None, description="Retries on 408/409/429/5xx (init only).")

    _reranker: CapCalReranker = PrivateAttr()
    _last_ranking: Ranking | None = PrivateAttr(default=None)

    def __init__(self, *, reranker: CapCalReranker | None = None, api_key: str | None = None,
                 client: Any = None, async_client: Any = None, **fields: Any) -> None:
        super().__init__(**fields)
        connection = {k: getattr(self, k) for k in _CONNECTION if getattr(self, k) is not None}
        connection.update((k, v) for k, v in (("api_key", api_key), ("client", client),
                                              ("async_client", async_client)) if v is not None)
        if reranker is not None and connection:
            raise InputError(f"pass either reranker=... or connection settings ({', '.join(connection)}), not both")
        options = {k: getattr(self, k) for k in OPTION_NAMES if getattr(self, k) is not None}
        base = reranker or CapCalReranker(**connection)
        self._reranker = base.with_options(**options) if options else base
        self.model = self._reranker.model
        for name, value in self._reranker.settings().items():  # so the config shows what runs
            if getattr(self, name) is None:
                setattr(self, name, value)

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

    @property
    def last_ranking(self) -> Ranking | None:
        """The full Ranking of the latest call on this instance (with concurrent queries, read each
        item's ``metadata["capcal"]`` instead)."""
        return self._last_ranking


def clients_of(llm: Any) -> tuple[openai.OpenAI, openai.AsyncOpenAI | None, str | None]:
    """The ``openai`` clients and the model name of a framework's LLM object.

    LangChain (langchain-openai) keeps them as ``root_client`` / ``root_async_client`` (``ChatOpenAI``)
    or behind the ``client`` resource (``OpenAI``: ``client._client``), its model as ``model_name``;
    LlamaIndex (llama-index-llms-openai and OpenAI-like) builds them with ``_get_client()`` /
    ``_get_aclient()`` from its own fields, its model as ``model``. The async client is returned only
    where the object has its own async HTTP client (``http_async_client``, ``async_http_client``), since
    a default one would be shared across event loops.
    """
    sync = _client_in(llm, ("root_client", "client", "_client"), openai.OpenAI)
    async_ = _client_in(llm, ("root_async_client", "async_client", "_aclient"), openai.AsyncOpenAI)
    if sync is None and callable(getattr(llm, "_get_client", None)):  # LlamaIndex builds its clients on demand
        try:
            sync = llm._get_client()
        except Exception as err:  # noqa: BLE001 - whatever the object raises, say what it is
            raise InputError(f"from_llm: {type(llm).__name__}._get_client() failed ({type(err).__name__}); "
                             "pass base_url=... and model=... instead") from err
        if getattr(llm, "_async_http_client", None) is not None and callable(getattr(llm, "_get_aclient", None)):
            async_ = llm._get_aclient()
    if not isinstance(sync, openai.OpenAI):
        raise InputError(
            f"from_llm needs an LLM object that talks to an OpenAI-compatible endpoint through the openai SDK "
            f"(LangChain ChatOpenAI / OpenAI from langchain-openai, LlamaIndex OpenAI / OpenAILike); "
            f"{type(llm).__module__}.{type(llm).__name__} has none. Pass base_url=... and model=... instead")
    own_async = any(getattr(llm, name, None) is not None for name in ("http_async_client", "_async_http_client"))
    model = next((v for v in (getattr(llm, "model_name", None), getattr(llm, "model", None))
                  if isinstance(v, str) and v), None)
    return sync, async_ if own_async and isinstance(async_, openai.AsyncOpenAI) else None, model


def _client_in(llm: Any, names: tuple[str, ...], kind: type) -> Any:
    """The first attribute in ``names`` that is a ``kind`` client, or a resource (``client.chat.completions``,
    ``client.completions``) whose ``_client`` is one."""
    for name in names:
        value = getattr(llm, name, None)
        if isinstance(value, kind):
            return value
        inner = getattr(value, "_client", None)
        if isinstance(inner, kind):
            return inner
    return None


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
            "kept_given_order": 0 in ranking.guarded, "partial": ranking.partial, "notes": list(ranking.notes)}
