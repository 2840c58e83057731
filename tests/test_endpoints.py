"""The endpoint kinds (issue 25): the probe picks one object per endpoint, every dialect of the test double
probes to its own kind, and capabilities built by hand find the kind their transport names."""

from __future__ import annotations

import dataclasses
import json

import pytest

from capcal_integrations import CapCalReranker
from capcal_integrations.endpoints import (
    CHAT_PREFILL,
    HOSTED_CHAT,
    HOSTED_COMPLETIONS,
    LLAMACPP,
    OLLAMA,
    SGLANG,
    VLLM,
    kind_of,
    tokenize,
)
from capcal_integrations.endpoints.probe import route
from capcal_integrations.errors import CapabilityError
from capcal_integrations.testing import clients, hosted, make_handler
from capcal_integrations.transport.drivers import run_sync
from capcal_integrations.types import Capabilities
from tests.fake_endpoint import httpx2, no_completions


def _chat_answer() -> dict:
    top = [{"token": t, "logprob": lp} for t, lp in (("[", -0.1), (" [", -2.5))]
    return {"choices": [{"index": 0, "message": {"content": "[2] > [1] > [3]"},
                         "logprobs": {"content": [{"token": "[", "logprob": -0.1, "top_logprobs": top}]}}]}


def _no_messages_in_tokenize(request):  # an SGLang before /tokenize took messages: prompt is required
    if request.url.path == "/tokenize" and b'"messages"' in request.content:
        return httpx2.Response(400, json={"object": "error", "code": 400, "message": "prompt: Field required"})
    return None


DIALECTS = {
    "llama.cpp": (make_handler(), LLAMACPP, "completions"),
    "vLLM": (make_handler(vllm=True), VLLM, "token-completions"),
    "chat prefill (vLLM without prompt lists)": (make_handler(vllm=True, fault=no_completions), CHAT_PREFILL, "chat"),
    "SGLang": (make_handler(sglang=True), SGLANG, "sglang-completions"),
    "chat prefill (SGLang without messages in /tokenize)": (
        make_handler(sglang=True, fault=_no_messages_in_tokenize), CHAT_PREFILL, "chat"),
    "Ollama": (make_handler(ollama=True), OLLAMA, "chat-text"),
    "hosted chat": (make_handler(fault=hosted(_chat_answer)), HOSTED_CHAT, ""),
    "hosted completions": (make_handler(fault=hosted(_chat_answer, completions=True)), HOSTED_COMPLETIONS, ""),
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_probes_to_its_kind_and_ranks_through_it(dialect):
    handler, kind, transport = DIALECTS[dialect]
    sync, async_ = clients(handler)
    rr = CapCalReranker(client=sync, async_client=async_, guard=None)
    caps = rr.capabilities()
    assert caps.kind is kind and kind_of(caps) is kind and caps.transport == transport
    ranking = rr.rerank("which is about fleas?", ["Fleas live 2-3 months.", "Bananas.", "Paris."])
    assert sorted(ranking.order) == [0, 1, 2] and len(ranking.scores) == 3


def test_capabilities_built_by_hand_find_the_kind_their_transport_names():
    def caps(**kw):
        return Capabilities(model="m", logprobs=True, max_top_logprobs=20, **{"transport": "", **kw})

    assert kind_of(caps(transport="completions")) is LLAMACPP
    assert kind_of(caps(transport="token-completions")) is VLLM
    assert kind_of(caps(transport="sglang-completions")) is SGLANG
    assert kind_of(caps(transport="chat")) is CHAT_PREFILL
    assert kind_of(caps(transport="chat-text")) is OLLAMA and route(caps(transport="chat-text")) == "text"
    assert kind_of(caps()) is HOSTED_CHAT and kind_of(caps(text_completions=5)) is HOSTED_COMPLETIONS
    assert [route(caps(transport="chat")), route(caps(text_completions=5), "raw"), route(caps())] == [
        "prefix", "text", "generation"]
    with pytest.raises(ValueError, match="no endpoint kind"):
        kind_of(caps(transport="carrier pigeon"))


def test_the_kind_is_not_part_of_the_capabilities_repr_or_equality():
    sync, async_ = clients(make_handler())
    caps = CapCalReranker(client=sync, async_client=async_, guard=None).capabilities()
    assert "kind" not in repr(caps) and dataclasses.replace(caps, kind=None) == caps


def _sglang(**kw):
    calls: list = []
    sync, async_ = clients(make_handler(sglang=True, calls=calls, **kw))
    return CapCalReranker(client=sync, async_client=async_, guard=None), calls


def test_sglang_sends_token_id_prompt_lists_and_reads_alternatives_by_token_text():
    rr, calls = _sglang(context=8192)
    caps = rr.capabilities()
    assert (caps.server, caps.tokenize, caps.context, caps.chat_extra["continue_final_message"]) == (
        "sglang", "sglang", 8192, True)
    del calls[:]
    ranking = rr.rerank("which is about fleas?", ["Fleas live 2-3 months.", "Bananas.", "Paris."])
    assert sorted(ranking.order) == [0, 1, 2] and ranking.upper_bounds == 0
    bodies = [json.loads(c.content) for c in calls if c.url.path == "/v1/completions"]
    assert bodies and all(isinstance(p, list) and all(isinstance(i, int) for i in p) for b in bodies for p in b["prompt"])
    assert not any("return_tokens_as_token_ids" in b or "logprob_token_ids" in b for b in bodies)
    assert all(b["user"] for b in bodies)  # SGLang's CompletionRequest takes `user`: the routing key goes there
    tokenized = [json.loads(c.content) for c in calls if c.url.path == "/tokenize"]
    assert any("messages" in b for b in tokenized) and all(b["add_special_tokens"] is False for b in tokenized)
    assert sorted(rr.with_options(method="vanilla").rerank("q", ["a", "b", "c"]).order) == [0, 1, 2]


def test_sglang_label_pieces_are_each_token_decoded_alone():
    rr, calls = _sglang()
    caps = rr.capabilities()
    del calls[:]
    sync, _ = clients(make_handler(sglang=True, calls=calls))
    tokens, _ = run_sync(tokenize(caps, [" [12]"]), sync)
    assert tokens == [[(508, " ["), (16, "1"), (17, "2"), (60, "]")]]
    [detok] = [json.loads(c.content) for c in calls if c.url.path == "/detokenize"]
    assert detok["tokens"] == [[16], [17], [60], [508]]


def test_ollama_continues_the_prefix_in_chat_and_reads_token_texts_without_a_tokenizer():
    calls: list = []
    sync, async_ = clients(make_handler(ollama=True, calls=calls))
    rr = CapCalReranker(client=sync, async_client=async_, guard=None)
    caps = rr.capabilities()
    assert (caps.server, caps.tokenize, caps.max_top_logprobs, caps.text_completions) == ("ollama", "", 20, 0)
    del calls[:]
    ranking = rr.rerank("which is about fleas?", ["Fleas live 2-3 months.", "Bananas.", "Paris."])
    assert sorted(ranking.order) == [0, 1, 2] and ranking.method == "capcal"
    assert {c.url.path for c in calls} == {"/v1/chat/completions"}  # no /tokenize, no /v1/completions
    bodies = [json.loads(c.content) for c in calls]
    assert all(b["messages"][-1]["role"] == "assistant" and b["messages"][-1]["content"].startswith("[")
               and b["top_logprobs"] <= 20 and "user" not in b for b in bodies)
    assert any(" > [" in b["messages"][-1]["content"] for b in bodies)  # later steps continue the ranking so far
    with pytest.raises(CapabilityError):  # its /v1/completions templates a text prompt: no client-side formats
        rr.with_options(prompt="chatml").rerank("q", ["a", "b", "c"])


MALFORMED = {  # path, body (bytes: sent as is)
    "not JSON": ("/v1/completions", b"{prompt"),
    "completions without a prompt": ("/v1/completions", {"logprobs": 5}),
    "a negative top-k": ("/v1/completions", {"prompt": "Q", "logprobs": -1}),
    "a top-k that is not a number": ("/v1/completions", {"prompt": "Q", "logprobs": "5"}),
    "chat without messages": ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 3}),
    "chat with a negative top-k": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Q"}],
                                                             "top_logprobs": -1}),
    "tokenize with a number": ("/tokenize", {"content": 5}),
}


@pytest.mark.parametrize("dialect", ["llama.cpp", "vLLM", "SGLang", "Ollama"])
@pytest.mark.parametrize("case", MALFORMED)
def test_the_test_double_answers_a_malformed_request_with_a_400_as_a_server_does(dialect, case):
    handler = DIALECTS[dialect][0]
    path, body = MALFORMED[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = handler(httpx2.Request("POST", f"http://fake.test{path}", content=content))  # never raised
    if dialect == "Ollama" and path != "/v1/chat/completions":  # no /tokenize; completions ignore log-probabilities
        assert answer.status_code == (404 if path == "/tokenize" else 200 if case.endswith("top-k") or "number" in case
                                      else 400), (answer.status_code, answer.text)
        return
    assert answer.status_code == 400, (answer.status_code, answer.text)
    assert "error" in answer.json() or answer.json().get("object") == "error"


def test_a_malformed_request_from_the_openai_client_is_a_typed_error_not_a_crash_of_the_double():
    client, _ = clients()
    with pytest.raises(__import__("openai").BadRequestError, match="malformed request"):
        client.completions.create(model="fake", prompt="Q", logprobs=-1, max_tokens=1)
