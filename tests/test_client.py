"""One client configuration: settings survive from a ready client to the one built beside it."""

import asyncio
import logging

import openai
import pytest

from capcal_integrations import CapCalReranker, InputError


def test_async_client_is_built_from_a_ready_sync_clients_settings():
    sync = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", organization="org", project="proj",
                         default_headers={"X-Team": "search"}, default_query={"tier": "gold"}, timeout=7.0, max_retries=4)
    rr = CapCalReranker(client=sync)

    async def built():
        return rr.async_client

    a = asyncio.run(built())
    assert (str(a.base_url), a.api_key, a.organization, a.project) == ("http://127.0.0.1:9/v1/", "k", "org", "proj")
    assert a.default_headers["X-Team"] == "search" and a._custom_query == {"tier": "gold"}
    assert (a.timeout, a.max_retries) == (7.0, 4)
    assert rr.client is sync


def test_explicit_timeout_and_retries_apply_to_ready_clients():
    sync = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", timeout=7.0, max_retries=4)
    rr = CapCalReranker(client=sync, timeout=3.0, max_retries=0)
    assert (rr.client.timeout, rr.client.max_retries) == (3.0, 0)


def test_headers_and_query_reach_both_clients_built_from_settings():
    rr = CapCalReranker(base_url="http://127.0.0.1:9/v1", default_headers={"X-Team": "search"},
                        default_query={"tier": "gold"})

    async def built():
        return rr.async_client

    for client in (rr.client, asyncio.run(built())):
        assert client.default_headers["X-Team"] == "search" and client._custom_query == {"tier": "gold"}


def test_a_ready_client_and_connection_settings_together_are_an_error():
    with pytest.raises(InputError, match="not both"):
        CapCalReranker(client=openai.OpenAI(base_url="http://x/v1", api_key="k"), base_url="http://y/v1")


def test_http_clients_of_the_installed_openai_major_are_accepted():
    """Issue 24: openai 2.x is built on httpx, 3.x on httpx2; the fake endpoint's transport and the testbed's
    clients come from :func:`http_library`, so the same tests run under both majors."""
    from capcal_integrations.transport.client import http_library
    from tests.fake_endpoint import httpx2 as fake_http
    from tests.fake_endpoint import make_handler

    http = http_library()
    assert http.__name__ == ("httpx2" if openai.__version__.startswith("3.") else "httpx") and fake_http is http
    rr = CapCalReranker(base_url="http://fake.test/v1", http_client=http.Client(transport=http.MockTransport(make_handler())))
    assert sorted(rr.rerank("q", ["a", "b", "c"]).order) == [0, 1, 2]


def test_capcal_api_key_comes_after_the_argument_and_goes_only_with_its_own_url(monkeypatch):
    """Issue 24: the key of ``capcal serve`` is read from ``$CAPCAL_API_KEY``; issue 36: only for the URL of
    ``$CAPCAL_BASE_URL`` (the local key went to ``OPENAI_BASE_URL`` or to any URL given)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("CAPCAL_API_KEY", "capcal-key")
    monkeypatch.setenv("CAPCAL_BASE_URL", "http://127.0.0.1:9/v1")
    assert CapCalReranker().client.api_key == "capcal-key"
    assert CapCalReranker(base_url="http://127.0.0.1:9/v1/").client.api_key == "capcal-key"  # the same URL
    assert CapCalReranker(base_url="http://127.0.0.1:9/v1", api_key="given").client.api_key == "given"
    assert CapCalReranker(base_url="http://127.0.0.1:10/v1").client.api_key == "not-needed"  # another URL: no key
    monkeypatch.delenv("CAPCAL_API_KEY")
    assert CapCalReranker().client.api_key == "not-needed"  # OPENAI_API_KEY is not CAPCAL_BASE_URL's key


@pytest.mark.parametrize("env, url, key", [
    # the README's export next to a user's OPENAI_BASE_URL: the local key never goes to OPENAI_BASE_URL
    ({"CAPCAL_API_KEY": "local", "OPENAI_BASE_URL": "http://gw.example/v1", "OPENAI_API_KEY": "sk"},
     "http://gw.example/v1", "sk"),
    ({"CAPCAL_API_KEY": "local", "CAPCAL_BASE_URL": "http://127.0.0.1:8080/v1", "OPENAI_BASE_URL": "http://gw.example/v1",
      "OPENAI_API_KEY": "sk"}, "http://127.0.0.1:8080/v1", "local"),
    ({"OPENAI_API_KEY": "sk"}, None, None),  # no URL at all: an error, as before
    ({"OPENAI_BASE_URL": "http://gw.example/v1"}, "http://gw.example/v1", "not-needed"),
])
def test_a_key_travels_with_its_url(monkeypatch, env, url, key):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if url is None:
        with pytest.raises(InputError, match="no endpoint configured"):
            CapCalReranker()
        return
    client = CapCalReranker().client
    assert str(client.base_url).rstrip("/") == url and client.api_key == key


def test_capcal_api_key_with_openai_base_url_and_no_openai_key_says_which_goes_with_which(monkeypatch):
    monkeypatch.setenv("CAPCAL_API_KEY", "local")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gw.example/v1")
    with pytest.raises(InputError, match="CAPCAL_API_KEY with CAPCAL_BASE_URL, OPENAI_API_KEY with OPENAI_BASE_URL"):
        CapCalReranker()


def test_capcal_api_key_alone_names_no_url(monkeypatch):
    """It went to whatever listened on 127.0.0.1:8080 (24 requests to a stranger)."""
    monkeypatch.setenv("CAPCAL_API_KEY", "local")
    with pytest.raises(InputError, match=r"export CAPCAL_BASE_URL=\$\(capcal key --url\)"):
        CapCalReranker()


def test_credentials_in_base_url_are_sent_as_a_header_and_never_logged(caplog):
    from tests.fake_endpoint import httpx2, make_handler

    seen = []
    handler = make_handler()

    def record(request):
        seen.append((str(request.url), request.headers.get("authorization")))
        return handler(request)

    with caplog.at_level(logging.DEBUG):
        rr = CapCalReranker(base_url="http://user:s3cret@fake.test/v1",
                            http_client=httpx2.Client(transport=httpx2.MockTransport(record)))
        rr.capabilities()
    assert seen and all(auth == "Basic dXNlcjpzM2NyZXQ=" and "s3cret" not in url for url, auth in seen)
    assert not [r for r in caplog.records if "s3cret" in r.getMessage()]
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)  # httpx's own line was there to check


def test_a_base_url_without_v1_is_flagged_once(caplog):
    """Issue 34: a missing /v1 worked silently on llama.cpp (it serves both) and failed on other servers."""
    from capcal_integrations.transport.client import Clients

    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        Clients(base_url="http://127.0.0.1:18093", api_key="x")
        Clients(base_url="http://127.0.0.1:18093", api_key="x")  # the same URL: said once
        Clients(base_url="http://127.0.0.1:18093/v1", api_key="x")
        Clients(base_url="https://gateway.example/openai", api_key="x")  # a path of its own: not ours to judge
    [warning] = [r.getMessage() for r in caplog.records]
    assert "has no /v1" in warning and "use http://127.0.0.1:18093/v1" in warning
