"""The LlamaIndex adapter: pure tests (conversion, events, errors) and a real query engine
(BM25 retriever -> CapCalRerank) against the local model server."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

import pytest
from _compare import assert_same_ranking
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms.mock import MockLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers.no_text import NoText
from llama_index.core.schema import IndexNode, MetadataMode, NodeWithScore, QueryBundle, TextNode

import llamaindex_ext
from capcal_integrations import CapCalReranker, InputError, Ranking, Step
from llamaindex_ext import DETAILS_KEY, RETRIEVAL_SCORE_KEY, CapCalRerank

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


class EventRecorder(BaseEventHandler):
    """Instrumentation events, with the thread each arrived on."""

    events: list = []

    @classmethod
    def class_name(cls) -> str:
        return "EventRecorder"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.events.append((event, threading.get_ident()))


class CallbackRecorder(BaseCallbackHandler):
    """Legacy callback events (CBEventType) as (phase, type, payload)."""

    def __init__(self) -> None:
        super().__init__(event_starts_to_ignore=[], event_ends_to_ignore=[])
        self.seen: list = []

    def on_event_start(self, event_type, payload=None, event_id="", parent_id="", **kwargs):
        self.seen.append(("start", event_type, payload))
        return event_id

    def on_event_end(self, event_type, payload=None, event_id="", **kwargs):
        self.seen.append(("end", event_type, payload))

    def start_trace(self, trace_id=None):
        pass

    def end_trace(self, trace_id=None, trace_map=None):
        pass


@pytest.fixture
def events():
    root = get_dispatcher()
    recorder = EventRecorder(events=[])
    root.add_event_handler(recorder)
    yield recorder.events
    root.event_handlers.remove(recorder)


def _scored(texts=CORPUS, scores=None, **meta) -> list[NodeWithScore]:
    """Nodes as a retriever returns them; ``meta`` is kept out of the embedding text (so the prompt is
    the same as for the bare texts)."""
    scores = scores or [10.0 - i for i in range(len(texts))]
    return [NodeWithScore(node=TextNode(text=t, id_=f"n{i}", metadata=dict(meta),
                                        excluded_embed_metadata_keys=list(meta)), score=s)
            for i, (t, s) in enumerate(zip(texts, scores, strict=True))]


def _rerank_events(events) -> list:
    return [e for e, _ in events if isinstance(e, (ReRankStartEvent, ReRankEndEvent))]


# ---------------------------------------------------------------- pure: no model server


def test_public_api():
    assert llamaindex_ext.__all__ == ["CapCalRerank", "RETRIEVAL_SCORE_KEY", "DETAILS_KEY"]
    assert issubclass(CapCalRerank, BaseNodePostprocessor)
    assert CapCalRerank.class_name() == "CapCalRerank"
    assert (RETRIEVAL_SCORE_KEY, DETAILS_KEY) == ("retrieval_score", "capcal")
    own = set(CapCalRerank.model_fields) - set(BaseNodePostprocessor.model_fields)
    assert own and all(CapCalRerank.model_fields[name].description for name in own)


def test_import_without_llamaindex_names_the_extra():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'llama_index':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import capcal_integrations\n"
        "try:\n"
        "    import llamaindex_ext\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    expected = 'ImportError: llamaindex_ext needs LlamaIndex: pip install "capcal-integrations[llamaindex]"'
    assert expected in out.stdout, out


def test_no_endpoint_configured_says_how_to_start_one():
    with pytest.raises(InputError, match="capcal serve"):
        CapCalRerank()


def test_options_pass_through_and_stay_live():
    rerank = CapCalRerank(base_url=NOWHERE, method="vanilla", alpha=1.5, window=8, stride=4, labels="alpha",
                          template="rank_gpt", top_n=None)
    core = rerank.reranker
    assert (core.method, core.options.alpha, core.options.window, core.options.stride) == ("vanilla", 1.5, 8, 4)
    assert (core.options.labels, core.options.template.name) == ("alpha", "rank_gpt")
    # defaults are filled in with the values in force
    assert (rerank.calibration, rerank.probability, rerank.placeholder) == (
        core.options.calibration, core.options.probability, core.options.placeholder)
    rerank.method = "capcal"
    assert rerank.reranker.method == "capcal"
    config = rerank.to_dict()
    assert "api_key" not in config and config["method"] == "capcal" and config["class_name"] == "CapCalRerank"
    assert CapCalRerank.from_dict(config).to_dict() == config  # LlamaIndex's serialisation round trip


def test_reranker_is_shared_and_exclusive_with_connection_settings():
    core = CapCalReranker(base_url=NOWHERE, method="vanilla", alpha=1.0)
    rerank = CapCalRerank(reranker=core, window=10)
    assert (rerank.method, rerank.alpha, rerank.window) == ("vanilla", 1.0, 10)
    assert rerank.reranker.client is core.client and core.options.window == 20  # a copy, same client
    with pytest.raises(ValueError, match="not both"):
        CapCalRerank(reranker=core, base_url=NOWHERE)


def test_bad_options_fail_at_construction():
    with pytest.raises(InputError, match="unknown method"):
        CapCalRerank(base_url=NOWHERE, method="best")
    with pytest.raises(ValueError):
        CapCalRerank(base_url=NOWHERE, top_n=0)
    with pytest.raises(ValueError, match="top_nn"):
        CapCalRerank(base_url=NOWHERE, top_nn=3)  # typos are errors, not silently ignored


async def test_missing_query_and_empty_input():
    rerank = CapCalRerank(base_url=NOWHERE)
    with pytest.raises(ValueError, match="needs the query"):
        rerank.postprocess_nodes(_scored())
    with pytest.raises(ValueError, match="needs the query"):
        await rerank.apostprocess_nodes(_scored())
    assert rerank.postprocess_nodes([], query_str=QUERY) == []
    assert await rerank.apostprocess_nodes([], query_bundle=QueryBundle(QUERY)) == []


def test_single_node_needs_no_model_and_is_copied(events):
    """One node is ranked without any request: the conversion and the events, end to end."""
    callbacks = CallbackRecorder()
    rerank = CapCalRerank(base_url=NOWHERE, callback_manager=CallbackManager([callbacks]))
    [given] = _scored(CORPUS[:1], source="web")
    before = given.model_dump()
    [out] = rerank.postprocess_nodes([given], query_str=QUERY)
    assert given.model_dump() == before
    assert out is not given and out.node is not given.node and out.node.node_id == given.node.node_id
    # nothing was ranked (issue 34): the method says so, and the node keeps the retriever's score
    assert out.score == given.score == 10.0 and rerank.last_ranking.method == "given-order"
    assert out.node.metadata[DETAILS_KEY] == {"rank": 1, "input_rank": 1, "method": "given-order", "upper_bounds": 0,
                                              "kept_given_order": False, "decoded": True, "partial": False,
                                              RETRIEVAL_SCORE_KEY: 10.0}  # one key of the library's (issue 23)
    # the added keys stay out of the text the LLM and the embedder see
    assert out.node.get_content(MetadataMode.LLM) == given.node.get_content(MetadataMode.LLM)
    assert out.node.get_content(MetadataMode.EMBED) == given.node.get_content(MetadataMode.EMBED)
    start, end = _rerank_events(events)
    assert (start.top_n, start.query.query_str, end.nodes) == (1, QUERY, [out])
    phases = [(phase, kind) for phase, kind, _ in callbacks.seen]
    assert phases == [("start", CBEventType.RERANKING), ("end", CBEventType.RERANKING)]
    assert callbacks.seen[1][2][EventPayload.NODES] == [out]


def test_index_node_object_is_shared_not_copied():
    engine = threading.Lock()  # stands for a live retriever or query engine: cannot be deep-copied
    given = NodeWithScore(node=IndexNode(text="a summary", index_id="sub", obj=engine), score=None)
    [out] = CapCalRerank(base_url=NOWHERE).postprocess_nodes([given], query_str=QUERY)
    assert out.node.obj is engine and out.node is not given.node
    assert out.node.metadata[DETAILS_KEY][RETRIEVAL_SCORE_KEY] is None and DETAILS_KEY not in given.node.metadata


def test_passage_details_worked_example():
    # two steps over three passages: 2 is chosen first, then 0 over 1
    steps = (Step((0, 1, 2), (0.2, 0.3, 0.5), (0.1, 0.6, 0.3), (0.3, 0.1, 0.6), 1.0, 1.03, 2),
             Step((0, 1), (0.45, 0.55), (0.2, 0.8), (0.6, 0.4), 0.5, 0.69, 0))
    r = Ranking((2, 0, 1), (0.6, 0.2, 0.9), steps=steps, upper_bounds=1)
    d = r.details()
    assert d[2] == {"rank": 1, "input_rank": 3, "method": "capcal", "upper_bounds": 1, "kept_given_order": False,
                    "decoded": True, "partial": False, "p": 0.5, "q": 0.3, "score": 0.6, "alpha": 1.0}
    assert (d[0]["rank"], d[0]["p"], d[0]["alpha"]) == (2, 0.45, 0.5)
    assert (d[1]["rank"], d[1]["q"], d[1]["score"]) == (3, 0.8, 0.4)  # the leftover: its last step
    assert Ranking((1, 0), (0.5, 1.0), "psc").details()[0] == {
        "rank": 2, "input_rank": 1, "method": "psc", "upper_bounds": 0, "kept_given_order": False, "decoded": True,
        "partial": False}


# ---------------------------------------------------------------- e2e: a real query engine


@pytest.fixture(scope="module")
def core(server_url, test_model) -> CapCalReranker:
    # probability="trie" asks one request per step and stream for single-digit labels (the exact
    # "joint" form asks several): the adapters' tests need the plumbing, not the exact form
    # guard=None: the plumbing is compared with the core's own ranking, and a guard decision near its
    # threshold could flip between the two calls with the server's drift
    return CapCalReranker(base_url=server_url, model=test_model, probability="trie", guard=None)


@pytest.fixture(scope="module")
def retriever():
    from llama_index.retrievers.bm25 import BM25Retriever

    nodes = [TextNode(text=t, id_=f"doc{i}") for i, t in enumerate(CORPUS)]
    return BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5)


def _engine(retriever, rerank: CapCalRerank, callbacks: CallbackRecorder | None = None) -> RetrieverQueryEngine:
    """A real query engine that retrieves and postprocesses, and answers without an LLM call (the
    synthesizer is given its LLM directly: ``from_args(response_mode="no_text")`` would look up
    ``Settings.llm``, which wants OpenAI)."""
    manager = CallbackManager([callbacks] if callbacks else [])  # the engine hands it to its postprocessors
    return RetrieverQueryEngine(retriever, response_synthesizer=NoText(llm=MockLLM()), node_postprocessors=[rerank],
                                callback_manager=manager)


def _texts(retrieved) -> list[str]:
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in retrieved]


def _check_against_core(out, retrieved, rerank, top_n, want):
    """The adapter returned exactly its ranking's top, and that ranking is ``want``, the core's."""
    ranking = rerank.last_ranking
    assert ranking.decoded == top_n
    assert [n.node.node_id for n in out] == [retrieved[i].node.node_id for i in ranking.top(top_n)]
    assert [n.score for n in out] == [ranking.scores[i] for i in ranking.top(top_n)]
    assert [n.node.metadata[DETAILS_KEY][RETRIEVAL_SCORE_KEY] for n in out] == [retrieved[i].score
                                                                                for i in ranking.top(top_n)]
    assert [n.node.metadata[DETAILS_KEY]["rank"] for n in out] == list(range(1, len(out) + 1))
    assert_same_ranking(ranking, want)


@pytest.mark.e2e
def test_query_engine_sync(core, retriever, events):
    callbacks = CallbackRecorder()
    rerank = CapCalRerank(reranker=core, top_n=3)
    engine = _engine(retriever, rerank, callbacks)
    retrieved = retriever.retrieve(QUERY)
    before = [n.model_dump() for n in retrieved]
    response = engine.query(QUERY)
    out = response.source_nodes
    assert len(out) == 3
    _check_against_core(out, retrieved, rerank, 3, core.with_options(depth=3).rerank(QUERY, _texts(retrieved)))
    assert [n.model_dump() for n in retriever.retrieve(QUERY)] == before  # the retriever's nodes are untouched
    start, end = _rerank_events(events)
    assert [n.node.node_id for n in start.nodes] == [n.node.node_id for n in retrieved]
    # the start event names the configured method (auto); the ranking names the one that ran
    assert (start.top_n, start.model_name, end.nodes) == (3, f"capcal-auto:{core.model}", out)
    assert rerank.last_ranking.method == "capcal"
    kinds = [(phase, kind) for phase, kind, _ in callbacks.seen if kind == CBEventType.RERANKING]
    assert kinds == [("start", CBEventType.RERANKING), ("end", CBEventType.RERANKING)]


@pytest.mark.e2e
async def test_query_engine_async_is_native(core, retriever, events):
    rerank = CapCalRerank(reranker=core, top_n=2)
    engine = _engine(retriever, rerank)
    retrieved = retriever.retrieve(QUERY)
    response = await engine.aquery(QUERY)
    assert len(response.source_nodes) == 2
    want = await core.with_options(depth=2).arerank(QUERY, _texts(retrieved))  # the adapter's depth is its top_n
    _check_against_core(response.source_nodes, retrieved, rerank, 2, want)
    (start, start_thread), (end, end_thread) = [(e, t) for e, t in events if isinstance(e, (ReRankStartEvent,
                                                                                           ReRankEndEvent))]
    assert start_thread == end_thread == threading.get_ident()  # ran on the event loop, not in a worker thread


@pytest.mark.e2e
def test_all_nodes_reordered_and_input_untouched(server_url, test_model, retriever):
    rerank = CapCalRerank(base_url=server_url, model=test_model, probability="trie", top_n=None, guard=None)
    retrieved = retriever.retrieve(QUERY)
    given = _scored([n.node.text for n in retrieved], [n.score for n in retrieved], source="web")
    before = [n.model_dump() for n in given]
    out = rerank.postprocess_nodes(given, query_str=QUERY)
    assert [n.model_dump() for n in given] == before
    ranking = rerank.last_ranking
    assert [n.node.node_id for n in out] == [f"n{i}" for i in ranking.order]
    assert [n.score for n in out] == sorted((n.score for n in out), reverse=True)
    assert all(n.node.metadata["source"] == "web" for n in out)
    assert rerank.reranker.model == test_model


# ---------------------------------------------------------------- deciding from labels (issue 50)


def _fake() -> CapCalReranker:
    """A reranker on the library's test double (in memory, prompt-seeded log-probabilities: the same prompts, the
    same decision), with the default guard that decide() needs."""
    from capcal_integrations.testing import clients, make_handler

    sync, async_ = clients(make_handler())
    return CapCalReranker(client=sync, async_client=async_)


def _qa_dataset_class():
    """LlamaIndex's ``EmbeddingQAFinetuneDataset`` where this stack installs it: ``llama_index.finetuning``
    (``llama-index-finetuning``, which pulls torch and sentence-transformers, so the stack does not; it is not in
    llama-index-core 0.14.25); older cores kept it in ``llama_index.core.evaluation``. Else a pydantic model of
    its shape, which is all the adapter asks for (duck-typed)."""
    import importlib

    for module in ("llama_index.finetuning", "llama_index.core.evaluation"):
        try:
            return importlib.import_module(module).EmbeddingQAFinetuneDataset
        except (ImportError, AttributeError):
            pass
    from llama_index.core.bridge.pydantic import BaseModel

    class EmbeddingQAFinetuneDataset(BaseModel):  # the shape of llama_index.finetuning.embeddings.common's
        queries: dict[str, str]
        corpus: dict[str, str]
        relevant_docs: dict[str, list[str]]
        mode: str = "text"

    return EmbeddingQAFinetuneDataset


@pytest.fixture(scope="module")
def labelled():
    """A BM25 retriever over the labelled corpus and its dataset, as generate_question_context_pairs makes one."""
    from _labelled import corpus, questions, relevant
    from llama_index.retrievers.bm25 import BM25Retriever

    nodes = [TextNode(text=text, id_=node_id) for node_id, text in corpus().items()]
    dataset = _qa_dataset_class()(queries=questions(), corpus=corpus(), relevant_docs=relevant())
    return BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5), dataset


def test_judged_runs_the_retriever_and_grades_by_node_id_or_text(labelled):
    retriever, dataset = labelled
    rerank = CapCalRerank(base_url=NOWHERE, api_key="x")
    triples = rerank.judged(retriever, dataset)
    assert [q for q, _, _ in triples] == list(dataset.queries.values())
    for (question, passages, grades), (qid, _) in zip(triples, dataset.queries.items()):
        retrieved = retriever.retrieve(question)
        assert passages == _texts(retrieved)
        assert grades == [int(n.node.node_id in dataset.relevant_docs[qid]) for n in retrieved]
    assert sum(any(g) for _, _, g in triples) >= 6  # BM25 finds most answers
    # a retriever over an index rebuilt with other node ids still matches, by text
    from llama_index.retrievers.bm25 import BM25Retriever
    renamed = BM25Retriever.from_defaults(nodes=[TextNode(text=t, id_=f"other-{i}")
                                                 for i, t in enumerate(dataset.corpus.values())], similarity_top_k=5)
    assert [g for _, _, g in rerank.judged(renamed, dataset)] == [g for _, _, g in triples]


def test_decide_from_a_dataset_is_the_cores_decision_on_its_triples(labelled):
    retriever, dataset = labelled
    triples = CapCalRerank(base_url=NOWHERE, api_key="x").judged(retriever, dataset)
    rerank = CapCalRerank(reranker=_fake(), top_n=5)
    decision = rerank.decide(retriever, dataset)
    core = _fake().decide(triples)
    assert decision.judged == core.judged == sum(any(g) for _, _, g in triples)
    assert (decision.reads, decision.gain, decision.gain_low, decision.gain_high) == \
        (core.reads, core.gain, core.gain_low, core.gain_high)
    assert rerank.reranker.content_decision() == decision  # set like the check's own


async def test_adecide_is_decide(labelled):
    retriever, dataset = labelled
    triples = await CapCalRerank(base_url=NOWHERE, api_key="x").ajudged(retriever, dataset)
    reranker = _fake()
    decision = await CapCalRerank(reranker=reranker).adecide(retriever, dataset)
    core = _fake().decide(triples)
    assert (decision.reads, decision.gain, decision.gain_low) == (core.reads, core.gain, core.gain_low)


def test_decide_from_labels_says_what_is_wrong(labelled):
    retriever, dataset = labelled
    rerank = CapCalRerank(base_url=NOWHERE, api_key="x")
    shape = type(dataset)
    with pytest.raises(InputError, match="no queries"):
        rerank.decide(retriever, shape(queries={}, corpus=dataset.corpus, relevant_docs={}))
    with pytest.raises(InputError, match="match nothing in the dataset's corpus"):
        rerank.decide(retriever, shape(queries=dataset.queries, corpus=dataset.corpus,
                                       relevant_docs={**dataset.relevant_docs, "q-owls": ["no-such-node"]}))
    with pytest.raises(InputError, match="no relevant passage for any"):
        rerank.decide(retriever, shape(queries=dataset.queries, corpus={"x": "nothing like it"},
                                       relevant_docs={q: ["x"] for q in dataset.queries}))
    with pytest.raises(InputError, match="queries, corpus and relevant_docs"):
        rerank.decide(retriever, [("a question", ["an id"])])


@pytest.mark.e2e
def test_decide_from_a_dataset_on_the_real_server(server_url, test_model, labelled):
    # three passages a question and one request a step (probability="trie"): the plumbing, on the real server,
    # in a minute or two of a 2-core CPU (the default options over five passages took many times that)
    from llama_index.retrievers.bm25 import BM25Retriever

    _, dataset = labelled
    retriever = BM25Retriever.from_defaults(nodes=[TextNode(text=t, id_=i) for i, t in dataset.corpus.items()],
                                            similarity_top_k=3)
    rerank = CapCalRerank(base_url=server_url, model=test_model, top_n=3, probability="trie")
    decision = rerank.decide(retriever, dataset)
    assert decision.judged == sum(any(g) for _, _, g in rerank.judged(retriever, dataset)) >= 5
    assert decision.gain_low <= decision.gain <= decision.gain_high
    assert rerank.reranker.content_decision() == decision
