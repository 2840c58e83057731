"""Hosted APIs, end to end: a real llama.cpp server with assistant prefill off, seen through
:class:`HostedGateway` as a hosted chat-only API (chat completions, top_logprobs capped at 20, no
token ids, no /tokenize, /apply-template or /props) or a completions-only one (also a plain
/v1/completions with text prompts, legacy logprobs). The same server, asked directly, is the
reference: its llama.cpp prompt lists continue any prefix exactly.
"""

import asyncio
import logging

import pytest

from capcal_integrations import CapabilityError, CapCalReranker
from capcal_integrations.server import HostedGateway
from tests._samples import PASSAGES, QUERY

pytestmark = pytest.mark.e2e

#: Nine passages (identifiers [1]..[9]: one token each in Qwen's digit-splitting tokenizer).
NINE = PASSAGES + ["Fleas are small flightless insects.", "Paris is the capital of France.",
                   "Adult fleas live up to a year.", "Flea eggs hatch in two days to two weeks."]
TWENTY = NINE + [f"Filler passage {i} about the weather in town number {i}." for i in range(11)]


@pytest.fixture(scope="module")
def chat_api(hosted_server):
    with HostedGateway(hosted_server, "chat") as gateway:
        yield gateway


@pytest.fixture(scope="module")
def completions_api(hosted_server):
    with HostedGateway(hosted_server, "completions") as gateway:
        yield gateway


@pytest.fixture(scope="module")
def direct(hosted_server):
    return CapCalReranker(base_url=hosted_server, guard=None)


def test_the_gateway_looks_like_a_hosted_api(chat_api, completions_api, direct):
    caps = CapCalReranker(base_url=chat_api.base_url, api_key="x").capabilities()
    assert (caps.transport, caps.tokenize, caps.template, caps.text_completions) == ("", "", False, 0)
    assert caps.logprobs and caps.max_top_logprobs == 20 and caps.server == ""
    assert chat_api.requests["/tokenize"] == chat_api.requests["/apply-template"] == 0  # refused, never forwarded
    caps = CapCalReranker(base_url=completions_api.base_url, api_key="x").capabilities()
    assert caps.transport == "" and caps.text_completions == 20
    # the server behind them does not continue an assistant message, but its own prompt lists do
    assert direct.capabilities().transport == "completions"


def test_auto_runs_first_token_capcal_on_a_chat_only_api_in_two_requests(chat_api, caplog):
    rr = CapCalReranker(base_url=chat_api.base_url, api_key="x", guard=None)
    rr.capabilities()  # the probe's requests are not the list's
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        ranking = rr.rerank(QUERY, NINE)
    assert ranking.method == "first-token-capcal"
    assert sorted(ranking.order) == list(range(9)) and ranking.usage.requests == 2  # the real and the empty prompt
    assert any("auto runs first-token-capcal" in r.getMessage() and "cannot continue" in r.getMessage()
               for r in caplog.records)
    again = asyncio.run(rr.arerank(QUERY, NINE))  # the async driver runs the same flow
    assert again.method == ranking.method and again.usage.requests == 2 and sorted(again.order) == list(range(9))
    # the first call computed the prompts, this one finds them cached: llama.cpp's numbers drift by ~0.005
    assert max(abs(a - b) for a, b in zip(again.steps[0].p, ranking.steps[0].p)) < 0.02
    with pytest.raises(CapabilityError, match="first-token-capcal") as info:
        rr.with_options(method="capcal").rerank(QUERY, NINE)
    assert info.value.missing == "assistant prefill"


@pytest.mark.parametrize("method", ["first-token", "first-token-capcal"])
def test_first_token_scores_match_the_prefix_transport(chat_api, direct, method):
    """The generation transport reads the first identifier from the model's answer; the reference
    reads it after an empty assistant prefix. An answer reads only its own identifier's closing ']', so
    the generation transport computes the trie form (``probability="trie"``: renormalised where the
    identifiers branch), the reference too. Nine identifiers: every score within 0.02."""
    hosted = CapCalReranker(base_url=chat_api.base_url, api_key="x", method=method, guard=None).rerank(QUERY, NINE)
    reference = direct.with_options(method=method, probability="trie").rerank(QUERY, NINE)
    assert hosted.upper_bounds == 0 and reference.upper_bounds == 0
    gaps = [abs(a - b) for a, b in zip(hosted.scores, reference.scores)]
    assert max(gaps) < 0.02, gaps


def test_twenty_passages_in_windows_of_nine_match_the_prefix_transport(chat_api, direct):
    """Twenty passages: a digit-splitting tokenizer shares the token '1' among [1] and [10]..[19], which a
    generated answer reads only if it starts there; windows of nine identifiers are read exactly."""
    options = {"method": "first-token", "window": 9, "stride": 4, "guard": None, "probability": "trie"}
    hosted = CapCalReranker(base_url=chat_api.base_url, api_key="x", **options).rerank(QUERY, TWENTY)
    reference = direct.with_options(**options).rerank(QUERY, TWENTY)
    assert sorted(hosted.order) == list(range(20)) and hosted.upper_bounds == 0
    pairs = [(h, r) for h, r in zip(hosted.steps, reference.steps) if h.candidates == r.candidates]
    assert pairs and pairs[0][0].window == 0  # the first window holds the same passages by construction
    for h, r in pairs:
        gaps = [abs(a - b) for a, b in zip(h.p, r.p)]
        assert max(gaps) < 0.02, (h.window, gaps)


def test_twenty_passages_in_one_window_flag_what_the_answer_did_not_read(chat_api, direct):
    hosted = CapCalReranker(base_url=chat_api.base_url, api_key="x", method="first-token", guard=None)
    hosted.capabilities()
    ranking = hosted.rerank(QUERY, TWENTY)
    assert sorted(ranking.order) == list(range(20)) and ranking.usage.requests == 1
    # the answer passes through one first digit: the identifiers behind the other shared digit are estimates
    assert ranking.upper_bounds >= 2 and any("window=9" in note for note in ranking.notes)


@pytest.mark.parametrize("method", ["vanilla", "psc"])
def test_vanilla_and_psc_are_generated_rankings_on_a_chat_only_api(chat_api, method):
    rr = CapCalReranker(base_url=chat_api.base_url, api_key="x", method=method, m=2)
    rr.capabilities()
    ranking = rr.rerank(QUERY, NINE)
    assert ranking.method == method and sorted(ranking.order) == list(range(9))
    assert ranking.usage.requests == (1 if method == "vanilla" else 2)


def test_capcal_runs_step_by_step_on_a_completions_only_api(completions_api, direct):
    """A prompt rendered here (Qwen's ChatML) through a plain /v1/completions: auto runs capcal, and the
    first step matches the server's own template and prefix within 0.02."""
    rr = CapCalReranker(base_url=completions_api.base_url, api_key="x", prompt="chatml", guard=None)
    ranking = rr.rerank(QUERY, PASSAGES)
    assert ranking.method == "capcal" and sorted(ranking.order) == list(range(5)) and ranking.upper_bounds == 0
    assert len(ranking.steps) == 4 and completions_api.requests["/v1/completions"] > 0
    reference = direct.with_options(method="capcal").rerank(QUERY, PASSAGES)
    for got, want in ((ranking.steps[0].p, reference.steps[0].p), (ranking.steps[0].q, reference.steps[0].q)):
        assert max(abs(a - b) for a, b in zip(got, want)) < 0.02
    # without a client-side format the completions-only API is read through chat generation
    assert CapCalReranker(base_url=completions_api.base_url, api_key="x", guard=None).rerank(
        QUERY, PASSAGES).method == "first-token-capcal"
