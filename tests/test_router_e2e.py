"""Through a real router: two llama.cpp servers behind vllm-router ``--policy consistent_hash``
(tests/_router.py starts them on loopback, and stops them).

With the routing key, every request of a list reaches one server (read from the servers' own logs for
the completion prompts, and from a counting proxy for the routes llama.cpp does not log), and the
ranking equals a direct run on that server. Without it, vllm-router hashes each request's body, so a
list's steps scatter. ``GET /v1/models`` is the one exception: vllm-router sends it to its first
worker whatever the key (a listing; nothing is cached by it).

The servers are keyed, as ``capcal serve`` always is, and vllm-router is given their key (``--api-key``, the
recipe in docs/scaling-out.md): every route the library uses, ``/tokenize`` and ``/apply-template`` included
(which vllm-router 0.1.17 forwards without the client's ``Authorization``), answers through the router.

Needs ``pip install vllm-router``; skipped without it unless ``CAPCAL_REQUIRE_ROUTER=1`` (CI).
"""

from __future__ import annotations

import os
import secrets
import sys
import time

import pytest

from capcal_integrations import CapCalReranker
from tests._compare import assert_same_order_up_to_ties
from tests._router import Rig, router_binary
from tests._samples import PASSAGES, QUERY

pytestmark = pytest.mark.e2e

LISTS = [
    (QUERY, PASSAGES[:4]),
    ("what do cats eat", ["Cats are obligate carnivores and eat meat.", "Paris is the capital of France.",
                          "Tuna and chicken are common in cat food.", "The violin has four strings."]),
    ("when was the eiffel tower built", ["Bananas grow in tropical climates.", "The tower opened in 1889.",
                                         "Gustave Eiffel's company built it for the World's Fair.", "Rain is water."]),
]
# one decoding step: the fewest requests that still use every route; no content check (the default rule
# decides once per reranker from the lists it ranked first, so two rerankers could differ by their history)
METHOD = dict(method="first-token-capcal", guard=None)


@pytest.fixture(scope="module")
def rig():
    if router_binary() is None:
        if os.environ.get("CAPCAL_REQUIRE_ROUTER"):
            pytest.fail("vllm-router is not installed (CAPCAL_REQUIRE_ROUTER is set)")
        pytest.skip("vllm-router is not installed (pip install vllm-router)")
    with Rig(api_key="-" + secrets.token_urlsafe(16)) as r:  # a key like a flag: token_urlsafe gives one in 64
        yield r


def _run(rig: Rig, rr: CapCalReranker, query: str, passages: list[str]):
    mark = rig.mark()
    ranking = rr.rerank(query, passages)
    time.sleep(0.5)  # the servers' log lines of the last prompts
    return ranking, [s for s in rig.since(mark) if (s.method, s.path) != ("GET", "/v1/models")], rig.tasks(mark)


def test_with_the_key_every_request_of_a_list_reaches_one_server_and_ranks_as_that_server_alone(rig):
    rr = CapCalReranker(base_url=rig.url, api_key=rig.api_key, routed=True, **METHOD)
    backends = set()
    for query, passages in LISTS:
        ranking, seen, tasks = _run(rig, rr, query, passages)
        assert {"/tokenize", "/v1/completions"} <= {s.path for s in seen}
        [backend] = {s.backend for s in seen}  # the proxy's record: every request of the list on one server
        # vllm-router forwards the header on the OpenAI routes only (it routes /tokenize by it, but drops it)
        [key] = {s.key for s in seen if s.path.startswith("/v1/")}
        assert key is not None and all(s.user in (None, key) for s in seen)
        assert [bool(t) for t in tasks] == [k == backend for k in range(2)]  # the servers' logs agree
        backends.add(backend)
        direct = CapCalReranker(base_url=rig.backends[backend], api_key=rig.api_key, **METHOD).rerank(query, passages)
        assert_same_order_up_to_ties(ranking, direct)  # first-token: the order is the first step's scores
    sys.stderr.write(f"lists on servers {sorted(backends)}\n")  # shown with -s


def test_without_the_key_a_list_scatters_over_both_servers(rig):
    rr = CapCalReranker(base_url=rig.url, api_key=rig.api_key, routed=True, routing_header=None, **METHOD)
    spread = []
    for query, passages in LISTS:
        _, seen, tasks = _run(rig, rr, query, passages)
        assert {s.key for s in seen} == {None} and not any(s.user for s in seen)
        spread.append((len({s.backend for s in seen}), sum(bool(t) for t in tasks)))
    sys.stderr.write(f"servers per list (requests, completion prompts): {spread}\n")  # shown with -s
    assert max(requests for requests, _ in spread) == 2  # vllm-router hashed each body: steps went both ways
