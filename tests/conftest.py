"""Shared fixtures: a real local LLM server for end-to-end tests, and a hermetic environment.

``CAPCAL_TEST_BASE_URL`` points the e2e tests at an already running server instead of starting one;
``CAPCAL_TEST_MODEL`` picks the model the embedded server loads ("0.5b", "1.5b" or "smollm2");
``CAPCAL_TEST_MODEL_ALIAS`` is the model name to send when using an external server (default "local").

The hosted-API tests use ``hosted_server``: a second embedded llama.cpp server with assistant prefill
off (``CAPCAL_TEST_HOSTED_SERVER_URL`` to use a running one), seen through
:class:`~capcal_integrations.server.HostedGateway` as a hosted chat-only or completions-only API.

The vLLM tests (marker ``vllm``) use ``CAPCAL_TEST_VLLM_URL``, else start the same model with vLLM
through the library's own launcher (the vLLM of ``$CAPCAL_VLLM_PYTHON``, see
capcal_integrations/server/vllm.py). Without a usable vLLM they are skipped, unless
``CAPCAL_REQUIRE_VLLM=1`` (as ``.ci/run`` sets): then that is a failure. When the session will run a vLLM test,
the server starts in the background as soon as the tests are collected (a CPU build takes about two minutes to
come up, which the tests before it hide) and ``vllm_url`` waits for it.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs the real local LLM server (the server_url fixture)")
    config.addinivalue_line("markers", "vllm: needs a real vLLM server (the vllm_url fixture)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the real server is an e2e test, marked or not: ``-m "not e2e"`` never starts one. The tests
    without a server run first (in their files' order; so do the e2e tests after them): while they keep one core
    busy, the vLLM server starts on the other (:func:`pytest_collection_finish`), and ``.ci/run`` runs the benchmark
    smokes beside them."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "server_url" in names or "vllm_url" in names or "hosted_server" in names:
            item.add_marker(pytest.mark.e2e)
        if "vllm_url" in names:
            item.add_marker(pytest.mark.vllm)
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT/v1``) of a real OpenAI-compatible server, started once per session."""
    external = os.environ.get("CAPCAL_TEST_BASE_URL")
    if external:
        yield external.rstrip("/")
        return
    from capcal_integrations.server import EmbeddedServer

    yield from _serving(EmbeddedServer(model=os.environ.get("CAPCAL_TEST_MODEL", "0.5b")))


def _serving(server) -> Iterator[str]:
    """Start ``server`` for the session; stop it (SIGTERM to its process group, then SIGKILL) after."""
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hosted_server() -> Iterator[str]:
    """Base URL of a real llama.cpp server that does not continue a final assistant message (as hosted
    APIs do not); the tests put a :class:`HostedGateway` in front of it."""
    external = os.environ.get("CAPCAL_TEST_HOSTED_SERVER_URL")
    if external:
        yield external.rstrip("/")
        return
    from capcal_integrations.server import EmbeddedServer

    yield from _serving(EmbeddedServer(model=os.environ.get("CAPCAL_TEST_MODEL", "0.5b"), prefill=False, n_parallel=4))


#: The vLLM server started in the background at collection (:func:`pytest_collection_finish`): the server, the
#: thread starting it, and what its start raised.
_early_vllm: dict[str, Any] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the vLLM server in the background when a vLLM test will run and vLLM is usable (``vllm_url`` says why
    not otherwise)."""
    if os.environ.get("CAPCAL_TEST_VLLM_URL") or not any(item.get_closest_marker("vllm") for item in session.items):
        return
    from capcal_integrations.server import VllmServer
    from capcal_integrations.server.vllm import check_vllm

    try:
        check_vllm()
    except Exception:  # not usable here: vllm_url checks again and says why (skip, or fail under CAPCAL_REQUIRE_VLLM)
        return
    server = VllmServer(model=os.environ.get("CAPCAL_TEST_MODEL", "0.5b"))

    def start() -> None:
        try:
            server.start()
        except BaseException as err:  # re-raised by vllm_url, in the test that needs the server
            _early_vllm["error"] = err

    _early_vllm.update(server=server, thread=threading.Thread(target=start, name="vllm-start", daemon=True))
    _early_vllm["thread"].start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the background vLLM server if no test asked for it (``vllm_url`` stops it otherwise)."""
    if _early_vllm.get("server") is not None:
        _early_vllm["thread"].join()
        _early_vllm.pop("server").stop()


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """Base URL of a real vLLM server with the packaged model, started once per session (in the background at
    collection when it could be: :func:`pytest_collection_finish`)."""
    external = os.environ.get("CAPCAL_TEST_VLLM_URL")
    if external:
        yield external.rstrip("/")
        return
    server = _early_vllm.pop("server", None)
    if server is not None:  # started at collection, vLLM checked usable there
        _early_vllm["thread"].join()
        try:
            if "error" in _early_vllm:
                raise _early_vllm.pop("error")
            yield server.base_url
        finally:
            server.stop()
        return
    from capcal_integrations.errors import MissingExtra
    from capcal_integrations.server import VllmServer
    from capcal_integrations.server.vllm import check_vllm

    try:
        check_vllm()
    except MissingExtra as err:
        if os.environ.get("CAPCAL_REQUIRE_VLLM") == "1":
            pytest.fail(f"CAPCAL_REQUIRE_VLLM=1 but vLLM is not usable: {err}")
        pytest.skip(f"no vLLM: {err}")
    yield from _serving(VllmServer(model=os.environ.get("CAPCAL_TEST_MODEL", "0.5b")))


@pytest.fixture(scope="session")
def test_model() -> str:
    """The model name the test server answers to."""
    return os.environ.get("CAPCAL_TEST_MODEL_ALIAS", "local")


@pytest.fixture(scope="session", autouse=True)
def session_decisions_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where a content check's background reading that ends after its test (and after that test's own folder was
    unset again) keeps what it read: a folder of the session's, never the user's ~/.cache/capcal (readings of the
    test doubles' models were found there after a run)."""
    before = os.environ.get("CAPCAL_DECISIONS_DIR")
    os.environ["CAPCAL_DECISIONS_DIR"] = str(tmp_path_factory.mktemp("session-decisions"))
    yield
    if before is None:
        os.environ.pop("CAPCAL_DECISIONS_DIR", None)
    else:
        os.environ["CAPCAL_DECISIONS_DIR"] = before


@pytest.fixture(autouse=True)
def hermetic_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the developer's endpoint settings out of every test, and each test's saved content decisions
    (capcal_integrations/content_check/saved_decisions.py) in a folder of its own."""
    for name in ("CAPCAL_BASE_URL", "CAPCAL_API_KEY", "CAPCAL_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(tmp_path_factory.mktemp("decisions")))
    from capcal_integrations.content_check import check, saved_folder

    # what is said once per process (a decision's WARNING, a folder's problem) is said once per test
    monkeypatch.setattr(check, "_announced", set())
    monkeypatch.setattr(check, "_deciding", set())
    monkeypatch.setattr(saved_folder, "_said", set())
