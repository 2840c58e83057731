"""Issue 24 items 3 and 4: keys that work without reading the source, and errors that name the URL and the
next step. Against loopback servers that check a key as ``capcal serve`` does (tests/fake_endpoint.py's
``Loopback``) and the fake endpoint; no model."""

from __future__ import annotations

import socket

import pytest

from capcal_integrations import CapCalReranker, EndpointError, EndpointUnreachable
from capcal_integrations.commands.cli import main
from capcal_integrations.errors import KEY_HINT, NOT_FOUND_HINT
from capcal_integrations.server import launcher
from capcal_integrations.server.ownership import new_key, record_server
from tests.fake_endpoint import Loopback, httpx2

PASSAGES = ["Fleas live two to three months.", "Bananas are yellow.", "The Eiffel Tower is in Paris."]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path / "cache"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _failing(status: int) -> CapCalReranker:
    http = httpx2.Client(transport=httpx2.MockTransport(lambda r: httpx2.Response(status, json={"error": "no"})))
    return CapCalReranker(base_url="http://user:pw@fake.test/v1", http_client=http, max_retries=0)


def test_capcal_key_prints_the_key_of_your_capcal_serve_alone_on_stdout(monkeypatch, capsys):
    port, key = _free_port(), new_key()
    monkeypatch.setattr(launcher, "DEFAULT_PORT", port)
    with Loopback(port=port, key=key):
        record_server("127.0.0.1", port, key, engine="llama.cpp", model="0.5b")
        assert main(["key"]) == 0
        assert capsys.readouterr().out == key + "\n"
        assert main(["key", "--port", str(port)]) == 0 and capsys.readouterr().out == key + "\n"
        assert main(["key", "--url"]) == 0 and capsys.readouterr().out == f"http://127.0.0.1:{port}/v1\n"


def test_capcal_key_without_a_server_says_how_to_start_one(capsys):
    port = _free_port()
    assert main(["key", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"capcal serve --port {port}" in err


def test_the_two_exports_reach_your_capcal_serve_from_python(monkeypatch):
    """With ``export CAPCAL_BASE_URL=$(capcal key --url) CAPCAL_API_KEY=$(capcal key)``, nothing else to configure
    (``CAPCAL_API_KEY`` alone no longer sends the key to whatever listens on 127.0.0.1:8080: issue 36)."""
    port, key = _free_port(), new_key()
    monkeypatch.setenv("CAPCAL_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("CAPCAL_API_KEY", key)
    with Loopback(port=port, key=key) as server:
        ranking = CapCalReranker().rerank("how long do fleas live", PASSAGES)
    assert sorted(ranking.order) == [0, 1, 2]
    assert server.seen and all(s.auth == f"Bearer {key}" for s in server.seen)


def test_a_wrong_key_is_one_cli_line_naming_capcal_api_key(monkeypatch, capsys, tmp_path):
    port = _free_port()
    passages = tmp_path / "p.txt"
    passages.write_text("\n".join(PASSAGES) + "\n")
    monkeypatch.setenv("CAPCAL_API_KEY", "wrong")
    with Loopback(port=port, key=new_key()):
        status = main(["rerank", "--base-url", f"http://127.0.0.1:{port}/v1", "--query", "fleas", "--passages",
                       str(passages)])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1
    assert "HTTP 401" in err and "CAPCAL_API_KEY" in err and f"http://127.0.0.1:{port}/v1/models" in err
    assert "--api-key" in err and "capcal key --port N" in err and "api_key=" not in err  # the command line's words


def test_401_names_the_key_and_404_asks_about_v1_with_the_url_redacted():
    with pytest.raises(EndpointError) as caught:
        _failing(401).rerank("q", PASSAGES)
    message = str(caught.value)
    assert "CAPCAL_API_KEY" in message and "capcal key" in message
    # the URL's credentials travel as a header, out of the URL (issue 36): none is shown, none could be logged
    assert "(http://fake.test/v1" in message and "pw" not in message and "secret" not in message
    with pytest.raises(EndpointError, match=r"does base_url end in /v1"):
        _failing(404).rerank("q", PASSAGES)
    with pytest.raises(EndpointError) as caught:
        _failing(500).rerank("q", PASSAGES)
    assert KEY_HINT not in str(caught.value) and NOT_FOUND_HINT not in str(caught.value)  # no hint for a 500


def test_an_unreachable_endpoint_names_its_url():
    port = _free_port()
    with pytest.raises(EndpointUnreachable) as caught:
        CapCalReranker(base_url=f"http://127.0.0.1:{port}/v1", max_retries=0).rerank("q", PASSAGES)
    assert f"http://127.0.0.1:{port}/v1/models" in str(caught.value) and "capcal serve" in str(caught.value)
