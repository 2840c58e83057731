"""The sync driver's rounds (``transport.drivers._round_sync``): calls pinned to different llama.cpp slots go
together, so that the server computes a calibrated step's real and empty streams in the same batches; the rest
one after another. In memory (``MockTransport``): what is checked is the driver's concurrency and what reaches
the flow, not a server."""

from __future__ import annotations

import json
import threading
import time

from capcal_integrations.endpoints.calls import Call
from capcal_integrations.errors import EndpointError
from capcal_integrations.ranking.deadline import Deadline, DeadlinePassed
from capcal_integrations.testing.endpoint import clients, httpx2
from capcal_integrations.transport.drivers import _round_sync


def _call(slot: int | None, k: int = 0) -> Call:
    body = {"model": "m", "prompt": [[1, 2, 3, k]], "max_tokens": 1}
    return Call("POST", "v1/completions", body if slot is None else {**body, "id_slot": slot})


def _answer(request) -> dict:
    body = json.loads(request.content)
    return {"choices": [{"index": 0, "text": str(body.get("id_slot")), "logprobs": None}]}


def test_calls_pinned_to_different_slots_are_in_flight_together_and_answer_in_order():
    both = threading.Barrier(2, timeout=10)  # passes only when both calls are in flight at once

    def handler(request):
        both.wait()
        if json.loads(request.content)["id_slot"] == 0:
            time.sleep(0.2)  # the first call answers last: the answers still come back in the calls' order
        return httpx2.Response(200, json=_answer(request))

    sync, _ = clients(handler)
    answers = _round_sync(sync, [_call(0), _call(1)], None, None)
    assert [a["choices"][0]["text"] for a in answers] == ["0", "1"]


def test_calls_without_a_pin_or_on_one_slot_go_one_after_another():
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def handler(request):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        return httpx2.Response(200, json=_answer(request))

    sync, _ = clients(handler)
    for calls in ([_call(None), _call(None, 1)], [_call(0), _call(0, 1)], [_call(0), _call(None)]):
        assert len(_round_sync(sync, calls, None, None)) == 2
    assert most[0] == 1


def test_a_failure_in_a_round_is_the_first_in_the_calls_order_once_every_call_has_come_back():
    done = []

    def handler(request):
        slot = json.loads(request.content)["id_slot"]
        if slot == 0:
            time.sleep(0.3)  # the last to finish, and the failure the flow gets is still the first call's
            done.append(slot)
            return httpx2.Response(503, json={"error": {"message": "busy"}})
        done.append(slot)
        return httpx2.Response(500, json={"error": {"message": "broken"}}) if slot == 1 else httpx2.Response(
            200, json=_answer(request))

    sync, _ = clients(handler)
    got = _round_sync(sync, [_call(0), _call(1), _call(2)], None, None)
    assert isinstance(got, EndpointError) and got.status == 503
    assert sorted(done) == [0, 1, 2]  # nothing is still running when the flow gets the error


def test_a_deadline_in_a_round_keeps_the_answers_that_came_back_and_counts_the_abandoned():
    release = threading.Event()

    def handler(request):
        if json.loads(request.content)["id_slot"] == 1:
            release.wait(5)  # stalls past the deadline
        return httpx2.Response(200, json=_answer(request))

    sync, _ = clients(handler)
    try:
        got = _round_sync(sync, [_call(0), _call(1)], None, Deadline(0.5))
    finally:
        release.set()
    assert isinstance(got, DeadlinePassed)
    assert [a["choices"][0]["text"] for a in got.answered] == ["0"] and got.abandoned == 1
