"""``CapCalRerank``: a LlamaIndex node postprocessor that reranks with CapCal.

    from llamaindex_ext import CapCalRerank
    rerank = CapCalRerank(top_n=5)   # CAPCAL_BASE_URL + CAPCAL_API_KEY (capcal key); or base_url=, api_key=, reranker=
    rerank = CapCalRerank.from_llm(Settings.llm, top_n=5)                 # or the OpenAI / OpenAILike LLM you have
    engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[rerank])

Only the ``top_n`` places returned are decoded (``depth`` follows ``top_n`` unless set), and
``deadline=1.5`` bounds a reranking's time (what is decided by then, the rest in retrieval order).

It returns **new** ``NodeWithScore`` objects, best first, whose ``score`` is the calibrated relevance
(:attr:`capcal_integrations.Ranking.scores`: place-based, comparable within one list only). **A list kept in its
given order** (``metadata["capcal"]["kept_given_order"]``: the content check deciding, or a model that does not
read) keeps the retriever's scores unchanged (``None`` where it gave none), so a threshold on them
(``SimilarityPostprocessor``) keeps what it would have kept without the reranker. Each carries a deep copy of
its node (the caller's nodes are never touched) with one metadata entry of the library's, hidden from the LLM and embedding text:
``"capcal"`` (:data:`DETAILS_KEY`; ``"capcal_rerank"`` where the node's own metadata already has a ``"capcal"``,
which is kept: :func:`~capcal_integrations.integrations.adapter.metadata_key`), how the node was placed: ``rank`` and
``input_rank`` (1-based), ``retrieval_score`` (:data:`RETRIEVAL_SCORE_KEY`: the score the node came in with,
``None`` if none), ``method``, and from the last decoding step it took part in the real-prompt probability
``p``, the empty-prompt prior ``q``, the calibrated ``score`` and ``alpha``; ``upper_bounds`` counts label
probabilities of the whole ranking that were upper bounds (endpoint top-k too small); ``decoded`` (False
for a place below the depth or after a deadline: not chosen by the model) and ``partial`` (the deadline
cut the ranking). A node's own ``retrieval_score`` or ``capcal`` metadata is never overwritten.

The whole :class:`~capcal_integrations.Ranking` of the latest call (prior, every step, usage) is
:attr:`CapCalRerank.last_ranking`. Events: ``ReRankStartEvent`` / ``ReRankEndEvent`` through the
instrumentation dispatcher and a ``CBEventType.RERANKING`` callback event, as LlamaIndex's rerankers do.
What the reranking cost rides on the end of both (:func:`~capcal_integrations.integrations.adapter.rerank_summary`: method,
model, usage in requests and prompt/completion/cached tokens, seconds, decoded places, partial, notes): the
``ReRankEndEvent``'s ``tags["capcal"]`` and the callback end payload's ``"capcal"`` entry.
"""

from __future__ import annotations

import copy
import time
from typing import Any

try:
    from llama_index.core.bridge.pydantic import Field
    from llama_index.core.callbacks import CBEventType, EventPayload
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle
except ImportError as err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        'llamaindex_ext needs LlamaIndex: pip install "capcal-integrations[llamaindex]"'
    ) from err

from capcal_integrations import CapCalReranker, InputError, Ranking
from capcal_integrations.integrations.adapter import METADATA_KEY, RerankerSettings, metadata_key, rerank_summary
from capcal_integrations.integrations.judging import judged_lists, qa_dataset_questions

__all__ = ["CapCalRerank", "RETRIEVAL_SCORE_KEY", "DETAILS_KEY"]

#: the entry of the details that holds the score a node came in with
RETRIEVAL_SCORE_KEY = "retrieval_score"
#: the metadata key of the details (``"capcal_rerank"`` where the node already has a ``"capcal"`` of its own)
DETAILS_KEY = METADATA_KEY

dispatcher = get_dispatcher(__name__)


class CapCalRerank(RerankerSettings, BaseNodePostprocessor):
    """Rerank retrieved nodes with an LLM listwise reranker calibrated against position bias.

    Options and construction: :class:`~capcal_integrations.integrations.adapter.RerankerSettings`.
    """

    metadata_mode: MetadataMode = Field(MetadataMode.EMBED, description="Which metadata the passage text includes.")

    @classmethod
    def class_name(cls) -> str:
        return "CapCalRerank"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        query = _query_of(query_bundle)
        if not nodes:
            return []
        reranker = self.reranker
        with self._event(nodes, query_bundle, reranker) as event, self._progress(len(nodes)) as progress:
            started = time.perf_counter()
            ranking = reranker.rerank(query, self._texts(nodes), progress=progress)
            return self._finish(nodes, ranking, event, reranker, time.perf_counter() - started)

    @dispatcher.span
    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        query = _query_of(query_bundle)
        if not nodes:
            return []
        reranker = self.reranker
        with self._event(nodes, query_bundle, reranker) as event, self._progress(len(nodes)) as progress:
            started = time.perf_counter()
            ranking = await reranker.arerank(query, self._texts(nodes), progress=progress)
            return self._finish(nodes, ranking, event, reranker, time.perf_counter() - started)

    def _texts(self, nodes: list[NodeWithScore]) -> list[str]:
        return [n.node.get_content(metadata_mode=self.metadata_mode) for n in nodes]

    # ------------------------------------------------------------------ deciding from labels

    def judged(self, retriever: Any, dataset: Any) -> list[tuple[str, list[str], list[int]]]:
        """``(question, passages, grades)`` of each question of ``dataset`` (an ``EmbeddingQAFinetuneDataset`` or
        any object with its ``queries``, ``corpus`` and ``relevant_docs``): ``retriever.retrieve(question)``'s
        nodes in its order, their text as this reranker reads them, graded 1 where the node's id or its text is
        one of the question's relevant docs, else 0 (:mod:`~capcal_integrations.integrations.judging`)."""
        questions = qa_dataset_questions(dataset)
        return judged_lists(questions, [retriever.retrieve(q.text) for q in questions], _keys, self._text)

    async def ajudged(self, retriever: Any, dataset: Any) -> list[tuple[str, list[str], list[int]]]:
        """Async :meth:`judged`: ``retriever.aretrieve``."""
        questions = qa_dataset_questions(dataset)
        return judged_lists(questions, [await retriever.aretrieve(q.text) for q in questions], _keys, self._text)

    def _text(self, scored: NodeWithScore) -> str:
        return scored.node.get_content(metadata_mode=self.metadata_mode)

    def _event(self, nodes: list[NodeWithScore], query_bundle: QueryBundle, reranker: CapCalReranker) -> Any:
        model_name = f"capcal-{reranker.method}:{reranker.model or 'default'}"
        top_n = min(self.top_n or len(nodes), len(nodes))
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=top_n, model_name=model_name))
        return self.callback_manager.event(CBEventType.RERANKING, payload={
            EventPayload.NODES: nodes, EventPayload.MODEL_NAME: model_name,
            EventPayload.QUERY_STR: query_bundle.query_str, EventPayload.TOP_K: top_n})

    def _finish(self, nodes: list[NodeWithScore], ranking: Ranking, event: Any, reranker: CapCalReranker,
                seconds: float) -> list[NodeWithScore]:
        self._last_ranking = ranking
        details = ranking.details()
        kept = not ranking.placed_by_model  # no score of the model's: the retriever's own, unchanged
        new_nodes = [NodeWithScore(node=_annotated_copy(nodes[i], details[i]),
                                   score=nodes[i].score if kept else ranking.scores[i])
                     for i in ranking.top(self.top_n)]
        summary = rerank_summary(ranking, reranker.model, seconds)
        event.on_end(payload={EventPayload.NODES: new_nodes, DETAILS_KEY: summary})
        dispatcher.event(ReRankEndEvent(nodes=new_nodes, tags={DETAILS_KEY: summary}))
        return new_nodes


def _keys(scored: NodeWithScore) -> list[str]:
    """What a retrieved node is known by in a dataset: its id, then its text."""
    return [scored.node.node_id, scored.node.get_content(metadata_mode=MetadataMode.NONE).strip()]


def _query_of(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise InputError("CapCalRerank needs the query: call postprocess_nodes(nodes, query_str=...) "
                         "or pass query_bundle=QueryBundle(...)")
    return query_bundle.query_str


def _annotated_copy(scored: NodeWithScore, details: dict[str, Any]) -> BaseNode:
    """A deep copy of the node, so later postprocessors cannot reach the caller's objects through it.
    ``IndexNode.obj`` (a live retriever or query engine) is shared, not copied."""
    node = scored.node
    keep = {id(node.__dict__["obj"]): node.__dict__["obj"]} if "obj" in node.__dict__ else {}
    node = copy.deepcopy(node, keep)
    key = metadata_key(node.metadata)  # the node's own entries are kept
    node.metadata[key] = {**details, RETRIEVAL_SCORE_KEY: scored.score}
    for hidden in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
        if key not in hidden:
            hidden.append(key)
    return node
