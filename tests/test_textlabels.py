"""Reading identifiers from token strings (hosted APIs), with hand-worked numbers, and the routes.

The live counterpart is tests/test_hosted.py (a real model behind HostedGateway)."""

import math

import httpx2
import pytest

from capcal_integrations import CapabilityError, CapCalReranker, ResponseError
from capcal_integrations.endpoints.probe import route
from capcal_integrations.reading.textlabels import nodes_to_read, parse_ranking, path_reads, score_texts
from capcal_integrations.server import HostedGateway
from capcal_integrations.types import Capabilities
from tests.fake_endpoint import clients, hosted, make_handler

L = math.log


def probs(scores):
    return [round(math.exp(v), 4) for v in scores.logprobs]


def test_a_tokenizer_that_merges_numbers_reads_every_identifier_in_one_position():
    labels = ["[1]", "[2]", "[12]"]
    # tiktoken-like: "[" then "12" and "2" as whole tokens; "1" is shared by [1] and [12] and not read
    reads = {"": (("[", L(.9)),), "[": (("12", L(.5)), ("2", L(.3)), ("1", L(.15)))}
    scores = score_texts(labels, reads)
    assert probs(scores) == [0.135, 0.27, 0.45]  # [1]: estimated by "1" (an upper bound); [12] read whole
    assert scores.upper_bounds == 1


def test_merged_closing_tokens_spell_the_identifier_whole():
    reads = {"": (("[12]>", L(.4)), ("[3", L(.3)), ("[1", L(.2))), "[1": (("]", L(.5)), ("0", L(.4)))}
    assert probs(score_texts(["[1]", "[3]", "[10]", "[12]"], reads)) == [0.1, 0.3, 0.08, 0.4]


def test_a_label_missing_from_the_top_k_takes_the_floor_and_counts():
    reads = {"[": (("1", L(.6)), ("2", L(.3)))}
    scores = score_texts(["[1]", "[2]", "[3]"], reads, "[")
    assert probs(scores) == [0.6, 0.3, 0.3] and scores.upper_bounds == 1


def test_the_trie_form_renormalises_where_the_identifiers_branch():
    reads = {"": (("[", L(.5)), ("[]", L(.5))), "[": (("1", L(.3)), ("2", L(.1)), ("x", L(.2))),
             "[1": (("]", L(.6)), ("0", L(.2)), ("!", L(.2)))}
    joint = score_texts(["[1]", "[2]", "[10]"], reads, form="joint")
    trie = score_texts(["[1]", "[2]", "[10]"], reads, form="trie")
    assert probs(joint) == [0.09, 0.05, 0.03]
    assert probs(trie) == [0.5625, 0.25, 0.1875]  # .75 * .75, .25, .75 * .25


def test_nodes_to_read_walk_breadth_first():
    reads = {"[": (("1", L(.5)), ("2", L(.3)), ("3", L(.2)))}
    assert nodes_to_read(["[1]", "[2]", "[10]"], reads) == ["[1", "[2"]
    assert nodes_to_read(["[1]", "[2]", "[10]"], reads, "trie") == ["[1"]


def test_the_answer_is_read_from_its_first_identifier():
    answer = (("Sure", (("Sure", -0.1),)), ("!", ()), (" [", ((" [", L(.9)),)), ("3", (("3", L(.7)), ("1", L(.2)))),
              ("]", (("]", -0.01),)))
    reads, text = path_reads(answer, ["[1]", "[3]"])
    assert text == "Sure! [3]" and sorted(reads) == ["", "[", "[3"]
    assert probs(score_texts(["[1]", "[3]"], reads, strip=True)) == [0.18, 0.6237]  # .9 * .2; .9 * .7 * e^-0.01


def test_a_generated_ranking_is_repaired_into_a_permutation():
    assert parse_ranking("[3] > [1] > [3] > [7]", ["[1]", "[2]", "[3]"]) == ([2, 0, 1], 1)
    assert parse_ranking("I cannot rank these.", ["[A]", "[B]"]) == ([0, 1], 2)


def _caps(**kw):
    return Capabilities(model="m", logprobs=kw.pop("logprobs", True), max_top_logprobs=20,
                        transport=kw.pop("transport", ""), **kw)


def test_routes():
    assert route(_caps(transport="completions"), "chatml") == "prefix"
    assert route(_caps(transport="chat")) == "prefix"
    assert route(_caps(text_completions=5), "raw") == "text"
    assert route(_caps(text_completions=5), "chat") == "generation"  # no client-side format: read answers
    assert route(_caps()) == "generation"
    for caps in (_caps(transport="chat"), _caps()):  # a client-side format needs a text /v1/completions
        with pytest.raises(CapabilityError, match="prompt='chat'"):
            route(caps, "raw")
    with pytest.raises(CapabilityError) as info:
        route(_caps(logprobs=False))
    assert info.value.missing == "logprobs"


def _chat_only(script):
    """A hosted chat-only fake: no tokenizer, no templates, no completions; every chat completion
    answers ``script`` (positions of (token, [(alternative, probability)]))."""
    content = [{"token": t, "logprob": math.log(dict(alts).get(t, 1.0)),
                "top_logprobs": [{"token": a, "logprob": math.log(p)} for a, p in alts]} for t, alts in script]

    fault = hosted(lambda: {"choices": [{"index": 0, "logprobs": {"content": content}}]})
    sync, async_ = clients(make_handler(fault=fault))
    return CapCalReranker(client=sync, async_client=async_, guard=None)


def test_first_token_on_a_chat_only_endpoint_reads_the_answer():
    rr = _chat_only([("[", [("[", .95), ("I", .05)]), ("2", [("2", .6), ("1", .3), ("3", .1)]), ("]", [("]", .99)])])
    ranking = rr.with_options(method="first-token").rerank("q", ["a", "b", "c"])
    assert ranking.order == (1, 0, 2) and [round(x, 3) for x in ranking.steps[0].p] == [0.3, 0.6, 0.1]
    assert ranking.method == "first-token" and ranking.upper_bounds == 0 and ranking.usage.requests >= 1
    auto = rr.rerank("q", ["a", "b", "c"])
    assert auto.method == "first-token-capcal" and sorted(auto.order) == [0, 1, 2]
    generated = rr.with_options(method="vanilla").rerank("q", ["a", "b", "c"])  # the answer names [2] only
    assert generated.order == (1, 0, 2) and "left out 2 of 3" in generated.notes[0]


def test_an_answer_without_an_identifier_is_a_typed_error():
    rr = _chat_only([("I", [("I", .9)]), (" cannot", [(" cannot", .9)])])
    with pytest.raises(ResponseError, match="names no identifier"):
        rr.with_options(method="first-token").rerank("q", ["a", "b"])


def test_the_gateway_refuses_what_hosted_apis_refuse():
    gateway = HostedGateway("http://127.0.0.1:9/v1", "completions")  # never started: nothing is forwarded
    try:
        assert gateway.answer("POST", "/tokenize", {"content": "x"})[0] == 404
        assert gateway.answer("POST", "/apply-template", {"messages": []})[0] == 404
        status, body = gateway.answer("POST", "/v1/chat/completions", {"model": "m", "messages": [], "top_logprobs": 21})
        assert status == 400 and "<= 20" in body["error"]["message"]
        status, body = gateway.answer("POST", "/v1/chat/completions", {"model": "m", "continue_final_message": True})
        assert status == 400 and "continue_final_message" in body["error"]["message"]
        assert gateway.answer("POST", "/v1/completions", {"model": "m", "prompt": [[1, 2, 3]]})[0] == 400
        gateway.kind = "chat"  # a chat-only API has no /v1/completions
        assert gateway.answer("POST", "/v1/completions", {"model": "m", "prompt": "x"})[0] == 404
        assert not gateway.requests  # none of these reached the server
    finally:
        gateway.stop()


def _completions_only(calls, lists: bool):
    """A hosted completions fake: no tokenizer or templates, chat without prefill, legacy logprobs on
    /v1/completions, and (``lists=False``) one prompt per request."""
    import json

    def fault(request):
        if request.url.path in ("/tokenize", "/apply-template", "/props"):
            return httpx2.Response(404, json={"error": "not found"})
        if request.url.path == "/v1/models":
            return httpx2.Response(200, json={"data": [{"id": "hosted", "owned_by": "together"}]})
        if request.url.path == "/v1/chat/completions":  # no prefill: the answer never continues the alphabet
            return httpx2.Response(200, json={"choices": [{"index": 0, "logprobs": {"content": [
                {"token": "[", "logprob": -0.1, "top_logprobs": [{"token": "[", "logprob": -0.1}]}]}}]})
        if request.url.path == "/v1/completions":
            calls.append(json.loads(request.content)["prompt"])
            if not lists and isinstance(calls[-1], list):
                return httpx2.Response(400, json={"error": {"message": "prompt must be a string"}})
        return None

    sync, async_ = clients(make_handler(fault=fault, legacy=True))
    return CapCalReranker(client=sync, async_client=async_, guard=None, prompt="chatml")


@pytest.mark.parametrize("method", ["capcal", "vanilla", "first-token-capcal"])
def test_a_completions_endpoint_with_or_without_prompt_lists_ranks_the_same(method):
    with_lists, one_each = [], []
    a = _completions_only(with_lists, True).with_options(method=method)
    b = _completions_only(one_each, False).with_options(method=method)
    assert a.capabilities().prompt_lists and not b.capabilities().prompt_lists
    assert a.capabilities().text_completions == b.capabilities().text_completions == 20
    ra, rb = a.rerank("q", ["a", "b", "c", "d"]), b.rerank("q", ["a", "b", "c", "d"])
    assert ra.method == rb.method == method and ra.order == rb.order and sorted(ra.order) == [0, 1, 2, 3]
    assert [s.p for s in ra.steps] == [s.p for s in rb.steps]
    assert all(isinstance(p, str) for p in one_each[2:])  # after the probe: one text prompt per request
    assert any(isinstance(p, list) and len(p) > 1 for p in with_lists[1:])


def test_a_models_own_chat_template_is_rendered_here(tmp_path):
    from capcal_integrations import InputError, Options
    from capcal_integrations.prompts.files import prompt_text

    config = tmp_path / "tokenizer_config.json"
    config.write_text('{"chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}'
                      '<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<bot>'
                      '{% endif %}"}], "bos_token": "<s>", "eos_token": {"content": "</s>"}}')
    assert prompt_text((("system", "S"), ("user", "U")), str(config)) == "<system>S</s><user>U</s><bot>"  # no BOS
    assert Options(prompt=str(config)).prompt == str(config)
    with pytest.raises(InputError, match="tokenizer_config.json"):
        Options(prompt="chatml2")


def _no_logprobs(answers: bool):
    """As Groq documents: logprobs and top_logprobs are a 400; no /v1/completions. With ``answers``,
    plain chat completions answer "[2] > [1]"; without, they fail too."""
    import json

    def fault(request):
        if request.url.path in ("/tokenize", "/apply-template", "/props", "/v1/completions"):
            return httpx2.Response(404, json={"error": "not found"})
        if request.url.path == "/v1/chat/completions":
            if "logprobs" in json.loads(request.content) or not answers:
                return httpx2.Response(400, json={"error": {"message": "'logprobs' is not supported"}})
            return httpx2.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant",
                                                                                    "content": "[2] > [1]"}}]})
        return None

    sync, async_ = clients(make_handler(fault=fault))
    return CapCalReranker(client=sync, async_client=async_)


def test_an_api_without_logprobs_ranks_only_from_answers_and_says_so():
    rr = _no_logprobs(answers=True)
    caps = rr.capabilities()
    assert not caps.logprobs and caps.chat and caps.transport == ""
    for method in ("auto", "first-token", "first-token-capcal", "capcal"):
        with pytest.raises(CapabilityError) as info:
            rr.with_options(method=method).rerank("q", ["a", "b", "c"])
        assert info.value.missing == "logprobs" and info.value.alternatives == ("vanilla", "psc")
    vanilla = rr.with_options(method="vanilla").rerank("q", ["a", "b", "c"])
    assert vanilla.order == (1, 0, 2) and "left out 1 of 3" in vanilla.notes[0]
    assert sorted(rr.with_options(method="psc", m=2).rerank("q", ["a", "b", "c"]).order) == [0, 1, 2]
    for method in ("auto", "vanilla"):  # no answers at all
        with pytest.raises(CapabilityError) as info:
            _no_logprobs(answers=False).with_options(method=method).rerank("q", ["a", "b"])
        assert info.value.missing == "logprobs"
