"""``from_llm`` with LlamaIndex's ``OpenAILike`` (llama-index-llms-openai-like), the real object, on the fake
endpoint through its own HTTP client and on the real llama.cpp server (e2e).

llama-index-llms-openai(-like) require ``openai<3``: these run where the stock LlamaIndex stack resolves (openai
2.x: the llama-index job of ``.ci/run``) and skip where it is not installed (the main venv, on openai 3.x).
"""

from __future__ import annotations

import asyncio

import pytest

from llamaindex_ext import CapCalRerank as LlamaIndexRerank
from tests.fake_endpoint import httpx2, make_handler

# llama-index-llms-openai pins openai<3 and [dev] installs openai 3: these run in .ci/run's LlamaIndex stack venv
openai_like = pytest.importorskip("llama_index.llms.openai_like", reason="pip install llama-index-llms-openai-like "
                                  "(openai<3; .ci/run runs these in its LlamaIndex stack venv)")

SECRET = "sk-secret-18-do-not-leak"
QUERY = "which passage is about topic 1?"
TEXTS = [f"passage number {i} about topic {i % 3}" for i in range(6)]


def _recording_transport():
    seen: list = []
    return httpx2.Client(transport=httpx2.MockTransport(make_handler(calls=seen))), seen


def _openai_like(**kwargs):
    return openai_like.OpenAILike(**kwargs)


def test_openai_like_client_is_reused_with_its_settings():
    http, seen = _recording_transport()
    llm = _openai_like(model="fake", api_base="http://fake.test/v1", api_key=SECRET, http_client=http,
                       default_headers={"X-Team": "search"}, timeout=9, max_retries=0, is_chat_model=True)
    rerank = LlamaIndexRerank.from_llm(llm, top_n=2, method="capcal", guard=None)
    from llama_index.core.schema import NodeWithScore, TextNode

    out = rerank.postprocess_nodes([NodeWithScore(node=TextNode(text=t), score=1.0) for t in TEXTS], query_str=QUERY)
    assert len(out) == 2 and rerank.model == "fake"
    sent = [r for r in seen if r.url.path == "/v1/completions"]
    assert sent and all(r.headers["X-Team"] == "search" and r.headers["Authorization"] == f"Bearer {SECRET}"
                        for r in sent)
    core = rerank.reranker.client
    assert (core.timeout, core.max_retries) == (9.0, 0)
    assert SECRET not in repr(rerank) + rerank.to_json()


def test_from_openai_like_on_the_real_server(server_url, test_model):
    llm = _openai_like(model=test_model, api_base=server_url, api_key="not-needed", is_chat_model=True, timeout=300)
    from llama_index.core.schema import NodeWithScore, TextNode

    rerank = LlamaIndexRerank.from_llm(llm, top_n=2, method="vanilla", max_passage_words=30)
    nodes = [NodeWithScore(node=TextNode(text=t), score=1.0) for t in
             ["Paris is the capital of France.", "Bananas are yellow.", "France's capital city is Paris.",
              "Rust is a programming language."]]
    out = asyncio.run(rerank.apostprocess_nodes(nodes, query_str="what is the capital of France?"))
    assert len(out) == 2 and rerank.last_ranking.usage.requests > 0 and rerank.last_ranking.decoded == 2
