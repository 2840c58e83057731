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
except ImportError as err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError('langchain_ext needs LangChain: pip install "capcal-integrations[langchain]"') from err

from capcal_integrations import Ranking
from capcal_integrations.adapter import RerankerSettings

__all__ = ["CapCalRerank", "RELEVANCE_SCORE_KEY", "DETAILS_KEY"]

RELEVANCE_SCORE_KEY = "relevance_score"
DETAILS_KEY = "capcal"


class CapCalRerank(RerankerSettings, BaseDocumentCompressor):
    """Rerank retrieved documents with an LLM listwise reranker calibrated against position bias.

    Options and construction: :class:`~capcal_integrations.adapter.RerankerSettings`.
    """


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


