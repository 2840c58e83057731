"""What the framework adapters share: their pydantic settings and how they build the core reranker.

``llamaindex_ext.CapCalRerank`` and ``langchain_ext.CapCalRerank`` both inherit :class:`RerankerSettings`
(before the framework's base class). Its ranking fields are generated from
:class:`~capcal_integrations.options.Options`, so a new option of the core appears in both adapters
with its documentation. pydantic comes with ``openai``.
"""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr, create_model

from .errors import InputError
from .options import OPTION_NAMES, Options
from .reranker import CapCalReranker
from .types import Ranking

__all__ = ["RerankerSettings"]

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
    connection settings (``base_url``, ``model``, ``api_key``, ``client``, ``async_client``, ...).
    Ranking options left ``None`` take the core's defaults and are then filled in with the values in
    force; changing one later (``rerank.method = "vanilla"``) applies from the next call.
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

    @property
    def reranker(self) -> CapCalReranker:
        """The core reranker with the current options."""
        return self._reranker.with_options(**{k: getattr(self, k) for k in OPTION_NAMES})

    @property
    def last_ranking(self) -> Ranking | None:
        """The full Ranking of the latest call on this instance (with concurrent queries, read each
        item's ``metadata["capcal"]`` instead)."""
        return self._last_ranking
