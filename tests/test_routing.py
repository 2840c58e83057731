"""The routing key per list (capcal_integrations/endpoints/routing.py) and ``routed`` endpoints, on the fake endpoint.

A router keeps a list on one server only if every request of the list carries the same key: these
tests read every request the fake endpoint received (headers and bodies). The real router is
tests/test_router_e2e.py.
"""

import asyncio
import json

import httpx2
import pytest

from capcal_integrations import CapCalReranker, EndpointError, InputError
from capcal_integrations.options import Options
from tests.fake_endpoint import clients, make_handler

QUERY, PASSAGES = "q", [f"passage {i}" for i in range(5)]


def reranker(handler, **options):
    sync, async_ = clients(handler)
    return CapCalReranker(client=sync, async_client=async_, **{"guard": None, **options})  # not the content check's subject


def sent(calls):
    """(path, routing header, body) of each request the fake endpoint received."""
    return [(c.url.path, c.headers.get("X-Session-ID"), json.loads(c.content) if c.content else {}) for c in calls]


def refuses_mixed_prompts(request: httpx2.Request):
    """A router's check of ``prompt`` (vllm-router): text or token ids, never both in one prompt."""
    if request.url.path == "/v1/completions":
        prompt = json.loads(request.content)["prompt"]
        if isinstance(prompt, list) and any(isinstance(p, list) and {type(x) for x in p} == {str, int} for p in prompt):
            return httpx2.Response(422, text="prompt: data did not match any variant of untagged enum PromptInput")
    return None


@pytest.mark.parametrize("vllm", [False, True])
def test_every_request_of_a_list_carries_one_key_and_the_next_list_another(vllm):
    calls = []
    rr = reranker(make_handler(calls=calls, vllm=vllm), method="capcal")
    rr.rerank(QUERY, PASSAGES)
    first = sent(calls)
    calls.clear()
    rr.rerank(QUERY, PASSAGES)  # the same query again: a new key, not one derived from the query
    second = sent(calls)
    paths = {path for path, _, _ in first}
    assert {"/v1/models", "/tokenize", "/v1/completions"} <= paths  # the probe and /tokenize included
    keys = {key for _, key, _ in first}
    assert len(keys) == 1 and None not in keys
    [key] = keys
    assert len(key) == 32 and QUERY not in key
    assert {k for _, k, _ in second} != keys and len({k for _, k, _ in second}) == 1


@pytest.mark.parametrize("vllm", [False, True])
def test_the_body_carries_the_key_as_user_on_openai_routes_once_the_server_is_known(vllm):
    calls = []
    rr = reranker(make_handler(calls=calls, vllm=vllm), method="capcal")
    rr.rerank(QUERY, PASSAGES)
    requests = sent(calls)
    [key] = {k for _, k, _ in requests}
    probed = next(i for i, (path, _, body) in enumerate(requests) if path == "/v1/completions" and "user" in body)
    ranking = [body for path, _, body in requests[probed:] if path == "/v1/completions"]
    assert ranking and all(body["user"] == key for body in ranking)
    assert next(iter(ranking[0])) == "user"  # first: vllm-router reads the first "user" in the body text
    assert all("user" not in body for path, _, body in requests if path in ("/tokenize", "/apply-template"))
    assert all("user" not in body for path, _, body in requests[:probed] if path.startswith("/v1/"))  # the probe


def test_a_server_not_known_to_take_user_gets_the_header_only():
    base = make_handler()

    def unknown_server(request):
        if request.url.path == "/v1/models":  # not llama.cpp, not vLLM: a gateway of some kind
            return httpx2.Response(200, json={"data": [{"id": "fake", "owned_by": "some-gateway"}]})
        return base(request)

    calls = []
    rr = reranker(lambda r: calls.append(r) or unknown_server(r), method="capcal")
    rr.rerank(QUERY, PASSAGES)
    requests = sent(calls)
    assert all(key is not None for _, key, _ in requests)
    assert not any("user" in body for _, _, body in requests)


def test_async_lists_get_their_own_keys():
    calls = []
    rr = reranker(make_handler(calls=calls), method="first-token-capcal")

    async def main():
        return await rr.arerank_many([(QUERY, PASSAGES), ("other", PASSAGES[:3])])

    asyncio.run(main())
    by_key = {}
    for path, key, body in sent(calls):
        if path == "/v1/completions" and "user" in body:
            assert body["user"] == key
            by_key.setdefault(key, set()).add(json.dumps(body["prompt"]))
    assert len(by_key) == 2  # two lists, two keys, each on its own prompts
    [a, b] = by_key.values()
    assert not a & b


def test_other_header_names_and_none():
    calls = []
    rr = reranker(make_handler(calls=calls), method="capcal", routing_header="x-litellm-session-id")
    rr.rerank(QUERY, PASSAGES)
    assert len({c.headers.get("x-litellm-session-id") for c in calls} - {None}) == 1
    assert all("X-Session-ID" not in c.headers for c in calls)
    calls.clear()
    rr.with_options(routing_header=None).rerank(QUERY, PASSAGES)
    assert all("X-Session-ID" not in c.headers and "x-litellm-session-id" not in c.headers for c in calls)
    assert not any("user" in json.loads(c.content) for c in calls if c.content)


def test_routing_header_is_checked():
    assert Options.parse("routing_header", "none") is None
    assert Options(routing_header="X-User-ID").routing_header == "X-User-ID"
    for bad in ("Authorization", "content-type", "X Session", "", 3):
        with pytest.raises(InputError, match="routing_header"):
            Options(routing_header=bad)
    with pytest.raises(InputError, match="routed"):
        Options(routed="yes")


def test_routed_sends_no_slot_pins_and_token_ids_only():
    calls = []
    rr = reranker(make_handler(calls=calls, slots=4, fault=refuses_mixed_prompts), method="capcal", routed=True)
    routed = rr.rerank(QUERY, PASSAGES)
    prompts = [json.loads(c.content) for c in calls if c.url.path == "/v1/completions"]
    ranking = [b for b in prompts if isinstance(b["prompt"][0], list)]
    assert ranking and all("id_slot" not in b for b in ranking)
    assert all(isinstance(x, int) for b in ranking for p in b["prompt"] for x in p)
    assert all(len(b["prompt"]) == 1 for b in ranking)  # one by one: llama.cpp keeps each in the slot of its prefix
    tokenized = [json.loads(c.content) for c in calls if c.url.path == "/tokenize"]
    assert any(isinstance(t["content"], list) and t["parse_special"] for t in tokenized)  # the mixed prompt, as ids
    direct = reranker(make_handler(slots=4), method="capcal").rerank(QUERY, PASSAGES)  # mixed prompts, pinned
    assert routed.order == direct.order and routed.scores == pytest.approx(direct.scores)


def test_without_routed_a_router_refuses_llamacpp_prompts():
    rr = reranker(make_handler(fault=refuses_mixed_prompts), method="capcal")
    with pytest.raises(EndpointError, match="422"):
        rr.rerank(QUERY, PASSAGES)


def test_a_routed_copy_and_a_direct_one_share_the_endpoint_but_not_the_prompt_form():
    calls = []
    rr = reranker(make_handler(calls=calls, slots=4), method="capcal")
    rr.rerank(QUERY, PASSAGES)
    calls.clear()
    rr.with_options(routed=True).rerank(QUERY, PASSAGES)  # the direct ranking's cached mixed prompts are not sent
    ranking = [json.loads(c.content) for c in calls if c.url.path == "/v1/completions"]
    assert ranking and all(isinstance(x, int) for b in ranking for p in b["prompt"] for x in p)
    assert not rr.settings()["routed"]  # the copy's option stayed the copy's
