"""What a user sees (issue 34): a list kept in its given order says so once at WARNING, and the decision once
more; a kept list's scores are the retriever's own, in both adapters, so a threshold on them keeps what the
retriever's would. The fake endpoint (its model reads nothing) and the testbed's simulated reader; no server."""

from __future__ import annotations

import logging

import pytest
from langchain_core.documents import Document
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from capcal_integrations import CapCalReranker
from capcal_integrations.testbed import simulated_endpoint
from capcal_integrations.testing import clients, make_handler
from langchain_ext import OWN_SCORE_KEY, RELEVANCE_SCORE_KEY
from langchain_ext import CapCalRerank as LangChainRerank
from llamaindex_ext import CapCalRerank as LlamaIndexRerank

QUERY = "how long do fleas live"
TEXTS = [f"passage {i} about fleas, cats and the weather in spring" for i in range(6)]
RETRIEVED = [0.91, 0.83, 0.62, 0.55, 0.31, 0.12]  # the retriever's own scores, best first


def _core(**options) -> CapCalReranker:
    sync, async_ = clients(make_handler())
    return CapCalReranker(client=sync, async_client=async_, **options)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "capcal_integrations"]


def _kept_warning(message: str) -> bool:
    return "lists keep their given order" in message and "decide(judged)" in message and "guard=None" in message


def _nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(text=t, id_=f"n{i}"), score=s) for i, (t, s) in enumerate(zip(TEXTS, RETRIEVED))]


def test_a_list_kept_while_deciding_says_so_once_at_warning_and_the_decision_once_more(caplog):
    """A reader (the testbed's, s = 2): the first list kept warns (model, queries read, how to decide now), the
    next kept lists do not, and the decision to calibrate is a WARNING too (the user who saw the first sees it)."""
    from tests.test_content_check import lists, rank_until_decided

    data = lists(30)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        rankings = rank_until_decided(rr, data)
    decision = rr.content_decision()
    assert decision is not None and decision.reads and len(rankings) >= 3
    warnings = _warnings(caplog)
    assert len(warnings) == 2, warnings
    assert _kept_warning(warnings[0]) and "of at most 40 queries read" in warnings[0]
    assert "content check on" in warnings[1] and "calibrated from now on" in warnings[1]
    assert sum(r.kept_given_order for r in rankings) == len(rankings) - 1  # all but the list after the decision


def test_the_first_postprocess_nodes_with_the_defaults_warns_once_and_keeps_the_retrievers_scores(caplog):
    rerank = LlamaIndexRerank(reranker=_core(), top_n=6)
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        first = rerank.postprocess_nodes(_nodes(), query_str=QUERY)
        second = rerank.postprocess_nodes(_nodes(), query_str=QUERY + " in winter")
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and _kept_warning(warnings[0]) and "'fake'" in warnings[0], warnings
    for out in (first, second):
        assert [n.node.node_id for n in out] == [f"n{i}" for i in range(6)]
        assert [n.score for n in out] == RETRIEVED  # unchanged: no score made from places
        assert all(n.node.metadata["capcal"]["kept_given_order"] for n in out)


@pytest.mark.parametrize("cutoff", [0.3, 0.6, 0.85])
def test_a_threshold_after_a_kept_list_keeps_what_it_keeps_on_the_retrievers_scores(cutoff):
    threshold = SimilarityPostprocessor(similarity_cutoff=cutoff)
    bundle = QueryBundle(QUERY)
    reranked = LlamaIndexRerank(reranker=_core(), top_n=6).postprocess_nodes(_nodes(), bundle)
    after = threshold.postprocess_nodes(reranked, bundle)
    without = threshold.postprocess_nodes(_nodes(), bundle)
    assert [n.node.node_id for n in after] == [n.node.node_id for n in without] and len(without) < 6


def test_a_node_without_a_retriever_score_keeps_none_when_its_list_is_kept():
    nodes = [NodeWithScore(node=TextNode(text=t, id_=f"n{i}")) for i, t in enumerate(TEXTS)]  # a SummaryIndex's
    out = LlamaIndexRerank(reranker=_core(), top_n=6).postprocess_nodes(nodes, query_str=QUERY)
    assert [n.score for n in out] == [None] * 6


def test_the_first_compress_documents_with_the_defaults_warns_once_and_keeps_the_inputs_scores(caplog):
    docs = [Document(page_content=t, id=f"d{i}", metadata={"score": s}) for i, (t, s) in enumerate(zip(TEXTS, RETRIEVED))]
    compressor = LangChainRerank(reranker=_core(), top_n=6)
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        out = compressor.compress_documents(docs, QUERY)
        unscored = compressor.compress_documents([Document(page_content=t) for t in TEXTS], QUERY + " again")
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and _kept_warning(warnings[0]), warnings
    assert [d.metadata[RELEVANCE_SCORE_KEY] for d in out] == RETRIEVED and all(d.metadata["capcal"]["kept_given_order"]
                                                                                 for d in out)
    kept = [d.id for d in out if d.metadata[RELEVANCE_SCORE_KEY] >= 0.5]
    assert kept == [d.id for d in docs if d.metadata["score"] >= 0.5]  # a threshold keeps what the retriever's would
    assert all(RELEVANCE_SCORE_KEY not in d.metadata for d in unscored)  # no score of its own: none made up


def test_a_users_own_relevance_score_is_kept_and_the_rerankers_goes_beside_it():
    docs = [Document(page_content=t, metadata={RELEVANCE_SCORE_KEY: s}) for t, s in zip(TEXTS, RETRIEVED)]
    out = LangChainRerank(reranker=_core(guard=None), top_n=6).compress_documents(docs, QUERY)  # calibrated: decoded
    mine = {d.page_content: d.metadata[RELEVANCE_SCORE_KEY] for d in docs}
    assert all(d.metadata[RELEVANCE_SCORE_KEY] == mine[d.page_content] for d in out)
    scores = [d.metadata[OWN_SCORE_KEY] for d in out]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)


@pytest.mark.e2e
def test_on_the_real_server_the_first_call_of_each_adapter_warns_once_naming_the_model(server_url, test_model, caplog):
    """The packaged model with the defaults (three passages: too short to be read for the check, so no background
    reading loads the server after the test): one WARNING per process and key, naming the model and the state."""
    texts = TEXTS[:3]
    core = CapCalReranker(base_url=server_url, model=test_model)
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        nodes = LlamaIndexRerank(reranker=core, top_n=3).postprocess_nodes(_nodes()[:3], query_str=QUERY)
        docs = LangChainRerank(reranker=core, top_n=3).compress_documents(
            [Document(page_content=t, metadata={"score": s}) for t, s in zip(texts, RETRIEVED)], QUERY)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and _kept_warning(warnings[0]) and repr(test_model) in warnings[0], warnings
    assert "0 of at most 40 queries read" in warnings[0]
    assert [n.score for n in nodes] == RETRIEVED[:3] and [d.metadata[RELEVANCE_SCORE_KEY] for d in docs] == RETRIEVED[:3]


def test_progress_counts_the_requests_of_a_ranking_as_they_go():
    seen: list[int] = []
    ranking = _core(guard=None).rerank(QUERY, TEXTS, progress=seen.append)
    assert len(seen) > 3 and seen == sorted(set(seen)) and seen[-1] == ranking.usage.requests


@pytest.mark.parametrize("on", [True, False, None])
def test_the_adapters_draw_a_progress_bar_when_asked_and_not_when_not_interactive(on, capfd):
    LlamaIndexRerank(reranker=_core(guard=None), top_n=2, progress=on).postprocess_nodes(_nodes(), query_str=QUERY)
    LangChainRerank(reranker=_core(guard=None), top_n=2, progress=on).compress_documents(
        [Document(page_content=t) for t in TEXTS], QUERY)
    err = capfd.readouterr().err
    assert (err.count("capcal: ranking 6 passages") >= 2) == bool(on), err  # None: stderr is not a terminal here
