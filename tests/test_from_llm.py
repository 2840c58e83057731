"""Issue 18: both adapters built from the LLM object the application already has (``from_llm``), and what
a reranking cost in their end events and callback payloads.

The LLM objects are the real ones: LangChain's ``ChatOpenAI`` / ``OpenAI`` (langchain-openai) and
LlamaIndex's ``OpenAILike`` (llama-index-llms-openai-like), pointed at the fake endpoint through their own
HTTP client (unit tests) or at the real llama.cpp server (e2e). No network.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.callbacks import BaseCallbackHandler, UsageMetadataCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_openai import ChatOpenAI, OpenAI

from capcal_integrations import InputError
from capcal_integrations.integrations.llm_clients import clients_of
from langchain_ext import CapCalRerank as LangChainRerank
from llamaindex_ext import CapCalRerank as LlamaIndexRerank
from tests.fake_endpoint import httpx2, make_handler

SECRET = "sk-secret-18-do-not-leak"
QUERY = "which passage is about topic 1?"
TEXTS = [f"passage number {i} about topic {i % 3}" for i in range(6)]


def _recording_transport() -> tuple[httpx2.Client, list]:
    seen: list = []
    return httpx2.Client(transport=httpx2.MockTransport(make_handler(calls=seen))), seen


class _Runs(BaseCallbackHandler):
    """LangChain callbacks: the chat-model runs started and their results."""

    def __init__(self) -> None:
        self.started, self.ended = [], []

    def on_chat_model_start(self, serialized, messages, **kwargs):
        self.started.append((serialized, messages, kwargs.get("parent_run_id")))

    def on_llm_end(self, response, **kwargs):
        self.ended.append(response)


# --------------------------------------------------------------------------- LangChain


def test_chat_openai_client_is_reused_with_its_settings():
    http, seen = _recording_transport()
    llm = ChatOpenAI(base_url="http://fake.test/v1", api_key=SECRET, model="fake", http_client=http,
                     default_headers={"X-Team": "search"}, timeout=7, max_retries=1)
    rerank = LangChainRerank.from_llm(llm, top_n=2, method="capcal", guard=None)
    core = rerank.reranker
    assert core.client is llm.root_client and core.model == "fake" == rerank.model
    out = rerank.compress_documents([Document(t) for t in TEXTS], QUERY)
    assert len(out) == 2 and rerank.last_ranking.decoded == 2  # depth follows top_n
    sent = [r for r in seen if r.url.path == "/v1/completions"]
    assert sent and all(r.headers["X-Team"] == "search" and r.headers["Authorization"] == f"Bearer {SECRET}"
                        for r in sent)  # the user's headers, key and transport
    assert {json.loads(r.content)["model"] for r in sent} == {"fake"}

    async def async_client():
        return rerank.reranker.async_client  # built per event loop from the same settings

    made = asyncio.run(async_client())
    assert (str(made.base_url), made.timeout, made.max_retries, made._custom_headers["X-Team"]) == (
        "http://fake.test/v1/", 7.0, 1, "search")


def test_own_async_http_client_is_reused():
    http, _ = _recording_transport()
    ahttp = httpx2.AsyncClient(transport=httpx2.MockTransport(lambda r: httpx2.Response(500)))
    llm = ChatOpenAI(base_url="http://fake.test/v1", api_key=SECRET, model="fake", http_client=http,
                     http_async_client=ahttp)
    sync, async_, model = clients_of(llm)
    assert sync is llm.root_client and async_ is llm.root_async_client and model == "fake"


def test_langchain_completions_llm():
    http, _ = _recording_transport()
    llm = OpenAI(base_url="http://fake.test/v1", api_key=SECRET, model="fake", http_client=http)
    sync, _, model = clients_of(llm)
    assert sync is llm.client._client and model == "fake"


def test_objects_without_an_openai_endpoint_are_refused():
    with pytest.raises(InputError, match="FakeListChatModel has none.*base_url"):
        LangChainRerank.from_llm(FakeListChatModel(responses=["x"]))
    from llama_index.core.llms import MockLLM

    with pytest.raises(InputError, match="MockLLM has none"):
        LlamaIndexRerank.from_llm(MockLLM())
    with pytest.raises(InputError, match="object has none"):
        LangChainRerank.from_llm(object())


def test_the_key_is_never_in_clear():
    http, _ = _recording_transport()
    llm = ChatOpenAI(base_url="http://fake.test/v1", api_key=SECRET, model="fake", http_client=http)
    rerank = LangChainRerank.from_llm(llm, top_n=2)
    shown = [repr(rerank), str(rerank), rerank.model_dump_json(), json.dumps(rerank.model_dump(), default=str),
             repr(rerank.reranker.settings())]
    assert not [s for s in shown if SECRET in s]
    runs = _Runs()
    rerank.compress_documents([Document(t) for t in TEXTS], QUERY, callbacks=[runs])
    assert SECRET not in repr(runs.started) + repr(runs.ended)


def test_usage_reaches_the_callbacks_and_usage_tools():
    http, _ = _recording_transport()
    rerank = LangChainRerank.from_llm(ChatOpenAI(base_url="http://fake.test/v1", api_key="x", model="fake",
                                                 http_client=http), top_n=3, method="capcal", guard=None)
    runs, usage = _Runs(), UsageMetadataCallbackHandler()
    rerank.compress_documents([Document(t) for t in TEXTS], QUERY, callbacks=[runs, usage])
    ranking = rerank.last_ranking
    [(serialized, messages, parent)] = runs.started
    assert serialized["name"] == "capcal" and parent is not None  # a child of the CapCalRerank run
    [result] = runs.ended
    summary = result.llm_output["capcal"]
    assert summary["method"] == "capcal" and summary["decoded"] == 3 and summary["partial"] is False
    assert summary["usage"] == {"requests": ranking.usage.requests, "prompt_tokens": ranking.usage.prompt_tokens,
                                "completion_tokens": ranking.usage.completion_tokens, "cached_tokens": 0}
    assert summary["notes"] == list(ranking.notes) and summary["usage"]["requests"] > 0
    assert result.llm_output["token_usage"]["prompt_tokens"] == ranking.usage.prompt_tokens > 0
    assert usage.usage_metadata["fake"]["input_tokens"] == ranking.usage.prompt_tokens  # LangChain's own tool


# --------------------------------------------------------------------------- LlamaIndex


def test_llamaindex_end_events_carry_the_usage():
    from llama_index.core.callbacks import CallbackManager, CBEventType
    from llama_index.core.callbacks.base_handler import BaseCallbackHandler as LlamaHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent
    from llama_index.core.schema import NodeWithScore, TextNode

    class Events(BaseEventHandler):
        seen: list = []

        @classmethod
        def class_name(cls) -> str:
            return "Events"

        def handle(self, event, **kwargs):
            self.seen.append(event)

    class Payloads(LlamaHandler):
        def __init__(self):
            super().__init__([], [])
            self.ends = []

        def on_event_start(self, event_type, payload=None, event_id="", parent_id="", **kwargs):
            return event_id

        def on_event_end(self, event_type, payload=None, event_id="", **kwargs):
            if event_type == CBEventType.RERANKING:
                self.ends.append(payload)

        def start_trace(self, trace_id=None):
            pass

        def end_trace(self, trace_id=None, trace_map=None):
            pass

    events, payloads = Events(seen=[]), Payloads()
    root = get_dispatcher()
    root.add_event_handler(events)
    try:
        handler = make_handler()
        from tests.fake_endpoint import clients

        sync, async_ = clients(handler)
        rerank = LlamaIndexRerank(client=sync, async_client=async_, top_n=2, method="vanilla",
                                  callback_manager=CallbackManager([payloads]))
        nodes = [NodeWithScore(node=TextNode(text=t), score=1.0) for t in TEXTS]
        rerank.postprocess_nodes(nodes, query_str=QUERY)
    finally:
        root.event_handlers.remove(events)
    [end] = [e for e in events.seen if isinstance(e, ReRankEndEvent)]
    summary = end.tags["capcal"]
    ranking = rerank.last_ranking
    assert summary["method"] == "vanilla" and summary["usage"]["requests"] == ranking.usage.requests > 0
    assert summary["usage"]["prompt_tokens"] == ranking.usage.prompt_tokens and summary["decoded"] == 2
    [payload] = payloads.ends
    assert payload["capcal"] == summary and summary["seconds"] >= 0


# --------------------------------------------------------------------------- the real server (e2e)


def test_from_chat_openai_on_the_real_server(server_url, test_model):
    llm = ChatOpenAI(base_url=server_url, api_key="not-needed", model=test_model, timeout=300, max_retries=1)
    rerank = LangChainRerank.from_llm(llm, top_n=2, method="capcal", guard=None, max_passage_words=30)
    docs = [Document("Wi-Fi connects devices to a local network over radio."),
            Document("Bananas are rich in potassium."),
            Document("Bluetooth links devices over short distances with little power."),
            Document("The Eiffel Tower is in Paris.")]
    usage = UsageMetadataCallbackHandler()
    out = rerank.compress_documents(docs, "how do wireless devices connect?", callbacks=[usage])
    assert len(out) == 2 and {d.page_content for d in out} <= {d.page_content for d in docs}
    ranking = rerank.last_ranking
    assert ranking.method == "capcal" and ranking.decoded == 2 and ranking.usage.prompt_tokens > 0
    assert usage.usage_metadata[test_model]["input_tokens"] == ranking.usage.prompt_tokens
    assert llm.invoke("Say OK.", max_tokens=2).content  # the chat model still works as before
