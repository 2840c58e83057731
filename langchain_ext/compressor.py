"""``CapCalRerank``: a LangChain document compressor that reranks with CapCal.

    from langchain_ext import CapCalRerank
    compressor = CapCalRerank(top_n=5)   # CAPCAL_BASE_URL + CAPCAL_API_KEY (capcal key); or base_url=, api_key=, reranker=
    compressor = CapCalRerank.from_llm(ChatOpenAI(base_url=..., model=...), top_n=5)   # the chat model you have
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=bm25)

Only the ``top_n`` places returned are decoded (``depth`` follows ``top_n`` unless set), and
``deadline=1.5`` bounds a reranking's time (what is decided by then, the rest in retrieval order).

It returns **new** ``Document`` objects, best first (copies: the caller's documents and their
metadata are never touched), with two metadata entries:

* ``"relevance_score"`` (:data:`RELEVANCE_SCORE_KEY`, LangChain's key for a reranker's score, as
  langchain-cohere's): the calibrated relevance (:attr:`capcal_integrations.Ranking.scores`), higher is better,
  comparable within one list only (a place-based score: see the Ranking). A document that already has a
  ``relevance_score`` keeps it, and the reranker's goes under ``"capcal_relevance_score"`` (:data:`OWN_SCORE_KEY`).
  **A list kept in its given order** (``metadata["capcal"]["kept_given_order"]``: the content check deciding, or
  a model that does not read) gets no score of the model's: ``relevance_score`` is the input's own (its
  ``relevance_score``, else its numeric ``"score"``), and absent where the input has none, so a threshold on it
  keeps what the retriever's scores would;
* ``"capcal"`` (:data:`DETAILS_KEY`; ``"capcal_rerank"`` where the document's own metadata already has a
  ``"capcal"``, which is kept: :func:`~capcal_integrations.integrations.adapter.metadata_key`): how the document was
  placed: ``rank`` and ``input_rank`` (1-based), ``method``, and from the last decoding step it took part in
  the real-prompt probability ``p``, the empty-prompt prior ``q``, the calibrated ``score`` and ``alpha``;
  ``upper_bounds`` counts label probabilities of the whole ranking that were upper bounds (endpoint top-k too
  small); ``decoded`` (False for a place below the depth or after a deadline: not chosen by the model) and
  ``partial`` (the deadline cut the ranking).

Each call is traced as a chain run named ``"CapCalRerank"`` under the callbacks it is given (the
retriever's child run in a ``ContextualCompressionRetriever``). Inside it, the reranking's LLM requests show
as one chat-model run named ``"capcal"`` whose end carries their cost where LangChain's usage tools look:
``usage_metadata`` (input, output and cache-read tokens) on its message, and ``llm_output`` with
``token_usage``, ``model_name`` and ``"capcal"`` (:func:`~capcal_integrations.integrations.adapter.rerank_summary`:
method, requests, seconds, decoded places, partial, notes). :meth:`CapCalRerank.as_runnable` is the
same reranking as a ``Runnable`` step for LCEL chains. The whole
:class:`~capcal_integrations.Ranking` of the latest call is :attr:`CapCalRerank.last_ranking`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun, Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, LLMResult
    from langchain_core.runnables import RunnableLambda
except ImportError as err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError('langchain_ext needs LangChain: pip install "capcal-integrations[langchain]"') from err

from capcal_integrations import CapCalReranker, InputError, Ranking
from capcal_integrations.integrations.adapter import METADATA_KEY, RerankerSettings, metadata_key, rerank_summary
from capcal_integrations.integrations.judging import judged_lists, pair_questions

__all__ = ["CapCalRerank", "RELEVANCE_SCORE_KEY", "OWN_SCORE_KEY", "DETAILS_KEY"]

RELEVANCE_SCORE_KEY = "relevance_score"
#: where the reranker's score goes when the input document already has a ``relevance_score`` of its own (kept)
OWN_SCORE_KEY = "capcal_relevance_score"
DETAILS_KEY = METADATA_KEY


class CapCalRerank(RerankerSettings, BaseDocumentCompressor):
    """Rerank retrieved documents with an LLM listwise reranker calibrated against position bias.

    Options and construction: :class:`~capcal_integrations.integrations.adapter.RerankerSettings`.
    """


    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        """Rerank ``documents`` for ``query``; the best ``top_n`` as new documents (``[]`` for ``[]``; an
        :class:`~capcal_integrations.InputError` for ``None``, which is no list of documents)."""
        if not _documents(documents):
            return []
        return self.as_runnable().invoke({"query": query, "documents": documents}, config={"callbacks": callbacks})

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        """Async :meth:`compress_documents`, through the core's async driver."""
        if not _documents(documents):
            return []
        return await self.as_runnable().ainvoke({"query": query, "documents": documents},
                                                config={"callbacks": callbacks})

    def judged(self, retriever: Any, dataset: Any) -> list[tuple[str, list[str], list[int]]]:
        """``(question, passages, grades)`` of each ``(question, relevant ids or texts)`` pair of ``dataset``:
        ``retriever.invoke(question)``'s documents in its order, graded 1 where the document's ``id``, its
        ``metadata["id"]`` (or ``"doc_id"``) or its ``page_content`` is one of the relevant ones (a mapping of them
        to grades gives the grades), else 0 (:mod:`~capcal_integrations.integrations.judging`)."""
        questions = pair_questions(dataset)
        return judged_lists(questions, [retriever.invoke(q.text) for q in questions], _keys, _text)

    async def ajudged(self, retriever: Any, dataset: Any) -> list[tuple[str, list[str], list[int]]]:
        """Async :meth:`judged`: ``retriever.ainvoke``."""
        questions = pair_questions(dataset)
        return judged_lists(questions, [await retriever.ainvoke(q.text) for q in questions], _keys, _text)

    def as_runnable(self, *, query_key: str = "query", documents_key: str = "documents") -> RunnableLambda:
        """This reranking as a Runnable: ``{query_key: str, documents_key: [Document]}`` -> ``[Document]``.

        >>> # chain = RunnablePassthrough.assign(context=compressor.as_runnable(query_key="question",
        >>> #                                                                   documents_key="context"))
        """
        def rerank(inputs: dict[str, Any], run_manager: CallbackManagerForChainRun) -> list[Document]:
            documents = list(_documents(inputs[documents_key]))
            if not documents:
                return []
            reranker, query = self.reranker, inputs[query_key]
            runs = run_manager.get_child().on_chat_model_start(*_usage_run(reranker, query, documents))
            started = time.perf_counter()
            try:
                with self._progress(len(documents)) as progress:
                    ranking = reranker.rerank(query, _texts(documents), progress=progress)
            except BaseException as err:
                for run in runs:
                    run.on_llm_error(err)
                raise
            for run in runs:
                run.on_llm_end(_usage_result(ranking, reranker, time.perf_counter() - started))
            return self._finish(documents, ranking)

        async def arerank(inputs: dict[str, Any], run_manager: AsyncCallbackManagerForChainRun) -> list[Document]:
            documents = list(_documents(inputs[documents_key]))
            if not documents:
                return []
            reranker, query = self.reranker, inputs[query_key]
            runs = await run_manager.get_child().on_chat_model_start(*_usage_run(reranker, query, documents))
            started = time.perf_counter()
            try:
                with self._progress(len(documents)) as progress:
                    ranking = await reranker.arerank(query, _texts(documents), progress=progress)
            except BaseException as err:
                for run in runs:
                    await run.on_llm_error(err)
                raise
            for run in runs:
                await run.on_llm_end(_usage_result(ranking, reranker, time.perf_counter() - started))
            return self._finish(documents, ranking)

        return RunnableLambda(rerank, afunc=arerank, name="CapCalRerank")

    def _finish(self, documents: list[Document], ranking: Ranking) -> list[Document]:
        self._last_ranking = ranking
        details = ranking.details()
        out = []
        for i in ranking.top(self.top_n):
            metadata = copy.deepcopy(documents[i].metadata)
            if not ranking.placed_by_model:  # no score of the model's: the input's own, where it has one
                if RELEVANCE_SCORE_KEY not in metadata and _is_score(metadata.get("score")):
                    metadata[RELEVANCE_SCORE_KEY] = metadata["score"]
            else:  # the user's own relevance_score is kept: ours goes beside it
                metadata[OWN_SCORE_KEY if RELEVANCE_SCORE_KEY in metadata else RELEVANCE_SCORE_KEY] = ranking.scores[i]
            metadata[metadata_key(metadata)] = details[i]  # the document's own "capcal" is kept
            out.append(documents[i].model_copy(update={"metadata": metadata}))
        return out


def _is_score(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _keys(document: Document) -> list[str]:
    """What a retrieved document is known by in a dataset: its ids, then its text."""
    ids = [document.id, document.metadata.get("id"), document.metadata.get("doc_id")]
    return [str(i) for i in ids if i is not None] + [document.page_content.strip()]


def _text(document: Document) -> str:
    return document.page_content


def _texts(documents: list[Document]) -> list[str]:
    return [d.page_content for d in documents]


def _usage_run(reranker: CapCalReranker, query: str, documents: list[Document]) -> tuple[dict, list]:
    """The start of the chat-model run that stands for the reranking's requests: its name and what it was asked."""
    serialized = {"name": "capcal", "id": ["capcal_integrations", "CapCalReranker"]}
    return serialized, [[HumanMessage(f"rerank {len(documents)} passages for: {query}")]]


def _usage_result(ranking: Ranking, reranker: CapCalReranker, seconds: float) -> LLMResult:
    """The end of that run: the order chosen (1-based input ranks) and what it cost, where LangChain's usage
    callbacks and LangSmith read it (the message's ``usage_metadata``, ``llm_output["token_usage"]``)."""
    summary, usage = rerank_summary(ranking, reranker.model, seconds), ranking.usage
    tokens = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
              "total_tokens": usage.prompt_tokens + usage.completion_tokens,
              "input_token_details": {"cache_read": usage.cached_tokens}}
    message = AIMessage(" > ".join(f"[{i + 1}]" for i in ranking.order), usage_metadata=tokens,
                        response_metadata={"model_name": reranker.model or "", "capcal": summary})
    return LLMResult(generations=[[ChatGeneration(message=message)]], llm_output={
        "token_usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                        "total_tokens": usage.prompt_tokens + usage.completion_tokens},
        "model_name": reranker.model or "", "capcal": summary})


def _documents(documents: Any) -> Sequence[Document]:
    """``documents`` if they are a list of documents (empty included); an :class:`InputError` for ``None`` (it
    returned ``[]``, as if the retriever had found nothing) or a lone string or document."""
    if documents is None or isinstance(documents, (str, bytes, Document)):
        raise InputError(f"documents must be a list of Documents, got {type(documents).__name__}")
    return documents
