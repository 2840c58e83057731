"""``CapCalRerank``: a LangChain document compressor that reranks with CapCal.

    from langchain_ext import CapCalRerank
    compressor = CapCalRerank(top_n=5, base_url="http://127.0.0.1:8080/v1")   # or reranker=CapCalReranker(...)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=bm25)

It returns **new** ``Document`` objects, best first (copies: the caller's documents and their
metadata are never touched), with two metadata entries:

* ``"relevance_score"`` (:data:`RELEVANCE_SCORE_KEY`): the calibrated relevance
  (:attr:`capcal_integrations.Ranking.scores`), higher is better;
* ``"capcal"`` (:data:`DETAILS_KEY`): how the document was placed: ``rank`` and ``input_rank``
  (1-based), ``method``, and from the last decoding step it took part in the real-prompt probability
  ``p``, the empty-prompt prior ``q``, the calibrated ``score`` and ``alpha``; ``upper_bounds`` counts
  label probabilities of the whole ranking that were upper bounds (endpoint top-k too small).

Each call is traced as a chain run named ``"CapCalRerank"`` under the callbacks it is given (the
retriever's child run in a ``ContextualCompressionRetriever``). :meth:`CapCalRerank.as_runnable` is the
same reranking as a ``Runnable`` step for LCEL chains. The whole
:class:`~capcal_integrations.Ranking` of the latest call is :attr:`CapCalRerank.last_ranking`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.runnables import RunnableLambda
    from pydantic import ConfigDict, Field, PrivateAttr
except ImportError as err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError('langchain_ext needs LangChain: pip install "capcal-integrations[langchain]"') from err

from capcal_integrations import CapCalReranker, Ranking
from capcal_integrations.prompts import PromptTemplate
from capcal_integrations.reranker import OPTION_NAMES

__all__ = ["CapCalRerank", "RELEVANCE_SCORE_KEY", "DETAILS_KEY"]

RELEVANCE_SCORE_KEY = "relevance_score"
DETAILS_KEY = "capcal"
_CONNECTION = ("base_url", "model", "timeout", "max_retries")


class CapCalRerank(BaseDocumentCompressor):
    """Rerank retrieved documents with an LLM listwise reranker calibrated against position bias.

    Pass either ``reranker=CapCalReranker(...)`` (its clients and caches are shared) or the
    connection settings (``base_url``, ``model``, ``api_key``, ``client``, ``async_client``, ...).
    Ranking options left ``None`` take the core's defaults and are then filled in with the values in
    force; changing one later (``compressor.method = "vanilla"``) applies from the next call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    top_n: int | None = Field(5, ge=1, description="Documents to return, best first; None returns all, reordered.")
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint (init only); default $CAPCAL_BASE_URL, then $OPENAI_BASE_URL.")
    model: str | None = Field(None, description="Served model name (init only); default: the first served.")
    timeout: float | None = Field(None, description="Request timeout in seconds (init only).")
    max_retries: int | None = Field(None, description="Retries on 408/409/429/5xx (init only).")
    method: str | None = Field(None, description="capcal | vanilla | first-token | first-token-capcal | psc.")
    alpha: float | str | None = Field(
        None, description="'adaptive' (min(5 H / log|C|, 2)) or a fixed calibration strength.")
    calibration: str | None = Field(None, description="'additive' (p - alpha (q - 1/|C|)) or 'log'.")
    placeholder: str | None = Field(None, description="Passage body of the content-free prompt.")
    template: str | PromptTemplate | None = Field(None, description="'rank_zephyr', 'rank_gpt' or a PromptTemplate.")
    labels: str | None = Field(None, description="Identifiers: 'numeric' ([1]..) or 'alpha' ([A]..).")
    probability: str | None = Field(None, description="'joint' (exact label probability) or 'trie' (cheaper).")
    window: int | None = Field(None, description="Sliding window size for long lists.")
    stride: int | None = Field(None, description="Sliding window stride.")
    m: int | None = Field(None, description="Shuffles for method='psc'.")
    seed: int | None = Field(None, description="Shuffle seed for method='psc'.")
    max_passage_words: int | None = Field(None, description="Words kept per passage before the token budget.")
    max_context: int | None = Field(None, description="Context size in tokens; default: what the server reports.")
    top_logprobs: int | None = Field(None, description="Top-k log-probabilities asked per request.")
    concurrency: int | None = Field(None, description="Requests in flight at once (async).")

    _reranker: CapCalReranker = PrivateAttr()
    _last_ranking: Ranking | None = PrivateAttr(default=None)

    def __init__(self, *, reranker: CapCalReranker | None = None, api_key: str | None = None,
                 client: Any = None, async_client: Any = None, **fields: Any) -> None:
        super().__init__(**fields)
        connection = {k: getattr(self, k) for k in _CONNECTION if getattr(self, k) is not None}
        connection.update((k, v) for k, v in (("api_key", api_key), ("client", client),
                                              ("async_client", async_client)) if v is not None)
        if reranker is not None and connection:
            raise ValueError(f"pass either reranker=... or connection settings ({', '.join(connection)}), not both")
        options = {k: getattr(self, k) for k in OPTION_NAMES if getattr(self, k) is not None}
        base = reranker or CapCalReranker(**connection)
        self._reranker = base.with_options(**options) if options else base
        self.model = self._reranker.model
        for name, value in self._reranker.settings().items():  # so the config shows what runs
            if getattr(self, name) is None:
                setattr(self, name, value)

    @property
    def reranker(self) -> CapCalReranker:
        """The core reranker with this compressor's current options."""
        return self._reranker.with_options(**{k: getattr(self, k) for k in OPTION_NAMES})

    @property
    def last_ranking(self) -> Ranking | None:
        """The full Ranking of the latest call on this instance (with concurrent queries, read each
        document's ``metadata["capcal"]`` instead)."""
        return self._last_ranking

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        """Rerank ``documents`` for ``query``; the best ``top_n`` as new documents."""
        if not documents:
            return []
        return self.as_runnable().invoke({"query": query, "documents": documents}, config={"callbacks": callbacks})

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        """Async :meth:`compress_documents`, through the core's async driver."""
        if not documents:
            return []
        return await self.as_runnable().ainvoke({"query": query, "documents": documents},
                                                config={"callbacks": callbacks})

    def as_runnable(self, *, query_key: str = "query", documents_key: str = "documents") -> RunnableLambda:
        """This reranking as a Runnable: ``{query_key: str, documents_key: [Document]}`` -> ``[Document]``.

        >>> # chain = RunnablePassthrough.assign(context=compressor.as_runnable(query_key="question",
        >>> #                                                                   documents_key="context"))
        """
        def rerank(inputs: dict[str, Any]) -> list[Document]:
            documents = list(inputs[documents_key])
            if not documents:
                return []
            return self._finish(documents, self.reranker.rerank(inputs[query_key], _texts(documents)))

        async def arerank(inputs: dict[str, Any]) -> list[Document]:
            documents = list(inputs[documents_key])
            if not documents:
                return []
            return self._finish(documents, await self.reranker.arerank(inputs[query_key], _texts(documents)))

        return RunnableLambda(rerank, afunc=arerank, name="CapCalRerank")

    def _finish(self, documents: list[Document], ranking: Ranking) -> list[Document]:
        self._last_ranking = ranking
        details = ranking.details()
        return [documents[i].model_copy(update={"metadata": {**copy.deepcopy(documents[i].metadata),
                                                            RELEVANCE_SCORE_KEY: ranking.scores[i],
                                                            DETAILS_KEY: details[i]}})
                for i in ranking.top(self.top_n)]


def _texts(documents: list[Document]) -> list[str]:
    return [d.page_content for d in documents]


