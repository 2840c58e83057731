"""Issue 36: answers a hostile or broken server may send during the probe and the untrusted-text checks.
One bad answer must not change the route for the reranker's life (finding 3), and the work the library does
with what it reads is bounded by constants a server cannot raise (finding 4)."""

from __future__ import annotations

import pytest

from capcal_integrations import CapCalReranker, ResponseError
from tests.fake_endpoint import clients, httpx2, make_handler


def _cut_once(paths: set[str], times: int = 1):
    """A fault that answers the first ``times`` POSTs to any of ``paths`` with a 200 whose JSON is cut short."""
    left = {"n": times}

    def fault(request):
        if request.method == "POST" and request.url.path in paths and left["n"] > 0:
            left["n"] -= 1
            return httpx2.Response(200, content=b'{"choices": [{"index": 0, "text": "", "logpro',
                                   headers={"content-type": "application/json"})
        return None

    return fault


def _kind(**dialect) -> str:
    sync, async_ = clients(make_handler(**dialect))
    return CapCalReranker(client=sync, async_client=async_).capabilities().kind.name


@pytest.mark.parametrize("dialect", [{}, {"vllm": True}, {"sglang": True}], ids=["llama.cpp", "vllm", "sglang"])
def test_one_truncated_probe_answer_leaves_the_route_unchanged(dialect):
    clean = _kind(**dialect)
    sync, async_ = clients(make_handler(fault=_cut_once({"/v1/completions"}), **dialect))
    rr = CapCalReranker(client=sync, async_client=async_)
    assert rr.capabilities().kind.name == clean  # was: the chat route for good
    assert sorted(rr.rerank("q", ["a b", "c d", "e f"]).order) == [0, 1, 2]


def test_a_probe_that_keeps_getting_broken_answers_raises_and_caches_nothing():
    broken = {"on": True}
    cut = _cut_once({"/v1/completions"}, times=10**6)

    def fault(request):
        return cut(request) if broken["on"] else None

    sync, async_ = clients(make_handler(fault=fault))
    rr = CapCalReranker(client=sync, async_client=async_)
    with pytest.raises(ResponseError, match="not JSON") as err:
        rr.capabilities()
    assert err.value.unreadable
    broken["on"] = False  # the server recovers: the next call probes afresh and finds the real route
    assert rr.capabilities().kind.name == _kind()


def test_a_web_page_where_a_server_extra_would_be_means_no_such_extra():
    def fault(request):
        if request.url.path in ("/props", "/tokenize", "/apply-template"):
            return httpx2.Response(200, content=b"<html><body>welcome</body></html>",
                                   headers={"content-type": "text/html"})
        return None

    sync, async_ = clients(make_handler(fault=fault))
    caps = CapCalReranker(client=sync, async_client=async_).capabilities()
    assert caps.kind.name != _kind()  # probed to the end: a route without llama.cpp's extras


def test_the_double_refuses_a_vllm_shaped_tokenize_on_llamacpp_as_llamacpp_does():
    """The llama.cpp double raised KeyError (a 500 from the transport) for vLLM's /tokenize shape."""
    response = make_handler()(httpx2.Request("POST", "http://fake.test/tokenize", json={"model": "fake", "prompt": "x"}))
    assert response.status_code == 400 and "content" in response.json()["error"]["message"]
