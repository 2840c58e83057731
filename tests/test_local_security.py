"""Keys stay home: which local server a command trusts, what it sends there, and what the CLI writes down.

The local servers here are tiny loopback HTTP servers (tests/fake_endpoint.py behind http.server) that
record every request, so a test can assert on exactly what reached them. One e2e test runs the real
``capcal serve``.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import httpx2
import pytest

from capcal_integrations.commands.cli import main
from capcal_integrations.server import cache_dir, launcher, ownership
from capcal_integrations.server.ownership import new_key, record_server
from capcal_integrations.testing import Loopback

AMBIENT = "sk-ambient-openai-key-never-to-leave"
TINY = pathlib.Path(__file__).parent / "fixtures" / "tiny-dl"
MODEL_CACHE = cache_dir()  # the real one, read before the tests point CAPCAL_CACHE_DIR elsewhere


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeLocal(Loopback):
    """A loopback server answering as llama.cpp would (:class:`capcal_integrations.testing.Loopback`); it records
    every request with its request line and headers.

    ``key=None``: it answers everything (what a stranger's server may do); else every route but
    ``/health`` needs ``Authorization: Bearer key`` (401 otherwise), as ``capcal serve`` does.
    ``/health`` answers 200 with a non-JSON body.
    """

    def __init__(self, *, key: str | None = None, port: int = 0) -> None:
        super().__init__(key=key, port=port, health=b"OK", raw=True)

    def everything(self) -> str:
        return "\n".join(s.body for s in self.seen)


class StandIn:
    """Stands in for the embedded server a command starts (a FakeLocal with the key it is given)."""

    started: list[StandIn] = []

    def __init__(self, model: str, port: int | None = None, api_key: str | None = None, **kw: object) -> None:
        self.key, self.fake, self.model = api_key, FakeLocal(key=api_key), model
        self.base_url, self.log_path = self.fake.base_url, "log"

    def __enter__(self) -> StandIn:
        StandIn.started.append(self)
        self.fake.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.__exit__()


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", AMBIENT)


@pytest.fixture
def port(monkeypatch) -> int:
    """The port where commands look for a running server (8080 outside tests)."""
    free = _free_port()
    monkeypatch.setattr(launcher, "DEFAULT_PORT", free)
    return free


@pytest.fixture
def started(monkeypatch) -> list[StandIn]:
    StandIn.started = []
    monkeypatch.setattr(launcher, "EmbeddedServer", StandIn)
    return StandIn.started


@pytest.fixture
def passages(tmp_path) -> pathlib.Path:
    path = tmp_path / "passages.txt"
    path.write_text("Fleas live two to three months.\nBananas are yellow.\nThe Eiffel Tower is in Paris.\n")
    return path


def rerank(passages: pathlib.Path, *extra: str) -> int:
    return main(["rerank", "--query", "how long do fleas live", "--passages", str(passages), "--method", "first-token",
                 *extra])


def _rewrite_state(port: int, **changes: object) -> pathlib.Path:
    """Change fields of a state file in place (its mode stays 0600)."""
    path = ownership.state_path(port)
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path


# --------------------------------------------------------------------------- which server is reused


def test_a_stranger_on_the_port_gets_nothing_not_even_a_health_check(port, started, passages, capsys):
    with FakeLocal(port=port) as stranger:  # /health 200 (not JSON), /v1/models, answers without a key
        assert rerank(passages) == 0
    assert stranger.seen == []  # old code: /health, then the whole reranking with "Bearer <OPENAI_API_KEY>"
    [embedded] = started  # the command started its own server instead, with a fresh key
    assert embedded.key and embedded.key != AMBIENT
    assert embedded.fake.seen and all(s.auth == f"Bearer {embedded.key}" for s in embedded.fake.seen)
    assert AMBIENT not in embedded.fake.everything()
    assert json.loads(capsys.readouterr().out)["order"]


def test_the_server_capcal_serve_recorded_is_reused_with_its_own_key(port, started, passages, capsys):
    key = new_key()
    with FakeLocal(port=port, key=key) as own:
        path = record_server("127.0.0.1", port, key, engine="llama.cpp", model="0.5b")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert rerank(passages) == 0
    assert started == []
    # the proof: refused without the key, answered with it; then the reranking, every request with the key
    assert [(s.path, s.auth, s.status) for s in own.seen[:2]] == [("/v1/models", None, 401),
                                                                   ("/v1/models", f"Bearer {key}", 200)]
    assert len(own.seen) > 2 and all(s.auth == f"Bearer {key}" for s in own.seen[1:])
    assert AMBIENT not in own.everything()
    assert json.loads(capsys.readouterr().out)["order"]


def test_a_server_of_ours_serving_another_model_is_not_reused_for_it(port, started, passages, capsys):
    key = new_key()
    with FakeLocal(port=port, key=key) as own:
        record_server("127.0.0.1", port, key, engine="llama.cpp", model="0.5b")
        assert rerank(passages, "--model", "1.5b") == 0
        proof = len(own.seen)  # the ownership proof only: the ranking went to the 1.5b server started for it
        assert proof == 2 and [s.model for s in started] == ["1.5b"]
        assert rerank(passages) == 0 and len(own.seen) > proof  # no model asked for: ours is reused
    assert json.loads(capsys.readouterr().out.splitlines()[0])["order"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@contextlib.contextmanager
def _sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


REFUSALS = {
    "file readable by others": lambda port, path, stack: os.chmod(path, 0o644),
    "directory open to others": lambda port, path, stack: os.chmod(path.parent, 0o755),
    "state file is a symlink": lambda port, path, stack: (
        os.replace(path, path.with_name("elsewhere.json")), os.symlink(path.with_name("elsewhere.json"), path)),
    "its process exited": lambda port, path, stack: _rewrite_state(port, pid=_dead_pid()),
    "another process of ours": lambda port, path, stack: _rewrite_state(port, pid=stack.enter_context(_sleeper())),
    "pid reused (another start time)": lambda port, path, stack: _rewrite_state(
        port, start_time=json.loads(path.read_text())["start_time"] + 1),
    "not a state file": lambda port, path, stack: _rewrite_state(port, pid="x"),
}


@pytest.mark.parametrize("why", list(REFUSALS))
def test_a_server_whose_state_file_does_not_hold_is_never_sent_anything(why, port, started, passages, caplog):
    key = new_key()
    with FakeLocal(port=port, key=key) as own, contextlib.ExitStack() as stack:
        path = record_server("127.0.0.1", port, key, engine="llama.cpp", model="0.5b")
        REFUSALS[why](port, path, stack)
        assert rerank(passages) == 0
    assert own.seen == []  # refused on local checks alone, before any request
    assert len(started) == 1
    assert f"not reusing the server on port {port}" in caplog.text


def test_a_server_that_answers_without_the_key_never_receives_it(port, started, passages, caplog):
    key = new_key()
    with FakeLocal(port=port) as open_server:  # our own process (pid, start time, socket), but no key required
        record_server("127.0.0.1", port, key, engine="llama.cpp", model="0.5b")
        assert rerank(passages) == 0
    assert [(s.path, s.auth) for s in open_server.seen] == [("/v1/models", None)]
    assert key not in open_server.everything() and len(started) == 1
    assert "answers" in caplog.text and "without the key" in caplog.text


def test_a_server_that_refuses_the_recorded_key_is_not_reused(port, started, passages):
    key = new_key()
    with FakeLocal(port=port, key="another key") as other:
        record_server("127.0.0.1", port, key, engine="llama.cpp", model="0.5b")
        assert rerank(passages) == 0
    assert [s.status for s in other.seen] == [401, 401] and len(started) == 1


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_a_socket_of_another_user_on_the_port_is_refused_before_any_request(port, started, passages, caplog):
    # our server process is alive and its state file holds, but another user took the port meanwhile
    # (the window while vLLM starts): the listener's owner is checked before the key is sent
    key = new_key()
    record_server("127.0.0.1", port, key, engine="vllm", model="0.5b")
    stranger = subprocess.Popen(["/usr/bin/python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                user=65534, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while 65534 not in ownership.listener_uids(port):
            assert stranger.poll() is None and time.monotonic() < deadline, "the stranger's server did not start"
            time.sleep(0.1)
        assert rerank(passages) == 0
    finally:
        stranger.terminate()
        log, _ = stranger.communicate(timeout=10)
    assert "HTTP/1." not in log  # its access log: no request at all
    assert "a socket of another user (uid 65534)" in caplog.text and len(started) == 1


@contextlib.contextmanager
def _env(**values):
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_an_endpoint_the_user_named_gets_the_users_key(passages, capsys):
    with FakeLocal(key="user-key") as named:
        assert rerank(passages, "--base-url", named.base_url, "--api-key", "user-key") == 0
        assert named.seen and all(s.auth == "Bearer user-key" for s in named.seen)
    with FakeLocal() as named:  # no --api-key: the ambient $OPENAI_API_KEY goes only with $OPENAI_BASE_URL (issue 36)
        assert rerank(passages, "--base-url", named.base_url) == 0
        assert named.seen and all(s.auth == "Bearer not-needed" for s in named.seen)
    with FakeLocal() as named, _env(OPENAI_BASE_URL=named.base_url):  # its own URL: then it goes
        assert rerank(passages, "--base-url", named.base_url) == 0
        assert named.seen and all(s.auth == f"Bearer {AMBIENT}" for s in named.seen)


def test_api_key_without_base_url_is_an_input_error(passages, capsys):
    assert rerank(passages, "--api-key", "k") == 1
    assert "--api-key is the key of the --base-url endpoint" in capsys.readouterr().err


def test_state_files_are_written_for_this_user_only(tmp_path):
    path = record_server("0.0.0.0", 8123, "k", engine="llama.cpp", model="0.5b")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["8123.json"]  # no temporary file left
    data = json.loads(path.read_text())
    assert (data["pid"], data["api_key"], data["port"]) == (os.getpid(), "k", 8123)
    ownership.forget_server(path)
    assert not path.exists()


# --------------------------------------------------------------------------- what the CLI writes down


def test_rerank_output_is_untouched_when_the_endpoint_is_unreachable(tmp_path, passages, capsys):
    out = tmp_path / "ranked.jsonl"
    out.write_text("yesterday's results\n")
    assert rerank(passages, "--base-url", "http://127.0.0.1:9/v1", "--output", str(out)) == 1
    assert out.read_text() == "yesterday's results\n"  # old code: an empty file
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert capsys.readouterr().err.startswith("capcal: error: ")


def test_rerank_output_replaces_the_file_on_success_keeping_its_permissions(tmp_path, passages):
    out = tmp_path / "ranked.jsonl"
    out.write_text("yesterday's results\n")
    out.chmod(0o640)
    with FakeLocal() as server:
        assert rerank(passages, "--base-url", server.base_url, "--output", str(out)) == 0
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(record["order"]) == [0, 1, 2] and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_credentials_in_a_url_stay_out_of_the_verbose_log(passages):
    with FakeLocal() as server:
        url = server.base_url.replace("http://", "http://alice:hunter2@")
        done = subprocess.run([sys.executable, "-m", "capcal_integrations.commands.cli", "-v", "rerank", "--base-url", url,
                               "--query", "q", "--passages", str(passages), "--method", "first-token"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HTTP Request: POST http://127.0.0.1" in done.stderr  # httpx's request lines: the URL holds no credential
    assert "hunter2" not in done.stderr


def test_errors_the_cli_prints_are_redacted(capsys, monkeypatch):
    from capcal_integrations.errors import EndpointError

    def fail(args):
        raise EndpointError("POST http://alice:hunter2@10.0.0.5:8000/v1/completions: HTTP 500")

    monkeypatch.setattr("capcal_integrations.commands.cli.cmd_tune", fail)
    assert main(["tune", "--base-url", "http://x/v1"]) == 1
    assert capsys.readouterr().err == "capcal: error: POST http://***@10.0.0.5:8000/v1/completions: HTTP 500\n"


@pytest.mark.parametrize("leaky, secret", [
    ("authorization: bearer sk-lowercase-secret", "sk-lowercase-secret"),
    ("Authorization: BEARER sk-uppercase-secret", "sk-uppercase-secret"),
    ("x-api-key: sk-header-secret", "sk-header-secret"),
    ("X-Api-Key=sk-header-secret&next=1", "sk-header-secret"),
    ("{'api_key': 'sk-dict-secret', 'model': 'm'}", "sk-dict-secret"),
    ('{"api_key": "sk-json-secret"}', "sk-json-secret"),
    ("Settings(base_url='http://h/v1', openai_api_key='sk-field-secret')", "sk-field-secret"),
    ("GET https://h.example/v1/models?auth=sk-auth-secret&x=1", "sk-auth-secret"),
    ("GET https://blob.example/f?sv=1&sig=sk-sig-secret#frag", "sk-sig-secret"),
    ("http://alice:hunter2@10.0.0.5:8000/v1?api_key=sk-query-secret", "hunter2"),
    ("http://alice:hunter2@10.0.0.5:8000/v1?api_key=sk-query-secret", "sk-query-secret"),
    ("http://token-only@h/v1", "token-only"),
])
def test_redaction_covers_every_spelling_of_a_credential(leaky, secret):
    from capcal_integrations.redaction import redact

    assert secret not in redact(leaky) and "***" in redact(leaky)


def test_redaction_leaves_ordinary_text_alone():
    from capcal_integrations.redaction import redact

    for text in ("{'key': 'value'}", "bos_token='<s>'", "max_tokens=5", "OpenAI(api_key=None)", "Bearer abc",
                 "POST http://127.0.0.1:8080/v1/completions?x=1"):
        assert redact(text) == text


def test_redacting_a_dump_and_a_url():
    from capcal_integrations.redaction import redact_url, redact_value

    dumped = {"base_url": "http://u:pw@h/v1?sig=s1", "api_key": "sk-dump", "top_n": 3,
              "default_headers": {"x-api-key": "sk-h", "Authorization": "bearer sk-b"}, "tags": ["?auth=a1"]}
    text = repr(redact_value(dumped))
    assert not any(s in text for s in ("pw", "sk-dump", "sk-h", "sk-b", "s1", "a1")), text
    assert redact_value(dumped)["top_n"] == 3 and redact_url("http://u:pw@h/v1?key=k") == "http://***@h/v1?key=***"


def test_a_server_record_repr_never_shows_its_key():
    record = ownership.ServerRecord("127.0.0.1", 8080, 1, "capcal-the-secret-key", "llamacpp", "0.5b", None,
                                    ("capcal", "serve", "--api-key", "capcal-the-secret-key"))
    assert "capcal-the-secret-key" not in repr(record) and "capcal-the-secret-key" not in str(record)
    assert record.api_key == "capcal-the-secret-key"


# --------------------------------------------------------------------------- eval and testbed under the CLI's handling


def test_eval_failures_are_one_line_not_a_traceback(tmp_path, capsys):
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    status = main(["eval", "--data", str(TINY), "--out", str(not_a_folder), "--methods", "bm25", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1 and err[0].startswith("capcal: error: ") and str(not_a_folder) in err[0]


def test_eval_interrupted_exits_130(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr("capcal_integrations.evaluation.command.main", interrupted)
    assert main(["eval", "--data", "x", "--out", "y"]) == 130
    assert capsys.readouterr().err == "capcal: interrupted\n"


def test_testbed_is_dispatched_under_the_same_handling(capsys):
    assert main(["testbed", "--data", str(TINY), "--draws", "0"]) == 1
    assert capsys.readouterr().err == "capcal: error: --draws must be >= 1, got 0\n"


# --------------------------------------------------------------------------- the real server


def _status(url: str, key: str | None = None, origin: str | None = None) -> tuple[int, str | None]:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **({"Origin": origin} if origin else {})}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30) as r:
            return r.status, r.headers.get("Access-Control-Allow-Origin")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Access-Control-Allow-Origin")


@pytest.mark.e2e
def test_capcal_serve_requires_its_key_records_it_and_is_found(port, tmp_path):
    cache = tmp_path / "cache"  # a state directory of its own; the weights linked from the real cache
    cache.mkdir()
    for weights in MODEL_CACHE.glob("*.gguf*"):
        (cache / weights.name).symlink_to(weights)
    env = {**os.environ, "CAPCAL_CACHE_DIR": str(cache), "OPENAI_API_KEY": AMBIENT}
    env.pop("CAPCAL_API_KEY", None)
    serve = subprocess.Popen([sys.executable, "-m", "capcal_integrations.commands.cli", "serve", "--port", str(port),
                              "--n-parallel", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        state = cache / "servers" / f"{port}.json"
        deadline = time.monotonic() + 300
        while not state.exists():
            assert serve.poll() is None, serve.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "capcal serve did not record itself in 300 s"
            time.sleep(0.5)
        key = json.loads(state.read_text())["api_key"]
        root = f"http://127.0.0.1:{port}"
        assert _status(root + "/health")[0] == 200
        assert _status(root + "/v1/models")[0] == 401
        assert _status(root + "/v1/models", "wrong")[0] == 401
        assert _status(root + "/v1/models", key)[0] == 200
        # no web page may read answers: llama.cpp would echo any Origin back (with credentials) by default
        assert _status(root + "/v1/models", key, origin="http://evil.example")[1] in (None, "")
        record = ownership.check_own_server(port)  # the real checks, against the real process
        assert record.pid == serve.pid and record.api_key == key
        with launcher.endpoint(None) as found:
            assert found == (f"{root}/v1", None) and found.api_key == key
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert not state.exists()  # removed on the way out


def test_the_hosted_demo_server_and_its_gateway_require_a_key(started):
    """``capcal demo --hosted`` (launcher.endpoint(hosted=True)): the embedded server is started with a fresh key,
    the gateway in front of it requires the same key, and the ambient OPENAI_API_KEY is sent nowhere."""

    with launcher.endpoint(None, hosted=True) as found:
        [server] = started
        assert server.key and found.api_key == server.key and found.api_key != AMBIENT
        assert _status(found.base_url + "/models")[0] == 401
        assert _status(found.base_url + "/models", "wrong")[0] == 401
        assert _status(found.base_url + "/models", found.api_key)[0] == 200
        answer = httpx2.post(found.base_url + "/chat/completions", headers={"Authorization": f"Bearer {found.api_key}"},
                             json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert answer.status_code == 200, answer.text
    upstream = [s for s in server.fake.seen if s.path != "/health"]
    assert upstream and all(s.auth == f"Bearer {server.key}" for s in upstream)
    assert AMBIENT not in server.fake.everything()


# --------------------------------------------------------------------------- stopping a child (issue 16, item 11)


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)


def test_stop_signals_nothing_once_the_child_has_exited(monkeypatch):
    # the reaped child's PID (and process group ID) may belong to someone else by now
    sent = []
    monkeypatch.setattr(launcher.os, "killpg", lambda *a: sent.append(a))
    srv = launcher.EmbeddedServer("0.5b")
    srv._proc = _child("pass")
    srv._proc.wait()
    srv.stop()
    assert sent == []


def test_stop_sends_sigkill_only_to_a_child_still_running_after_sigterm(monkeypatch):
    real_killpg, sent = os.killpg, []
    monkeypatch.setattr(launcher.os, "killpg", lambda pid, sig: (sent.append(sig), real_killpg(pid, sig)))
    polite = launcher.EmbeddedServer("0.5b")
    polite._proc = _child("import time; time.sleep(60)")
    polite.stop()
    assert sent == [launcher.signal.SIGTERM] and polite._proc is None
    sent.clear()
    stubborn = launcher.EmbeddedServer("0.5b")
    stubborn.stop_timeout = 1
    stubborn._proc = proc = _child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                   "print('ready', flush=True); time.sleep(60)")
    assert proc.stdout.readline() == "ready\n"  # type: ignore[union-attr]  # SIGTERM is ignored from now on
    stubborn.stop()
    assert sent == [launcher.signal.SIGTERM, launcher.signal.SIGKILL] and proc.returncode == -9
