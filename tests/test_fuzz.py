"""Malformed answers from an endpoint: only typed errors come out (issue 16, item 9).

Generated JSON is fed (a) to each parser of :mod:`capcal_integrations.endpoints.answers` directly, arbitrary
shapes and "near-valid" ones (real llama.cpp / vLLM / OpenAI answers with a field replaced by another
type, wrapped, stringified or dropped), and (b) through whole flows over the fake endpoint
(tests/fake_endpoint.py): the probe, and rerankings of every dialect with one answer mutated. A parser
may return or raise :class:`~capcal_integrations.ResponseError`; a flow may return a valid ranking or
raise a :class:`~capcal_integrations.CapCalError`; nothing else. Examples are derandomized so the suite
is reproducible and fast.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import threading

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capcal_integrations import METHODS, Capabilities, CapCalError, CapCalReranker, ResponseError
from capcal_integrations.endpoints import text_next_tokens
from capcal_integrations.endpoints.answers import choices_of as _choices
from capcal_integrations.endpoints.answers import (
    completion_alternatives,
    first_choice,
    generated,
    parse_tokens,
    top_entries,
    usage_of,
)
from capcal_integrations.endpoints.answers import template_of as _template_of
from capcal_integrations.endpoints.calls import EndpointState
from tests.fake_endpoint import clients, hosted, make_handler

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
FLOWS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
RANKINGS = settings(FLOWS, max_examples=120)

# --------------------------------------------------------------------------- real answers, as the servers send them

_ONE = {"id": 16, "token": "1", "bytes": [49], "logprob": -0.5}
_TWO = {"id": 17, "token": "2", "bytes": [50], "logprob": -1.5}
LLAMACPP_COMPLETIONS = {"choices": [{"index": i, "text": "", "logprobs": {"content": [{**_ONE, "top_logprobs": [_ONE, _TWO]}]}}
                                    for i in range(2)], "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
LEGACY_COMPLETIONS = {"choices": [{"index": 0, "text": "1", "finish_reason": "length", "logprobs": {
    "tokens": ["1"], "token_logprobs": [-0.5], "text_offset": [0], "top_logprobs": [{"1": -0.5, "2": -1.5, " [": -3.0}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}
VLLM_COMPLETIONS = {"id": "cmpl-1", "object": "text_completion", "choices": [
    {"index": i, "text": "1", "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:16"], "token_logprobs": [-0.5], "text_offset": [0],
        "top_logprobs": [{"token_id:16": -0.5, "token_id:17": -1.5}]}} for i in range(2)],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 8}}}
OPENAI_CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{
    "index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "[2] > [1]"},
    "logprobs": {"content": [
        {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": [
            {"token": t, "logprob": -0.1, "bytes": list(t.encode())}, {"token": "1", "logprob": -2.5, "bytes": [49]}]}
        for t in ("[", "2", "]", " >", " [", "1", "]")]}}],
    "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57, "prompt_tokens_details": {"cached_tokens": 0}}}
LLAMACPP_TOKENIZE = {"tokens": [{"id": 58, "piece": "["}, {"id": 16, "piece": "1"}, {"id": 15, "piece": "0"},
                                {"id": 60, "piece": [93]}]}
VLLM_TOKENIZE = {"count": 4, "max_model_len": 4096, "tokens": [58, 16, 15, 60], "token_strs": ["[", "1", "0", "]"]}
APPLY_TEMPLATE = {"prompt": "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"}
VLLM_TEMPLATE = {"count": 3, "max_model_len": 4096, "tokens": [151644, 872, 198]}
COMPLETIONS = [LLAMACPP_COMPLETIONS, LEGACY_COMPLETIONS, VLLM_COMPLETIONS]

# --------------------------------------------------------------------------- generated JSON

#: Field names of the real answers, so that generated objects often hit the paths parsers read.
KEYS = st.sampled_from(["choices", "index", "logprobs", "content", "top_logprobs", "token", "logprob", "id", "bytes",
                        "tokens", "token_strs", "piece", "text", "usage", "prompt_tokens", "completion_tokens",
                        "prompt_tokens_details", "cached_tokens", "prompt", "message", "token_id:16", "1"]) | st.text(max_size=6)
LEAVES = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.just(10 ** 400)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
JSON = st.recursive(LEAVES, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=4),
                    max_leaves=15)


@st.composite
def mutated(draw, sample, at_most: int = 3):
    """``sample`` with one to ``at_most`` changes, each at a random path: replaced by any JSON value,
    by its own string, wrapped in a list or an object, set to null, or its key dropped."""
    value = copy.deepcopy(sample)
    for _ in range(draw(st.integers(1, at_most))):
        value = _mutate(draw, value)
    return value


def _mutate(draw, node, depth=None):
    depth = draw(st.sampled_from([7, 6, 5, 4, 3, 2, 1, 0])) if depth is None else depth  # how deep the change lands
    if isinstance(node, (dict, list)) and node and depth > 0:
        if isinstance(node, dict):
            key = draw(st.sampled_from(sorted(node)))
            if depth == 1 and draw(st.booleans()):
                del node[key]
            else:
                node[key] = _mutate(draw, node[key], depth - 1)
        else:
            i = draw(st.integers(0, len(node) - 1))
            node[i] = _mutate(draw, node[i], depth - 1)
        return node
    return draw(st.one_of(st.none(), st.just(str(node)), st.just([node]), st.just({"value": node}), JSON,
                          st.just(json.dumps(node))))


# --------------------------------------------------------------------------- (a) each parser on its own


def _state() -> EndpointState:
    return EndpointState(caps=Capabilities(model="m", logprobs=True, max_top_logprobs=20, transport="",
                                           text_completions=20, prompt_lists=True))


def _text_next_tokens(answer, asked):
    flow = text_next_tokens(_state(), ["a", "b"][:asked], 5)
    next(flow)
    try:
        flow.send([answer])
    except StopIteration as stop:
        return stop.value
    raise AssertionError("text_next_tokens asked for more")


def _checked_entries(entries):
    for token_id, piece, logprob in entries:
        assert token_id is None or (type(token_id) is int and token_id >= 0)
        assert isinstance(piece, str) and isinstance(logprob, float) and math.isfinite(logprob) and logprob <= 0
    return entries


def _checked_usage(usage):
    assert all(type(v) is int and v >= 0 for v in (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens))
    return usage


def _alternatives_ok(alternatives):
    for alternative in alternatives:
        assert all(isinstance(t, str) and math.isfinite(v) and v <= 0 for t, v in alternative)
    return alternatives


#: (name, parser, the real answers it reads)
PARSERS = [
    ("usage_of", lambda a: _checked_usage(usage_of(a)), [*COMPLETIONS, OPENAI_CHAT]),
    ("parse_tokens", lambda a: [(int(i), str(p)) for i, p in parse_tokens(a)], [LLAMACPP_TOKENIZE, VLLM_TOKENIZE]),
    ("top_entries", lambda a: _checked_entries(top_entries(a)),
     [c for s in [*COMPLETIONS, OPENAI_CHAT] for c in s["choices"]]),
    ("choices", lambda a: _choices(a, 2), [LLAMACPP_COMPLETIONS, VLLM_COMPLETIONS]),
    ("template_text", lambda a: _template_of(a, False), [APPLY_TEMPLATE]),
    ("template_ids", lambda a: _template_of(a, True), [VLLM_TEMPLATE]),
    ("text_next_tokens", lambda a: _alternatives_ok(_text_next_tokens(a, len(a.get("choices", [])) if isinstance(a, dict)
                                                                     and isinstance(a.get("choices"), list) else 1)),
     COMPLETIONS),
]
#: Readers that exist only in :mod:`capcal_integrations.endpoints.answers`.
READERS = [
    ("first_choice", first_choice, [OPENAI_CHAT]),
    ("completion_alternatives", lambda a: _alternatives_ok(completion_alternatives(a, 2)),
     [LLAMACPP_COMPLETIONS, VLLM_COMPLETIONS]),
    ("generated", lambda a: [_alternatives_ok([alts for _, alts in generated(a, True)])], [OPENAI_CHAT]),
    ("generated_text", lambda a: generated(a, False), [OPENAI_CHAT]),
]


def _only_response_errors(parse, answer):
    try:
        parse(answer)
    except ResponseError as err:
        assert "malformed" in str(err) or "carries no" in str(err) or "asked for" in str(err), err


@pytest.mark.parametrize("name, parse, samples", PARSERS + READERS, ids=[p[0] for p in PARSERS + READERS])
def test_the_real_answers_parse(name, parse, samples):
    for sample in samples:
        parse(copy.deepcopy(sample))


@pytest.mark.parametrize("name, parse, samples", PARSERS + READERS, ids=[p[0] for p in PARSERS + READERS])
@FAST
@given(answer=JSON)
def test_any_json_gives_a_result_or_a_response_error(name, parse, samples, answer):
    _only_response_errors(parse, answer)


@pytest.mark.parametrize("name, parse, samples", PARSERS + READERS, ids=[p[0] for p in PARSERS + READERS])
@FAST
@given(data=st.data())
def test_near_valid_answers_give_a_result_or_a_response_error(name, parse, samples, data):
    sample = data.draw(st.sampled_from(samples))
    _only_response_errors(parse, data.draw(mutated(sample)))


@pytest.mark.parametrize("answer, what", [
    ({"choices": "oops"}, "'choices' is not a list"),
    ({"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": [{"token": "1", "logprob": "-0.5"}]}]}}]},
     "'logprob' is not a number"),
    ({"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": ["1"]}]}}]}, "entry is not an object"),
    ({"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": [{"token": "1", "logprob": float("nan")}]}]}}]},
     "not a log-probability"),
    ({"choices": [{"index": "0", "logprobs": None}]}, "indices"),
])
def test_the_error_says_what_was_malformed_and_shows_the_answer(answer, what):
    with pytest.raises(ResponseError, match=what) as info:
        _text_next_tokens(answer, 1)
    assert "got {" in str(info.value) and json.dumps(info.value.body) in json.dumps(answer)  # the part that broke


def test_a_string_usage_is_a_response_error():
    with pytest.raises(ResponseError, match="'usage' is not an object"):
        usage_of({"choices": [], "usage": "n/a"})
    with pytest.raises(ResponseError, match="prompt_tokens"):
        usage_of({"usage": {"prompt_tokens": "10"}})
    assert usage_of({"usage": None}).requests == 1  # absent is not malformed


def test_log_probabilities_are_clamped_into_their_range():
    [entry] = top_entries({"logprobs": {"content": [{"top_logprobs": [{"token": "1", "logprob": -math.inf}]}]}})
    assert entry[2] == -1e4
    [entry] = top_entries({"logprobs": {"top_logprobs": [{"token_id:²": 1e-6}]}})
    assert entry == (None, "token_id:²", 0.0)  # not a vLLM id (its digit is not ASCII); a rounding error read as 0


# --------------------------------------------------------------------------- (b) whole flows, one answer mutated


_hosted_chat = hosted(lambda: copy.deepcopy(OPENAI_CHAT))  # a hosted chat API: the answer names [2] then [1]
_hosted_completions = hosted(lambda: copy.deepcopy(OPENAI_CHAT), completions=True, owner="together")  # legacy logprobs


DIALECTS = {
    "llamacpp": (dict(slots=4), {}),
    "legacy": (dict(legacy=True), {}),
    "vllm": (dict(vllm=True), {}),
    "vllm-chat": (dict(vllm=True, fault=lambda r: httpx2.Response(404, json={}) if r.url.path == "/v1/completions"
                       else None), {}),
    "hosted-chat": (dict(fault=_hosted_chat), {}),
    "hosted-completions": (dict(fault=_hosted_completions, legacy=True), {"prompt": "chatml"}),
}


class Mutating:
    """A fake endpoint that, once armed, answers about one in ``rate`` successful JSON answers (of the
    completions routes only, with ``logprobs_only``) mutated, at most twice per example.

    Hypothesis draws only on the test's own thread: the answers to the sync driver's concurrent rounds (calls
    pinned to different slots, each sent from a thread of its own) pass unmutated. The same answers reach the
    same parsers in the async examples, whose concurrent rounds run on the test's thread."""

    def __init__(self, dialect: str, data, rate: int, logprobs_only: bool = False):
        handler_options, self.options = DIALECTS[dialect]
        self.base, self.data, self.rate, self.logprobs_only = make_handler(**handler_options), data, rate, logprobs_only
        self.armed, self.mutated = False, []
        self.thread = threading.get_ident()

    def __call__(self, request):
        try:
            response = self.base(request)
        except (KeyError, TypeError, ValueError):  # the fake cannot read a request another server's shape: a 400
            return httpx2.Response(400, json={"error": {"message": "bad request"}})
        if not self.armed or response.status_code != 200 or len(self.mutated) >= 2 or threading.get_ident() != self.thread:
            return response
        if self.logprobs_only and not request.url.path.endswith("completions"):
            return response
        if not self.data.draw(st.sampled_from([True] + [False] * (self.rate - 1)), label="mutate this answer?"):
            return response
        answer = self.data.draw(mutated(json.loads(response.content), at_most=2), label=f"{request.url.path} answer")
        self.mutated.append(answer)
        return httpx2.Response(200, json=answer)


def _valid(ranking, n):
    assert sorted(ranking.order) == list(range(n)) and len(ranking.scores) == n
    assert all(math.isfinite(s) for s in ranking.scores), ranking.scores
    assert [ranking.scores[i] for i in ranking.order] == sorted(ranking.scores, reverse=True)


@FLOWS
@given(data=st.data(), dialect=st.sampled_from(sorted(DIALECTS)), rate=st.integers(1, 8))
def test_the_probe_with_a_malformed_answer_gives_capabilities_or_a_typed_error(data, dialect, rate):
    endpoint = Mutating(dialect, data, rate)
    endpoint.armed = True
    sync, _ = clients(endpoint)
    try:
        caps = CapCalReranker(client=sync, **endpoint.options).capabilities()
    except CapCalError:
        return
    assert isinstance(caps.model, str) and caps.model
    assert caps.context is None or (type(caps.context) is int and caps.context > 0)
    assert type(caps.slots) is int and caps.slots >= 0


@RANKINGS
@given(data=st.data(), dialect=st.sampled_from(sorted(DIALECTS)), method=st.sampled_from(METHODS),
       n=st.integers(2, 6), rate=st.integers(2, 12), logprobs_only=st.booleans(),
       asynchronous=st.sampled_from([False, False, True]))
def test_a_reranking_with_a_malformed_answer_gives_a_ranking_or_a_typed_error(data, dialect, method, n, rate,
                                                                              logprobs_only, asynchronous):
    endpoint = Mutating(dialect, data, rate, logprobs_only)
    sync, async_ = clients(endpoint)
    rr = CapCalReranker(client=sync, async_client=async_, method=method, m=2, window=4, stride=2, guard=None,
                        **endpoint.options)  # every answer in the ranking itself (no background reading)
    rr.capabilities()  # probed from clean answers: the mutation lands in the ranking itself
    endpoint.armed = True
    passages = [f"passage {i} about fleas" for i in range(n)]
    try:
        ranking = asyncio.run(rr.arerank("q", passages)) if asynchronous else rr.rerank("q", passages)
    except CapCalError:
        return
    _valid(ranking, n)


def _floats_as_strings(value):
    if isinstance(value, float):
        return str(value)
    if isinstance(value, dict):
        return {k: _floats_as_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats_as_strings(v) for v in value]
    return value


@pytest.mark.parametrize("dialect", ["llamacpp", "vllm", "hosted-chat", "hosted-completions"])
@pytest.mark.parametrize("break_it", [
    lambda a: {**a, "choices": "oops"},  # a string in choices
    lambda a: {**a, "usage": "n/a"},  # a string usage
    lambda a: {**a, "choices": [1, 2]} if "choices" in a else {**a, "tokens": "x"},  # non-object entries
    lambda a: _floats_as_strings(a),  # string logprobs (every float of these answers is a logprob)
], ids=["string-choices", "string-usage", "non-object-entries", "string-logprobs"])
def test_the_issues_examples_are_response_errors_in_a_reranking(dialect, break_it):
    handler_options, options = DIALECTS[dialect]
    base, armed = make_handler(**handler_options), []

    def endpoint(request):
        response = base(request)
        if armed and response.status_code == 200 and request.url.path != "/tokenize":
            return httpx2.Response(200, json=break_it(json.loads(response.content)))
        return response

    sync, _ = clients(endpoint)
    rr = CapCalReranker(client=sync, method="vanilla", **options)
    rr.capabilities()
    armed.append(True)
    with pytest.raises(ResponseError, match="malformed|carries no|asked for"):
        rr.rerank("q", ["a", "b", "c"])
