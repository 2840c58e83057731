"""Bad input, bounded memory and nothing left running behind an error (issue 16, items 7, 8 and 10).

Against the fake endpoint (tests/fake_endpoint.py) and pure Python; the malformed-answer fuzz is
tests/test_fuzz.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import sys
import threading
import time
import types
from collections import Counter

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capcal_integrations import CapCalError, CapCalReranker, EndpointError, InputError, Ranking, choose_alpha
from capcal_integrations.endpoints.caches import TEMPLATE_CACHE_SIZE
from capcal_integrations.endpoints.slots import SlotPins
from capcal_integrations.options import OPTION_NAMES, Options
from capcal_integrations.transport.drivers import together
from tests.fake_endpoint import clients, make_handler


def reranker(handler=None, **options):
    sync, async_ = clients(handler or make_handler())
    return CapCalReranker(client=sync, async_client=async_, **{"guard": None, **options})  # not the content check's subject


# --------------------------------------------------------------------------- item 10: bad input


@pytest.mark.parametrize("passages", ["abcd", b"abcd", None, 42, {"a": "x", "b": "y"}, {"x", "y"}])
def test_passages_that_are_not_a_list_of_passages_are_an_input_error(passages):
    calls = []
    rr = reranker(make_handler(calls=calls))
    with pytest.raises(InputError, match="passages must be a list"):
        rr.rerank("q", passages)
    with pytest.raises(InputError, match="passages must be a list"):
        asyncio.run(rr.arerank("q", passages))
    assert calls == []  # nothing was sent


def test_a_string_says_it_would_be_ranked_letter_by_letter():
    with pytest.raises(InputError, match="letter by letter"):
        reranker().rerank("q", "abcd")


def test_a_bad_passage_is_named_by_its_index():
    with pytest.raises(InputError, match=r"passages\[1\]"):
        reranker().rerank("q", ["fine", 42, "fine"])
    with pytest.raises(InputError, match=r"passages\[0\].*title"):
        reranker().rerank("q", [{"text": "t", "title": 7}, "x"])


def test_any_ordered_iterable_of_passages_is_accepted():
    rr = reranker(method="vanilla")
    listed = rr.rerank("q", ["a", "b", "c"])
    assert rr.rerank("q", ("a", "b", "c")).order == listed.order
    assert rr.rerank("q", (p for p in ["a", "b", "c"])).order == listed.order


@pytest.mark.parametrize("option, value", [
    ("alpha", math.inf), ("alpha", math.nan), ("alpha", -1.0), ("alpha", True), ("alpha", "1"),
    ("guard", math.nan), ("guard", math.inf), ("guard", -math.inf), ("guard", True), ("guard", "2"),
    ("max_passage_words", 0), ("max_passage_words", -3), ("max_passage_words", 2.5), ("max_passage_words", True),
    ("max_context", 0), ("max_context", -1), ("max_context", 1e9),
    ("concurrency", 0), ("concurrency", -1), ("concurrency", True), ("concurrency", 2.0),
    ("window", True), ("window", 20.0), ("stride", 2.5), ("m", 0), ("m", 1.5), ("seed", 1.5), ("seed", None),
    ("top_logprobs", 0), ("top_logprobs", True), ("normalise", "false"), ("normalise", 0),
    ("placeholder", None), ("template", ["rank_gpt"]), ("prompt", 5), ("method", None), ("labels", ["numeric"]),
])
def test_each_bad_option_is_an_input_error_naming_it(option, value):
    with pytest.raises(InputError, match=option):
        Options(**{option: value})
    with pytest.raises(InputError, match=option):
        reranker(**{option: value})


def test_good_numbers_still_pass():
    o = Options(alpha=1, max_passage_words=1, max_context=512, concurrency=1, seed=-7)
    assert (o.alpha, o.max_passage_words) == (1, 1)
    assert Options(guard=None, max_passage_words=None).guard is None
    with pytest.warns(FutureWarning, match="per-list guard was retired"):  # the old z-score: read as the check
        assert Options(guard=-1.5).guard == "query"  # the default rule


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=5),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@pytest.mark.filterwarnings("ignore:guard=.*per-list guard was retired:FutureWarning")  # numbers: read as 'content'
@settings(max_examples=300, deadline=None, derandomize=True)
@given(name=st.sampled_from([n for n in OPTION_NAMES if n != "preset"]), value=_ANY)
def test_any_value_of_any_option_is_accepted_or_an_input_error(name, value):
    try:
        o = Options(**{name: value})
    except InputError:
        return
    for field in ("alpha", "guard", "window", "stride", "m", "top_logprobs", "concurrency", "max_passage_words"):
        v = getattr(o, field)
        assert v is None or isinstance(v, str) or (not isinstance(v, bool) and math.isfinite(v)), (field, v)


@pytest.mark.parametrize("concurrency", [0, -1, True, 1.5])
def test_many_with_a_bad_concurrency_is_an_input_error_not_a_hang(concurrency):
    rr = reranker()
    items = [("q", ["a", "b"])]
    with pytest.raises(InputError, match="concurrency"):
        rr.rerank_many(items, concurrency=concurrency)
    with pytest.raises(InputError, match="concurrency"):
        asyncio.run(asyncio.wait_for(rr.arerank_many(items, concurrency=concurrency), 10))


@pytest.mark.parametrize("items", [None, "q", [("q",)], [("q", ["a"], "extra")], ["q"]])
def test_many_with_items_that_are_not_pairs_is_an_input_error(items):
    with pytest.raises(InputError, match="items"):
        reranker().rerank_many(items)
    with pytest.raises(InputError, match="items"):
        asyncio.run(reranker().arerank_many(items))


def test_ranking_top_refuses_a_negative_k():
    ranking = Ranking((2, 0, 1), (0.3, 0.1, 0.9))
    assert ranking.top(0) == () and ranking.top(5) == (2, 0, 1) and ranking.top() == (2, 0, 1)
    for k in (-3, 1.5, True):
        with pytest.raises(InputError, match="k must be"):
            ranking.top(k)


@pytest.mark.parametrize("kwargs, name", [
    ({"alphas": [0.0, math.nan]}, "alphas"), ({"alphas": [math.inf]}, "alphas"), ({"alphas": "12"}, "alphas"),
    ({"alphas": [True]}, "alphas"), ({"shuffles": 2.5}, "shuffles"), ({"shuffles": 1}, "shuffles"),
])
def test_choose_alpha_refuses_bad_arguments_before_any_request(kwargs, name):
    calls = []
    with pytest.raises(InputError, match=name):
        choose_alpha(reranker(make_handler(calls=calls)), [("q", ["a", "b"])], **kwargs)
    assert calls == []


@pytest.mark.parametrize("kwargs", [{"timeout": math.nan}, {"timeout": -1}, {"timeout": 0}, {"timeout": True},
                                    {"max_retries": -1}, {"max_retries": 1.5}, {"model": ""}, {"model": 5}])
def test_bad_connection_settings_are_input_errors(kwargs):
    with pytest.raises(InputError, match=next(iter(kwargs))):
        CapCalReranker(base_url="http://127.0.0.1:9/v1", **kwargs)


# --------------------------------------------------------------------------- item 7: the template cache is bounded


def _passages(k: int, n: int = 4) -> list[str]:
    return [f"query {k} passage {i}: " + " ".join(f"w{k}x{i}x{j}" for j in range(60)) for i in range(n)]


def _deep_size(root) -> int:
    """Bytes of everything ``root`` holds (the endpoint state: its caches, pins, tokens)."""
    seen, stack, total = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def test_rendered_prompts_do_not_accumulate_across_rankings():
    rr = reranker(method="first-token-capcal")  # real, empty and the guard's rotated prompt per list
    for k in range(TEMPLATE_CACHE_SIZE):  # past the shared cache's capacity
        rr.rerank(f"query {k}", _passages(k))
    full = _deep_size(rr._state)
    for k in range(TEMPLATE_CACHE_SIZE, 3 * TEMPLATE_CACHE_SIZE):
        rr.rerank(f"query {k}", _passages(k))
    assert len(rr._state.templates) <= TEMPLATE_CACHE_SIZE
    # unbounded, the state held every ranking's three prompts: three times as much here
    assert _deep_size(rr._state) < full * 1.1, (full, _deep_size(rr._state))


def _renders(calls) -> int:
    return sum(c.url.path in ("/apply-template",) for c in calls)


def test_a_ranking_renders_each_prompt_once_even_when_the_shared_cache_is_full():
    calls = []
    rr = reranker(make_handler(calls=calls), method="capcal")
    rr.rerank("warm up", _passages(0, 6))
    calls.clear()
    rr.rerank("query", _passages(1, 6))  # 5 decoding steps of 3 prompts
    once = _renders(calls)
    rr._state.templates.capacity = 1  # as if many other rankings filled it between our steps
    calls.clear()
    ranking = rr.rerank("another query", _passages(2, 6))
    assert sorted(ranking.order) == list(range(6))
    assert _renders(calls) <= max(once, 3)  # rendered once per prompt, not once per step


def test_threads_share_the_template_cache_safely():
    rr = reranker(method="capcal")
    rr._state.templates.capacity = 2  # constant eviction while 6 threads rank
    items = [(f"query {k}", _passages(k, 5)) for k in range(12)]
    rankings = rr.rerank_many(items, concurrency=6)
    assert [sorted(r.order) for r in rankings] == [list(range(5))] * 12
    assert len(rr._state.templates) <= 2


# --------------------------------------------------------------------------- item 8: slot pins, cancelled siblings


def test_slot_pins_never_give_one_slot_to_two_holders_across_threads():
    pins, holders, check = SlotPins(), Counter(), threading.Lock()
    doubles, failures = [], []
    stop = time.monotonic() + 1.0

    def worker(w: int) -> None:
        k = 0
        try:
            while time.monotonic() < stop:
                k += 1
                slot = pins.pin((w, k % 3), 4)
                if slot is None:
                    continue
                with check:
                    holders[slot] += 1
                    if holders[slot] > 1:
                        doubles.append(slot)
                with check:
                    holders[slot] -= 1
                pins.release(slot)
        except Exception as err:  # e.g. "dictionary changed size during iteration"
            failures.append(err)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures and not doubles, (len(doubles), failures[:1])


def _slow_transport(handler, fail):
    """An async transport: pinned completions sleep 0.3 s; ``fail(request, body)`` answers a 500 at once."""
    in_flight: set[int] = set()
    ended_unpinned: list[int] = []

    async def transport(request):
        await request.aread()
        body = json.loads(request.content or b"{}")
        if request.url.path == "/v1/completions" and fail(request, body):
            return httpx2.Response(500, json={"error": "boom"})
        if request.url.path == "/v1/completions" and transport.armed:
            in_flight.add(id(request))
            try:
                await asyncio.sleep(0.3)
            finally:
                in_flight.discard(id(request))
                if "id_slot" in body and body["id_slot"] not in transport.rr._state.slots.busy:
                    ended_unpinned.append(body["id_slot"])  # its slot was handed back while it ran
        return handler(request)

    transport.armed, transport.in_flight, transport.ended_unpinned = False, in_flight, ended_unpinned
    return transport


def _with_transport(transport, handler, **options):
    sync, _ = clients(handler)
    async_ = openai.AsyncOpenAI(base_url="http://fake.test/v1", api_key="x", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(transport)))
    rr = CapCalReranker(client=sync, async_client=async_, **{"guard": None, **options})
    transport.rr = rr
    rr.capabilities()
    transport.armed = True
    return rr


def test_an_async_batch_error_reaches_the_caller_only_after_its_siblings_stopped():
    handler = make_handler(slots=4)
    transport = _slow_transport(handler, lambda request, body: transport.armed and transport.in_flight)
    rr = _with_transport(transport, handler, method="capcal")  # each step: real, empty, rotated, concurrently

    async def main():
        with pytest.raises(EndpointError) as info:
            await rr.arerank("q", [f"p{i}" for i in range(6)])
        return set(transport.in_flight), info.value.status

    still_running, status = asyncio.run(main())
    assert status == 500
    assert still_running == set()  # the sibling requests were cancelled and awaited first
    assert transport.ended_unpinned == []  # and their slots stayed pinned until they had stopped
    assert rr._state.slots.busy == set()  # then released


def test_arerank_many_stops_the_other_lists_before_raising():
    handler = make_handler()
    failed = []

    def fail(request, body):
        if transport.armed and not failed:
            failed.append(1)
            return True
        return False

    transport = _slow_transport(handler, fail)
    rr = _with_transport(transport, handler, method="vanilla")

    async def main():
        with pytest.raises(EndpointError):
            await rr.arerank_many([(f"q{k}", [f"p{k}{i}" for i in range(4)]) for k in range(4)])
        return set(transport.in_flight), [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    still_running, tasks = asyncio.run(main())
    assert still_running == set() and tasks == []


def test_a_cancelled_arerank_releases_its_pins_once_nothing_is_in_flight():
    handler = make_handler(slots=4)
    transport = _slow_transport(handler, lambda request, body: False)
    rr = _with_transport(transport, handler, method="capcal")

    async def main():
        task = asyncio.ensure_future(rr.arerank("q", [f"p{i}" for i in range(6)]))
        while not transport.in_flight:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return set(transport.in_flight), set(rr._state.slots.busy)

    assert asyncio.run(main()) == (set(), set())
    assert transport.ended_unpinned == []


def test_together_returns_in_order_and_cancels_the_rest_on_the_first_failure():
    finished, cancelled = [], []

    async def slow(name, delay):
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise
        finished.append(name)
        return name

    async def boom(delay):
        await asyncio.sleep(delay)
        raise EndpointError("boom")

    async def main():
        assert await together([slow("a", 0.02), slow("b", 0.01)]) == ["a", "b"]
        assert await together([]) == []
        with pytest.raises(EndpointError, match="boom"):
            await together([slow("c", 5), boom(0.01), slow("d", 5)])
        assert sorted(cancelled) == ["c", "d"]  # awaited: their cancellation ran before the error came out

    asyncio.run(main())
    assert finished == ["b", "a"]


def test_the_first_error_of_rerank_many_is_raised_and_nothing_else_runs_after():
    calls, armed = [], []

    def fault(request):
        return httpx2.Response(503, json={"error": "down"}) if armed and request.url.path == "/v1/completions" else None

    rr = reranker(make_handler(calls=calls, fault=fault))
    rr.capabilities()
    armed.append(True)
    calls.clear()
    with pytest.raises(CapCalError):
        rr.rerank_many([(f"q{k}", ["a", "b", "c"]) for k in range(50)], concurrency=2)
    sent = len(calls)
    time.sleep(0.1)
    assert len(calls) == sent  # no thread is still sending
    lists_started = sum(c.url.path == "/v1/completions" for c in calls)
    assert lists_started <= 10  # the lists not started when the error came were not started (of 50)
