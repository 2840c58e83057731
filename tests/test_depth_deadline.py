"""Issue 18: decode only as deep as needed (``depth``) and answer by a ``deadline``.

Pure rules with hand-worked numbers (capcal_integrations/ranking/depth.py, deadline.py), the flow against the
fake endpoint (tests/fake_endpoint.py), the drivers against a real socket that records when the client
hangs up, and the real llama.cpp server (e2e: top 5 at depth 5 = full depth's top 5; a deadline shorter
than a full ranking returns in time, partial, and leaves the server idle).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import pathlib
import socket
import sys
import threading
import time
import urllib.request

import httpx2
import openai
import pytest

from capcal_integrations import CapCalReranker, EndpointTimeout, InputError
from capcal_integrations.endpoints.calls import Call, EndpointState
from capcal_integrations.options import Options
from capcal_integrations.ranking.deadline import Deadline, DeadlinePassed, partial_order
from capcal_integrations.ranking.depth import borda_decoded, window_depths
from capcal_integrations.ranking.orders import borda
from capcal_integrations.ranking.strategies import rerank_flow
from capcal_integrations.transport.drivers import run_async, run_sync
from tests._compare import every_node
from tests.fake_endpoint import make_handler

PASSAGES = [f"passage number {i} about topic {i % 3}" for i in range(8)]


def _reranker(handler=None, delay: float = 0.0, after: int = 0, per_prompt: bool = False, **options) -> CapCalReranker:
    """A reranker on the fake endpoint; each ``/v1/completions`` answer after the first ``after`` takes ``delay``
    seconds (sync and async), or ``delay`` per prompt of its prompt list (``per_prompt``: as llama.cpp computes a
    list's prompts one after another)."""
    handler = handler or make_handler()
    answered = itertools.count()

    def seconds(request) -> float:
        if request.url.path != "/v1/completions" or next(answered) < after:
            return 0.0
        prompt = json.loads(request.content).get("prompt") if per_prompt else None
        return delay * (len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else 1)

    def slow(request):
        time.sleep(seconds(request))
        return handler(request)

    async def aslow(request):
        await request.aread()
        await asyncio.sleep(seconds(request))
        return handler(request)

    kw = dict(base_url="http://fake.test/v1", api_key="x", max_retries=0)
    sync = openai.OpenAI(http_client=httpx2.Client(transport=httpx2.MockTransport(slow)), **kw)
    async_ = openai.AsyncOpenAI(http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(aslow)), **kw)
    return CapCalReranker(client=sync, async_client=async_, guard=None, **options)


# --------------------------------------------------------------------------- the rules, by hand


def test_window_depths_by_hand():
    # 45 passages, window 20, stride 10: windows (25,45) (15,35) (5,25) (0,20); each passes up what
    # overlaps the next: 35-25 = 10, 25-15 = 10, 20-5 = 15; the top decodes to the depth
    assert window_depths(45, 20, 10, 3) == [10, 10, 15, 3]
    assert window_depths(45, 20, 10, 28) == [10, 13, None, None]  # (15,35): places 25..27 are within the depth
    assert window_depths(45, 20, 10, None) == [None] * 4


def test_borda_decoded_is_borda_at_full_depth():
    rankings = [[3, 0, 2, 1, 4], [0, 3, 1, 4, 2], [4, 3, 0, 2, 1]]
    assert borda_decoded(rankings, [None, None, None], 5) == borda(rankings, 5)
    assert borda_decoded(rankings, [5, 5, 5], 5) == borda(rankings, 5)
    # depth 1: 3 gets 4 (first once) + 1.5 + 1.5, 0 gets 1.5 + 4 + 1.5, 4 gets 1.5 + 1.5 + 4; 1, 2 get 4.5
    assert borda_decoded(rankings, [1, 1, 1], 5) == [0, 3, 4, 1, 2]


def test_partial_order_and_deadline_clock():
    assert partial_order(5, []) == [0, 1, 2, 3, 4]
    assert partial_order(5, [3]) == [3, 0, 1, 2, 4]
    ticks = iter([0.0, 0.25, 2.0])
    deadline = Deadline(1.0, clock=lambda: next(ticks))
    assert deadline.request_options() == {"timeout": 0.75, "max_retries": 0}
    with pytest.raises(DeadlinePassed):
        deadline.request_options()


def test_depth_and_deadline_options():
    assert Options.parse("depth", "5") == 5 and Options.parse("deadline", "1.5") == 1.5
    assert Options.parse("depth", "none") is None and Options.parse("deadline", "off") is None
    for bad in ({"depth": 0}, {"depth": 2.5}, {"depth": True}, {"deadline": 0}, {"deadline": -1},
                {"deadline": float("inf")}, {"deadline": "soon"}):
        with pytest.raises(InputError):
            Options(**bad)


def test_a_deadline_passed_while_probing_returns_the_first_stage_order():
    flow = rerank_flow(EndpointState(model="m"), Options(method="capcal", deadline=0.5), "a query", PASSAGES[:4])
    assert next(flow) == [Call("GET", "models")]
    with pytest.raises(StopIteration) as stop:
        flow.throw(DeadlinePassed())
    ranking = stop.value.value
    assert ranking.order == (0, 1, 2, 3) and ranking.partial and ranking.decoded == 0
    assert ranking.notes == ("deadline 0.5 s passed before any place was decided: the list is in first-stage order",)
    assert [d["decoded"] for d in ranking.details()] == [False] * 4


# --------------------------------------------------------------------------- depth on the fake endpoint


@pytest.mark.parametrize("method", ["capcal", "vanilla"])
def test_depth_keeps_the_full_decodings_top_and_marks_the_rest(method):
    rr = _reranker(method=method)
    full, cut = rr.rerank("a query", PASSAGES), rr.with_options(depth=3).rerank("a query", PASSAGES)
    assert full.decoded is None and full.order[:3] == cut.order[:3]
    assert sorted(cut.order) == list(range(8)) and cut.decoded == 3 and not cut.partial
    assert len(full.steps) == 7 and len(cut.steps) == 3
    assert cut.usage.requests < full.usage.requests
    # below the depth: the last decoded step's scores, highest first
    last = cut.steps[-1]
    rest = sorted((i for i in last.candidates if i != last.chosen),
                  key=lambda i: (-last.scores[last.candidates.index(i)], last.candidates.index(i)))
    assert list(cut.order[3:]) == rest
    assert [d["decoded"] for d in sorted(cut.details(), key=lambda d: d["rank"])] == [True] * 3 + [False] * 5
    assert cut.notes[-1] == "depth=3: places 4-8 were not decoded; they follow the last decoded step's scores"
    assert sorted(range(8), key=lambda i: -cut.scores[i]) == list(cut.order)


def test_a_window_kept_in_its_given_order_is_not_called_cut():
    rr = _reranker(method="capcal").with_options(guard="content", depth=3)  # the check keeps the list while it decides
    ranking = rr.rerank("a query", PASSAGES)
    assert ranking.order == tuple(range(8)) and ranking.kept_given_order
    assert ranking.decoded == 0 and not any(n.startswith("depth=") for n in ranking.notes)
    assert all(d["kept_given_order"] and not d["decoded"] for d in ranking.details())


def test_depth_with_a_sliding_window():
    passages = [f"p{i} " + "word " * (i % 4) for i in range(30)]
    rr = _reranker(method="vanilla", window=20, stride=10)
    full, cut = rr.rerank("q", passages), rr.with_options(depth=4).rerank("q", passages)
    assert cut.order[:4] == full.order[:4] and cut.decoded == 4 and sorted(cut.order) == list(range(30))
    # the lower window (10, 30) decodes the 10 places it passes up, the top window (0, 20) 4
    assert [sum(s.window == w for s in cut.steps) for w in (0, 1)] == [10, 4]
    assert [sum(s.window == w for s in full.steps) for w in (0, 1)] == [19, 19]
    # the lower window's first 10 steps are the full decoding's: the top window sees the same list
    assert [s.chosen for s in cut.steps if s.window == 0] == [s.chosen for s in full.steps if s.window == 0][:10]


def test_depth_with_psc_and_first_token():
    rr = _reranker(method="psc", m=3)
    full, cut = rr.rerank("q", PASSAGES), rr.with_options(depth=2).rerank("q", PASSAGES)
    assert full.decoded is None and cut.decoded == 2 and sorted(cut.order) == list(range(8))
    assert cut.usage.requests < full.usage.requests
    first = _reranker(method="first-token-capcal", depth=2).rerank("q", PASSAGES)
    assert first.decoded is None and len(first.steps) == 1  # one step ranks everything, whatever the depth


# --------------------------------------------------------------------------- deadline on the fake endpoint


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_returns_decided_places_and_the_rest_in_first_stage_order(mode):
    # The fake endpoint answers the probe's and the first two steps' requests at once (counted on a ranking decoded
    # to depth 2: the endpoint is deterministic), then takes 2 s per answer: the deadline passes during the third
    # step, however loaded the machine (it once passed before the first step with a fixed 0.15 s per answer).
    # Every node asked (capcal's middle steps would ask theirs in rounds, the second step's as well)
    counted: list = []
    _reranker(make_handler(calls=counted), method="capcal", depth=2).rerank("q", PASSAGES)
    first_two = sum(c.url.path == "/v1/completions" for c in counted)
    rr = _reranker(method="capcal", delay=2.0, after=first_two, deadline=1.0)
    started = time.monotonic()
    with every_node(rr):
        ranking = rr.rerank("q", PASSAGES) if mode == "sync" else asyncio.run(rr.arerank("q", PASSAGES))
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 0.3, elapsed  # each request is bounded by the time left
    assert ranking.partial and ranking.decoded == 2, ranking
    decided = [s.chosen for s in ranking.steps][:ranking.decoded]
    assert list(ranking.order) == partial_order(8, decided)
    assert ranking.notes[-1].startswith("deadline 1 s passed after") and "first-stage order" in ranking.notes[-1]
    assert [d["partial"] for d in ranking.details()] == [True] * 8
    assert sorted(range(8), key=lambda i: -ranking.scores[i]) == list(ranking.order)
    assert ranking.usage.requests >= 2 * ranking.decoded


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_long_list_under_a_deadline_keeps_time_for_its_top_window(mode):
    """Issue 34: a 200-passage list with deadline=60 spent 51 requests on its lower windows (ranked bottom first)
    and returned the first-stage order. Now the lower windows stop once the time left is less than twice the
    slowest one, and the top window is ranked in the time kept for it."""
    passages = [f"passage {i} about topic {i % 7}" for i in range(200)]
    # 5 ms a prompt: about 0.1 s a step read whole (20 nodes); vanilla's middle steps ask fewer in up to three requests
    rr = _reranker(method="vanilla", window=20, stride=10, depth=2, delay=0.005, per_prompt=True, deadline=4.0)
    started = time.monotonic()
    ranking = rr.rerank("q", passages) if mode == "sync" else asyncio.run(rr.arerank("q", passages))
    assert time.monotonic() - started < 4.0 + 0.3
    ranked = sorted({s.window for s in ranking.steps})
    assert 18 in ranked and len(ranked) <= 4, ranked  # the top window (the 19th, run last) and a few lower ones
    assert ranking.decoded == 2 and not ranking.partial, ranking.notes
    assert any("lower window(s) not ranked, to leave the top window" in note for note in ranking.notes)
    assert sorted(ranking.order) == list(range(200))
    assert list(ranking.order[:2]) == [s.chosen for s in ranking.steps if s.window == 18][:2]


def test_deadline_before_the_first_answer_is_the_first_stage_order():
    ranking = _reranker(delay=0.5, deadline=0.2).rerank("q", PASSAGES)
    assert ranking.order == tuple(range(8)) and ranking.partial and ranking.decoded == 0


def test_deadline_in_psc_aggregates_the_decided_places():
    ranking = _reranker(method="psc", m=2, delay=0.1, deadline=1.0).rerank("q", PASSAGES)
    assert ranking.partial and sorted(ranking.order) == list(range(8))
    k = ranking.decoded
    assert list(ranking.order[k:]) == sorted(ranking.order[k:])  # the rest in first-stage order


def test_without_a_deadline_nothing_is_partial():
    ranking = _reranker(delay=0.01).rerank("q", PASSAGES)
    assert not ranking.partial and ranking.decoded is None


# --------------------------------------------------------------------------- the drivers hang up


class _SilentServer:
    """A socket that reads a request and never answers; records how long the client stayed connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.hung_up = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(30)
        with conn:
            conn.recv(65536)
            while conn.recv(65536):  # until the client closes its end
                pass
            self.hung_up.set()


def _one_call():
    try:
        yield [Call("POST", "completions", {"prompt": "x"})]
    except DeadlinePassed:
        return "cut"
    return "answered"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_driver_abandons_the_request_at_the_deadline(mode):
    server = _SilentServer()
    started = time.monotonic()
    if mode == "sync":
        result, usage = run_sync(_one_call(), openai.OpenAI(base_url=server.url, api_key="x", max_retries=3), None, 0.5)
    else:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=3)
        result, usage = asyncio.run(run_async(_one_call(), client, asyncio.Semaphore(4), None, 0.5))
    assert result == "cut" and usage.requests == 1  # sent, then abandoned: no retry
    assert time.monotonic() - started < 0.5 + 0.5
    assert server.hung_up.wait(5), "the connection was left open"


def test_a_shorter_client_timeout_still_applies_under_a_deadline():
    server = _SilentServer()
    started = time.monotonic()
    with pytest.raises(EndpointTimeout):  # the client's own timeout, an error as without a deadline
        run_sync(_one_call(), openai.OpenAI(base_url=server.url, api_key="x", timeout=0.3, max_retries=0), None, 5.0)
    assert time.monotonic() - started < 2.0


# --------------------------------------------------------------------------- the real server


def _busy_slots(server_url: str) -> list[int]:
    root = server_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(root + "/slots", timeout=10) as answer:
        return [s["id"] for s in json.load(answer) if s.get("is_processing")]


def _dl19(k: int) -> tuple[str, list[str]]:
    from capcal_integrations.evaluation.data import load_dataset

    path = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "trec-dl19-passage"
    if not path.is_dir():
        pytest.skip(f"shared data {path} not present")
    topic = load_dataset(path).topics[0]
    return topic.query, [c.text for c in topic.candidates[:k]]


def test_depth_top_matches_full_depth_on_the_real_server(server_url, test_model):
    """Same prompts, same greedy steps: depth 5 leaves the top 5 of the full decoding unchanged."""
    query, passages = _dl19(8)
    rr = CapCalReranker(base_url=server_url, model=test_model, method="capcal", guard=None, max_passage_words=40)
    full = rr.rerank(query, passages)
    cut = rr.with_options(depth=5).rerank(query, passages)
    assert cut.order[:5] == full.order[:5] and cut.decoded == 5 and len(cut.steps) == 5 and len(full.steps) == 7
    assert [s.chosen for s in cut.steps] == [s.chosen for s in full.steps[:5]]
    assert cut.usage.requests < full.usage.requests


@pytest.fixture(scope="module")
def full_ranking_seconds(server_url, test_model) -> float:
    """How long a whole capcal ranking of the test list takes here, cold (new passages)."""
    query, passages = _dl19(10)
    rr = CapCalReranker(base_url=server_url, model=test_model, method="capcal", guard=None, max_passage_words=60)
    rr.capabilities()
    started = time.monotonic()
    assert not rr.rerank(query, passages).partial
    return time.monotonic() - started


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_deadline_on_the_real_server(server_url, test_model, mode, full_ranking_seconds):
    """A deadline a third of a full ranking: back within 1 s of it, a permutation, partial, and no slot of the
    server still processing soon after (the abandoned request was cancelled, not left running).

    llama.cpp cancels a request whose client has gone between two batches of its work (the embedded server's
    batch is one 512-token ubatch), once its HTTP handler's 1 s wait for a result times out. Any other
    request's result restarts that wait, /slots included: so the server is polled every 2 s, not faster."""
    query, passages = _dl19(10)
    deadline = round(max(0.3, full_ranking_seconds / 3), 2)
    rr = CapCalReranker(base_url=server_url, model=test_model, method="capcal", guard=None, max_passage_words=60,
                        deadline=deadline)
    other = [f"{p} (asked again {mode})" for p in passages]  # new text: cold prompts, cut mid-request
    started = time.monotonic()
    ranking = rr.rerank(query, other) if mode == "sync" else asyncio.run(rr.arerank(query, other))
    elapsed = time.monotonic() - started
    assert elapsed < deadline + 1.0, (elapsed, deadline)
    assert sorted(ranking.order) == list(range(10)) and ranking.partial and ranking.decoded < 9, ranking.notes
    assert any(n.startswith(f"deadline {deadline:g} s passed") for n in ranking.notes)
    returned = time.monotonic()
    while time.monotonic() - returned < 60:
        time.sleep(2)
        if not _busy_slots(server_url):
            break
    sys.stderr.write(f"deadline {deadline:.2f} s ({mode}): returned after {elapsed:.2f} s with {ranking.decoded} places "
                     f"decided; server idle {time.monotonic() - returned:.1f} s later\n")  # shown with -s
    assert not _busy_slots(server_url), "a request was left running on the server"
