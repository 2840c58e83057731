"""Issue 23, items 2 and 3: a deadline is a wall-clock limit whatever the server's pacing, and what an
endpoint reports or returns is bounded (slots, context, top-k length, body size), each violation a
``ResponseError`` that names the bound and quotes an excerpt, never the whole body.

The servers here are real loopback HTTP servers (``http.server`` on 127.0.0.1), not mock transports: the
pacing of a socket is what is being tested.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import tracemalloc
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from capcal_integrations import CapCalReranker
from capcal_integrations.endpoints.calls import Call
from capcal_integrations.endpoints.probe import probe
from capcal_integrations.endpoints.slots import SlotPins
from capcal_integrations.errors import EndpointTimeout, EndpointUnreachable, ResponseError
from capcal_integrations.ranking.deadline import DeadlinePassed
from capcal_integrations.transport.drivers import run_async, run_sync
from capcal_integrations.transport.transfer import MAX_BODY

PASSAGES = [f"passage {i}" for i in range(6)]


class _Server:
    """A threaded loopback server; ``answer(method, path)`` gives (status, body bytes, seconds per byte)."""

    def __init__(self, answer: Callable[[str, str], tuple[int, bytes, float]]) -> None:
        stop = self.stop_event = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, body, pace = answer(self.command, self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if not pace:
                        self.wfile.write(body)
                        return
                    for k in range(len(body)):  # one byte at a time: each read gets something in time
                        if stop.is_set():
                            return
                        self.wfile.write(body[k:k + 1])
                        self.wfile.flush()
                        time.sleep(pace)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = _reply  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(answer):
        servers.append(_Server(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


_VALID = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "llamacpp"}]}).encode()


def _trickle(method: str, path: str) -> tuple[int, bytes, float]:
    return 200, _VALID + b" " * 200, 0.15  # a valid-looking answer, one byte every 0.15 s (about 40 s in all)


def _one_call():
    try:
        yield [Call("POST", "completions", {"prompt": "x"})]
    except DeadlinePassed:
        return "cut"
    return "answered"


# --------------------------------------------------------------------------- deadline: a wall-clock limit


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trickling_server_driver_returns_within_the_deadline(serve, mode):
    server = serve(_trickle)
    started = time.monotonic()
    if mode == "sync":
        result, usage = run_sync(_one_call(), openai.OpenAI(base_url=server.url, api_key="x"), None, 1.0)
    else:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x")
        result, usage = asyncio.run(run_async(_one_call(), client, asyncio.Semaphore(4), None, 1.0))
    elapsed = time.monotonic() - started
    assert result == "cut" and usage.requests == 1, (result, usage)
    assert elapsed < 1.0 + 0.5, elapsed


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trickling_server_ranking_is_the_first_stage_order_by_the_deadline(serve, mode):
    """The probe itself trickles: by the deadline rules (deadline.py) nothing is decided, so the ranking is the
    first-stage order, marked partial, with the deadline's note."""
    server = serve(_trickle)
    rr = CapCalReranker(base_url=server.url, api_key="x", method="vanilla", guard=None, deadline=1.0)
    started = time.monotonic()
    ranking = rr.rerank("q", PASSAGES) if mode == "sync" else asyncio.run(rr.arerank("q", PASSAGES))
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 0.5, elapsed
    assert list(ranking.order) == list(range(len(PASSAGES))) and ranking.partial and ranking.decoded == 0
    assert ranking.notes[-1] == "deadline 1 s passed before any place was decided: the list is in first-stage order"


# --------------------------------------------------------------------------- bounds on what is reported


def _props(total_slots: object = 10**12, n_ctx: object = 4096) -> Callable[[str, str], tuple[int, bytes, float]]:
    def answer(method: str, path: str) -> tuple[int, bytes, float]:
        if path == "/v1/models":
            return 200, _VALID, 0
        if path == "/props":
            return 200, json.dumps({"total_slots": total_slots,
                                    "default_generation_settings": {"n_ctx": n_ctx}}).encode(), 0
        return 404, b'{"error": "not here"}', 0
    return answer


@pytest.mark.parametrize("field, props", [("total_slots", _props(total_slots=10**12)),
                                          ("n_ctx", _props(n_ctx=10**15))])
def test_hostile_props_is_a_response_error_naming_the_bound(serve, field, props):
    server = serve(props)
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    started = time.monotonic()
    with pytest.raises(ResponseError, match=f"{field}.*bound") as err:
        run_sync(probe(), client)
    assert time.monotonic() - started < 1.0
    assert len(str(err.value)) < 600
    tracemalloc.start()  # the same again, its memory traced (tracing slows it down)
    try:
        with pytest.raises(ResponseError):
            run_sync(probe(), client)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, peak


def test_slot_pins_never_build_a_range_of_the_slots():
    pins = SlotPins()
    started = time.monotonic()
    slots = [pins.pin(k, 10**12) for k in range(3)]
    assert slots == [0, 1, 2] and time.monotonic() - started < 0.1
    pins.release(1)
    assert pins.pin("new", 10**12) == 3  # never used beats least recently used
    assert pins.pin(0, 10**12) == 4  # prompt 0's slot is in flight: a never used slot (4) before slot 1


# --------------------------------------------------------------------------- bounds on what is returned


def _huge_answer(entries: int) -> bytes:
    """A completions answer whose one position has ``entries`` alternatives (10**6: 59 MB)."""
    entry = b'{"id": 123456, "token": "token", "logprob": -1.2345678901234567, "bytes": [116, 111]}'
    tops = b", ".join([entry] * entries)
    return (b'{"choices": [{"index": 0, "text": "t", "logprobs": {"content": [{"id": 1, "token": "t", "logprob": -1.0, '
            b'"top_logprobs": [' + tops + b']}]}}]}')


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_million_entry_answer_is_a_response_error_within_a_second_and_100_mb(serve, mode):
    body = _huge_answer(10**6)
    assert len(body) > 50 * 2**20
    server = serve(lambda method, path: (200, body, 0))

    def once():
        yield [Call("POST", "completions", {"prompt": "x"})]

    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ResponseError, match="bound of") as err:
            if mode == "sync":
                run_sync(once(), openai.OpenAI(base_url=server.url, api_key="x", max_retries=0))
            else:
                asyncio.run(run_async(once(), openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0),
                                      asyncio.Semaphore(1)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 1.0
    assert peak < 100 * 2**20, peak
    assert str(MAX_BODY) in str(err.value) and len(str(err.value)) < 600


def test_top_logprobs_entries_per_position_are_bounded():
    from capcal_integrations.endpoints.answers import MAX_ALTERNATIVES, top_entries

    choice = json.loads(_huge_answer(MAX_ALTERNATIVES + 1))["choices"][0]
    with pytest.raises(ResponseError, match=f"bound of {MAX_ALTERNATIVES}") as err:
        top_entries(choice)
    assert len(str(err.value)) < 600
    assert len(top_entries(json.loads(_huge_answer(MAX_ALTERNATIVES))["choices"][0])) == MAX_ALTERNATIVES


def test_an_error_quotes_an_excerpt_never_the_whole_body():
    from capcal_integrations.endpoints.answers import excerpt, malformed

    body = {"choices": [{"x": "y" * 1000}] * 10**5}
    started = time.monotonic()
    text = str(malformed("'choices' is odd", body))
    assert len(text) < 600 and excerpt(body).endswith("…")
    assert time.monotonic() - started < 0.05  # the excerpt renders no more than it shows


def _kept(err: BaseException) -> int:
    """The bytes of text and data an error keeps: its message, attributes and the errors chained to it."""
    seen, total, todo = set(), 0, [err]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, (str, bytes, bytearray)):
            total += len(obj)
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple)):
            todo += list(obj)
        elif isinstance(obj, BaseException):
            todo += [obj.args, vars(obj), obj.__cause__, obj.__context__]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo.append(vars(obj))
    return total


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_40_mb_error_answer_makes_an_error_under_100_kb(serve, mode):
    """Issue 36: an HTTP 500 answer of 40 MB made a 40 MB EndpointError (its body kept whole, and openai's own
    error, holding it twice, chained to it)."""
    from capcal_integrations.errors import EndpointError

    body = json.dumps({"error": {"message": "x" * (40 * 2**20), "code": 500}}).encode()
    server = serve(lambda method, path: (500, body, 0))

    def once():
        yield [Call("POST", "completions", {"prompt": "x"})]

    with pytest.raises(EndpointError) as err:
        if mode == "sync":
            run_sync(once(), openai.OpenAI(base_url=server.url, api_key="x", max_retries=0))
        else:
            asyncio.run(run_async(once(), openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0),
                                  asyncio.Semaphore(1)))
    assert err.value.status == 500 and "HTTP 500" in str(err.value) and len(str(err.value)) < 600
    assert err.value.url.endswith("/v1/completions")  # the URL is kept without the openai error it came from
    assert _kept(err.value) < 100 * 2**10, _kept(err.value)


# --------------------------------------------------------------------------- an answer cut or stalled mid-body


def _raw_server(stall: float) -> tuple[str, Callable[[], None]]:
    """A loopback server that sends headers promising 1,000 bytes and 10 of them, then stalls for ``stall``
    seconds and closes the connection: the body is cut (stall 0) or stops coming (a read timeout first)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                             b'{"object":')
                stop.wait(stall)

    threading.Thread(target=run, daemon=True).start()

    def close() -> None:
        stop.set()
        listener.close()

    return f"http://127.0.0.1:{listener.getsockname()[1]}/v1", close


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("stall,error,said", [(0.0, EndpointUnreachable, "the connection broke while reading the answer"),
                                              (5.0, EndpointTimeout, "the answer stopped coming")])
def test_an_answer_cut_or_stalled_mid_body_is_a_typed_endpoint_error(mode, stall, error, said):
    url, close = _raw_server(stall)
    try:
        with pytest.raises(error, match=said):
            if mode == "sync":
                run_sync(_one_call(), openai.OpenAI(base_url=url, api_key="x", timeout=0.5, max_retries=0))
            else:
                client = openai.AsyncOpenAI(base_url=url, api_key="x", timeout=0.5, max_retries=0)
                asyncio.run(run_async(_one_call(), client, asyncio.Semaphore(1)))
    finally:
        close()
