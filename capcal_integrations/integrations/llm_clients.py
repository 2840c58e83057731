"""``from_llm``: the ``openai`` clients and the model name inside a framework's LLM object (LangChain's
``ChatOpenAI`` / ``OpenAI``, LlamaIndex's ``OpenAI`` / ``OpenAILike``), so that an adapter reuses the
user's configured connection as it is.
"""

from __future__ import annotations

from typing import Any

import openai

from ..errors import InputError

__all__ = ["clients_of"]


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
