"""The endpoint kinds (issue 25): the probe picks one object per endpoint, every dialect of the test double
probes to its own kind, and capabilities built by hand find the kind their transport names."""

from __future__ import annotations

import dataclasses

import pytest

from capcal_integrations import CapCalReranker
from capcal_integrations.endpoints import CHAT_PREFILL, HOSTED_CHAT, HOSTED_COMPLETIONS, LLAMACPP, VLLM, kind_of
from capcal_integrations.probe import route
from capcal_integrations.testing import clients, hosted, make_handler
from capcal_integrations.types import Capabilities
from tests.fake_endpoint import httpx2


def _chat_answer() -> dict:
    top = [{"token": t, "logprob": lp} for t, lp in (("[", -0.1), (" [", -2.5))]
    return {"choices": [{"index": 0, "message": {"content": "[2] > [1] > [3]"},
                         "logprobs": {"content": [{"token": "[", "logprob": -0.1, "top_logprobs": top}]}}]}


def _no_completions(request):
    return httpx2.Response(404, json={}) if request.url.path == "/v1/completions" else None


DIALECTS = {
    "llama.cpp": (make_handler(), LLAMACPP, "completions"),
    "vLLM": (make_handler(vllm=True), VLLM, "token-completions"),
    "chat prefill (vLLM without prompt lists)": (make_handler(vllm=True, fault=_no_completions), CHAT_PREFILL, "chat"),
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
    assert kind_of(caps(transport="chat")) is CHAT_PREFILL
    assert kind_of(caps()) is HOSTED_CHAT and kind_of(caps(text_completions=5)) is HOSTED_COMPLETIONS
    assert [route(caps(transport="chat")), route(caps(text_completions=5), "raw"), route(caps())] == [
        "prefix", "text", "generation"]
    with pytest.raises(ValueError, match="no endpoint kind"):
        kind_of(caps(transport="carrier pigeon"))


def test_the_kind_is_not_part_of_the_capabilities_repr_or_equality():
    sync, async_ = clients(make_handler())
    caps = CapCalReranker(client=sync, async_client=async_, guard=None).capabilities()
    assert "kind" not in repr(caps) and dataclasses.replace(caps, kind=None) == caps
