"""The LangChain adapter: pure tests (conversion, callbacks, errors) and a real
``ContextualCompressionRetriever`` (BM25 retriever -> CapCalRerank) against the local model server."""

from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import sys
import threading
from operator import itemgetter
from typing import Any

import pytest
from _compare import assert_same_ranking
from langchain_classic.retrievers.contextual_compression import ContextualCompressionRetriever
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from pydantic import PrivateAttr

import langchain_ext
from capcal_integrations import CapCalReranker, InputError
from langchain_ext import DETAILS_KEY, RELEVANCE_SCORE_KEY, CapCalRerank

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOWHERE = "http://127.0.0.1:9/v1"  # discard port: any request to it would fail loudly
QUERY = "how long do fleas live"
CORPUS = [
    "Fleas are small wingless insects that feed on the blood of mammals and birds.",
    "An adult flea usually lives two to three months, and up to a year with a steady host.",
    "Cats sleep between twelve and sixteen hours a day.",
    "Flea eggs hatch in two days to two weeks, depending on temperature and humidity.",
    "The Eiffel Tower in Paris is 330 metres tall.",
    "How long fleas live depends on temperature, humidity and whether they find a host.",
]


class BM25(BaseRetriever):
    """A real lexical retriever (bm25s, no model download) that returns its stored documents
    themselves, as langchain-community's BM25Retriever does: so mutation would show."""

    docs: list[Document]
    k: int = 5
    _index: Any = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        import bm25s

        self._index = bm25s.BM25()
        self._index.index(bm25s.tokenize([d.page_content for d in self.docs], stopwords="en", show_progress=False),
                          show_progress=False)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        import bm25s

        ids, _ = self._index.retrieve(bm25s.tokenize([query], stopwords="en", show_progress=False),
                                      k=min(self.k, len(self.docs)), show_progress=False)
        return [self.docs[i] for i in ids[0]]


class Runs(BaseCallbackHandler):
    """Chain and retriever runs as LangChain reports them (inline, so threads are the callers')."""

    run_inline = True

    def __init__(self) -> None:
        self.chains: list[dict] = []
        self.retrievers: list = []

    def on_retriever_start(self, serialized, query, *, run_id, **kwargs):
        self.retrievers.append(run_id)

    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, **kwargs):
        self.chains.append({"name": kwargs.get("name"), "run_id": run_id, "parent": parent_run_id,
                            "inputs": inputs, "thread": threading.get_ident()})

    def on_chain_end(self, outputs, *, run_id, **kwargs):
        for run in self.chains:
            if run["run_id"] == run_id:
                run["outputs"] = outputs

    def capcal(self) -> list[dict]:
        return [run for run in self.chains if run["name"] == "CapCalRerank"]


def _docs(texts=CORPUS) -> list[Document]:
    return [Document(page_content=t, id=f"d{i}", metadata={"source": {"site": "web"}}) for i, t in enumerate(texts)]


# ---------------------------------------------------------------- pure: no model server


def test_public_api():
    assert langchain_ext.__all__ == ["CapCalRerank", "RELEVANCE_SCORE_KEY", "OWN_SCORE_KEY", "DETAILS_KEY"]
    assert issubclass(CapCalRerank, BaseDocumentCompressor)
    assert (RELEVANCE_SCORE_KEY, DETAILS_KEY) == ("relevance_score", "capcal")
    assert all(field.description for field in CapCalRerank.model_fields.values())


def test_import_without_langchain_names_the_extra():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'langchain_core':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import capcal_integrations\n"
        "try:\n"
        "    import langchain_ext\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert 'ImportError: langchain_ext needs LangChain: pip install "capcal-integrations[langchain]"' in out.stdout, out


def test_construction():
    with pytest.raises(InputError, match="capcal serve"):
        CapCalRerank()
    with pytest.raises(InputError, match="top_nn"):
        CapCalRerank(base_url=NOWHERE, top_nn=3)  # typos are errors (the library's InputError), not silently ignored
    with pytest.raises(InputError, match="alpha"):
        CapCalRerank(base_url=NOWHERE, alpha=-1)
    compressor = CapCalRerank(base_url=NOWHERE, method="first-token-capcal", placeholder="", window=6, stride=3)
    core = compressor.reranker
    assert (core.method, core.options.placeholder, core.options.window, core.options.stride) == (
        "first-token-capcal", "", 6, 3)
    assert compressor.alpha == core.options.alpha == "auto"  # defaults filled in with the values in force
    compressor.method = "vanilla"
    assert compressor.reranker.method == "vanilla"
    shared = CapCalReranker(base_url=NOWHERE, method="psc", m=3)
    from_core = CapCalRerank(reranker=shared, top_n=None)
    assert (from_core.method, from_core.m, from_core.reranker.client) == ("psc", 3, shared.client)
    with pytest.raises(ValueError, match="not both"):
        CapCalRerank(reranker=shared, api_key="sk-x")


async def test_empty_input_needs_no_model():
    compressor = CapCalRerank(base_url=NOWHERE)
    assert compressor.compress_documents([], QUERY) == []
    assert await compressor.acompress_documents([], QUERY, callbacks=[Runs()]) == []


async def test_single_document_is_copied_and_traced():
    """One document is ranked without any request: the conversion and the callbacks, end to end."""
    compressor = CapCalRerank(base_url=NOWHERE)
    [given] = _docs(CORPUS[:1])
    before = copy.deepcopy(given)
    runs = Runs()
    [out] = compressor.compress_documents([given], QUERY, callbacks=[runs])
    assert given == before and out is not given and out.id == given.id
    # nothing was ranked (issue 34): the method says so, and a document without a score of its own gets none
    assert RELEVANCE_SCORE_KEY not in out.metadata and compressor.last_ranking.method == "given-order"
    assert out.metadata[DETAILS_KEY] == {"rank": 1, "input_rank": 1, "method": "given-order", "upper_bounds": 0,
                                                  "kept_given_order": False, "decoded": True, "partial": False}
    assert out.metadata["source"] == given.metadata["source"] and out.metadata["source"] is not given.metadata["source"]
    [run] = runs.capcal()
    assert run["inputs"]["query"] == QUERY and run["outputs"] == [out]
    [again] = await compressor.acompress_documents([given], QUERY)  # callbacks=None is fine too
    assert again == out and given == before


# ---------------------------------------------------------------- e2e: a real retriever pipeline


@pytest.fixture(scope="module")
def core(server_url, test_model) -> CapCalReranker:
    # probability="trie" asks one request per step and stream for single-digit labels (the exact
    # "joint" form asks several): the adapters' tests need the plumbing, not the exact form
    # guard=None: the plumbing is compared with the core's own ranking, and a guard decision near its
    # threshold could flip between the two calls with the server's drift
    return CapCalReranker(base_url=server_url, model=test_model, probability="trie", guard=None)


@pytest.fixture(scope="module")
def bm25() -> BM25:
    return BM25(docs=_docs(), k=5)


def _check_against_core(out, retrieved, compressor, top_n, want):
    """The compressor returned exactly its ranking's top, and that ranking is ``want``, the core's."""
    ranking = compressor.last_ranking
    assert ranking.decoded == top_n
    assert [d.id for d in out] == [retrieved[i].id for i in ranking.top(top_n)]
    assert [d.metadata[RELEVANCE_SCORE_KEY] for d in out] == [ranking.scores[i] for i in ranking.top(top_n)]
    assert [d.metadata[DETAILS_KEY]["rank"] for d in out] == list(range(1, len(out) + 1))
    assert_same_ranking(ranking, want)


@pytest.mark.e2e
def test_contextual_compression_retriever_sync(core, bm25):
    compressor = CapCalRerank(reranker=core, top_n=3)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=bm25)
    retrieved = bm25.invoke(QUERY)
    stored = copy.deepcopy(bm25.docs)
    runs = Runs()
    out = retriever.invoke(QUERY, config={"callbacks": [runs]})
    assert len(out) == 3
    # the adapter decodes only its top_n places (depth=top_n): compared with the core at that depth
    want = core.with_options(depth=3).rerank(QUERY, [d.page_content for d in retrieved])
    _check_against_core(out, retrieved, compressor, 3, want)
    assert bm25.docs == stored  # the retriever's documents are untouched
    [run] = runs.capcal()
    assert run["parent"] == runs.retrievers[0]  # traced as a child of the retriever's run
    assert [d.id for d in run["inputs"]["documents"]] == [d.id for d in retrieved] and run["outputs"] == out


@pytest.mark.e2e
async def test_contextual_compression_retriever_async_is_native(core, bm25):
    compressor = CapCalRerank(reranker=core, top_n=2)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=bm25)
    retrieved = await bm25.ainvoke(QUERY)
    runs = Runs()
    out = await retriever.ainvoke(QUERY, config={"callbacks": [runs]})
    assert len(out) == 2
    want = await core.with_options(depth=2).arerank(QUERY, [d.page_content for d in retrieved])
    _check_against_core(out, retrieved, compressor, 2, want)
    [run] = runs.capcal()
    assert run["thread"] == threading.get_ident()  # on the event loop, not run_in_executor's worker thread


@pytest.mark.e2e
def test_as_runnable_step_in_a_chain(server_url, test_model, bm25):
    compressor = CapCalRerank(base_url=server_url, model=test_model, probability="trie", top_n=None, guard=None)
    chain = RunnablePassthrough.assign(context=itemgetter("question") | bm25) | RunnablePassthrough.assign(
        context=compressor.as_runnable(query_key="question", documents_key="context"))
    result = chain.invoke({"question": QUERY})
    retrieved = bm25.invoke(QUERY)
    ranking = compressor.last_ranking
    assert [d.id for d in result["context"]] == [retrieved[i].id for i in ranking.order]
    scores = [d.metadata[RELEVANCE_SCORE_KEY] for d in result["context"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == len(retrieved)


# ---------------------------------------------------------------- deciding from labels (issue 50)


def _fake() -> CapCalReranker:
    """A reranker on the library's test double (in memory, prompt-seeded log-probabilities: the same prompts, the
    same decision), with the default guard that decide() needs."""
    from capcal_integrations.testing import clients, make_handler

    sync, async_ = clients(make_handler())
    return CapCalReranker(client=sync, async_client=async_)


@pytest.fixture(scope="module")
def labelled():
    """A BM25 retriever over the labelled corpus (documents with ids) and (question, relevant ids) pairs."""
    from _labelled import corpus, questions, relevant

    docs = [Document(page_content=text, id=doc_id) for doc_id, text in corpus().items()]
    pairs = [(text, relevant()[qid]) for qid, text in questions().items()]
    return BM25(docs=docs, k=5), pairs


def test_judged_runs_the_retriever_and_grades_by_id_metadata_or_text(labelled):
    from _labelled import corpus

    retriever, pairs = labelled
    compressor = CapCalRerank(base_url=NOWHERE, api_key="x")
    triples = compressor.judged(retriever, pairs)
    for (question, passages, grades), (asked, ids) in zip(triples, pairs):
        retrieved = retriever.invoke(asked)
        assert question == asked and passages == [d.page_content for d in retrieved]
        assert grades == [int(d.id in ids) for d in retrieved]
    assert sum(any(g) for _, _, g in triples) >= 6
    # the same grades from texts, from metadata ids, and graded as a mapping gives them
    by_text = [(q, [corpus()[i] for i in ids]) for q, ids in pairs]
    assert [g for _, _, g in compressor.judged(retriever, by_text)] == [g for _, _, g in triples]
    in_metadata = BM25(docs=[Document(page_content=d.page_content, metadata={"id": d.id}) for d in retriever.docs], k=5)
    assert [g for _, _, g in compressor.judged(in_metadata, pairs)] == [g for _, _, g in triples]
    graded = [(q, {i: 3 for i in ids}) for q, ids in pairs]
    assert [g for _, _, g in compressor.judged(retriever, graded)] == [[3 * x for x in g] for _, _, g in triples]


def test_decide_from_pairs_is_the_cores_decision_on_their_triples(labelled):
    retriever, pairs = labelled
    triples = CapCalRerank(base_url=NOWHERE, api_key="x").judged(retriever, pairs)
    compressor = CapCalRerank(reranker=_fake(), top_n=5)
    decision = compressor.decide(retriever, pairs)
    core = _fake().decide(triples)
    assert decision.judged == core.judged == sum(any(g) for _, _, g in triples)
    assert (decision.reads, decision.gain, decision.gain_low, decision.gain_high) == \
        (core.reads, core.gain, core.gain_low, core.gain_high)
    assert compressor.reranker.content_decision() == decision


async def test_adecide_is_decide(labelled):
    retriever, pairs = labelled
    triples = await CapCalRerank(base_url=NOWHERE, api_key="x").ajudged(retriever, pairs)
    reranker = _fake()
    decision = await CapCalRerank(reranker=reranker).adecide(retriever, pairs)
    core = _fake().decide(triples)
    assert (decision.reads, decision.gain, decision.gain_low) == (core.reads, core.gain, core.gain_low)


def test_decide_from_labels_says_what_is_wrong(labelled):
    retriever, pairs = labelled
    compressor = CapCalRerank(base_url=NOWHERE, api_key="x")
    with pytest.raises(InputError, match="empty"):
        compressor.decide(retriever, [])
    with pytest.raises(InputError, match="no relevant passage for any"):
        compressor.decide(retriever, [(q, ["no-such-id"]) for q, _ in pairs])
    with pytest.raises(InputError, match="item 0: expected a"):
        compressor.decide(retriever, ["just a question"])
    with pytest.raises(InputError, match="sequence of"):
        compressor.decide(retriever, {"q": ["d"]})


@pytest.mark.e2e
def test_decide_from_pairs_on_the_real_server(server_url, test_model, labelled):
    # three passages a question and one request a step (probability="trie"): the plumbing, on the real server
    retriever, pairs = labelled
    retriever = BM25(docs=retriever.docs, k=3)
    compressor = CapCalRerank(base_url=server_url, model=test_model, top_n=3, probability="trie")
    decision = compressor.decide(retriever, pairs)
    assert decision.judged == sum(any(g) for _, _, g in compressor.judged(retriever, pairs)) >= 5
    assert decision.gain_low <= decision.gain <= decision.gain_high
    assert compressor.reranker.content_decision() == decision
