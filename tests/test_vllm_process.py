"""How capcal runs vLLM's server: the API key stays out of its command line, and stopping it signals
only processes that are still its own. No vLLM: short-lived Python children stand in for it, and
tests/_fake_vllm.py provides a "vLLM Python" whose server answers /health.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from capcal_integrations.server import vllm
from capcal_integrations.server.launcher import _healthy
from tests import _fake_vllm


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


def _wait_exited_unreaped(proc: subprocess.Popen) -> None:
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # blocks until it exits; leaves it to be reaped


class Signals:
    """Every signal sent through os.kill / os.killpg: (target, signal, was that child reaped already?)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []
        self.procs: list[subprocess.Popen] = []

    def watch(self, proc: subprocess.Popen) -> None:
        self.procs.append(proc)

    def record(self, target: int, sig: int) -> None:
        self.calls.append((target, sig, any(p.pid == abs(target) and p.returncode is not None for p in self.procs)))


@pytest.fixture
def sent(monkeypatch) -> Signals:
    signals = Signals()
    real_kill, real_killpg = os.kill, os.killpg

    def kill(pid, sig):
        signals.record(pid, sig)
        real_kill(pid, sig)

    def killpg(pgid, sig):
        signals.record(-pgid, sig)
        real_killpg(pgid, sig)

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(os, "killpg", killpg)
    return signals


def _child(code: str) -> subprocess.Popen:
    return vllm._start([sys.executable, "-c", textwrap.dedent(code)], dict(os.environ))


def test_stop_after_vllm_exited_and_was_reaped_signals_nothing(sent):
    proc = _child("pass")
    sent.watch(proc)
    proc.wait()  # exited cleanly and reaped: its PID may already belong to another process
    assert vllm._stop(proc) == 0
    assert sent.calls == []


def test_stop_after_vllm_exited_signals_only_its_unreaped_group_and_returns_its_code(sent):
    proc = _child("import sys; sys.exit(7)")
    sent.watch(proc)
    _wait_exited_unreaped(proc)
    assert vllm._stop(proc) == 7
    assert sent.calls and all(target == -proc.pid and not reaped for target, _, reaped in sent.calls)


def test_stop_kills_what_vllm_left_running_after_it_exited(tmp_path):
    pidfile = tmp_path / "grandchild"
    proc = _child(f"""
        import subprocess, sys
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(g.pid))
        """)  # exits at once, leaving its child (an engine process, say) running in its group
    _wait_exited_unreaped(proc)
    grandchild = int(pidfile.read_text())
    try:
        assert not _gone(grandchild)
        assert vllm._stop(proc) == 0
        assert _wait_gone(grandchild)
    finally:
        if not _gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_stop_terms_then_kills_a_process_group_that_ignores_sigterm(tmp_path, caplog):
    pidfile = tmp_path / "grandchild"
    proc = _child(f"""
        import signal, subprocess, sys, time
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
        g = subprocess.Popen([sys.executable, "-c", code])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(pidfile)!r}, "w").write(str(g.pid))
        time.sleep(60)
        """)
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the grandchild sets its handler
    grandchild = int(pidfile.read_text())
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert vllm._stop(proc, grace=0.5) == -signal.SIGKILL
    assert time.monotonic() - start < 5
    assert _wait_gone(grandchild) and "still running" in caplog.text


def test_stop_lets_a_server_that_honours_sigterm_exit_without_sigkill(caplog):
    proc = _child("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(60)")
    time.sleep(0.5)
    with caplog.at_level(logging.WARNING):
        assert vllm._stop(proc, grace=10) == 0
    assert "still running" not in caplog.text


def test_on_a_cpu_the_prefix_cache_reuses_32_token_blocks_not_128(monkeypatch, tmp_path):
    """vLLM's CPU build caches whole 128-token blocks by default: each prompt of a decoding step recomputed up to
    127 tokens of its prefix. A GPU keeps vLLM's own default; a user's --block-size comes later and wins."""
    monkeypatch.setattr(vllm, "_gpu", lambda: False)
    cmd = vllm.vllm_command("python", tmp_path, "127.0.0.1", 8000, extra=("--block-size", "64"))
    assert cmd[cmd.index("--block-size") + 1] == str(vllm.CPU_BLOCK_SIZE) == "32"
    assert cmd[-2:] == ["--block-size", "64"]
    monkeypatch.setattr(vllm, "_gpu", lambda: True)
    assert "--block-size" not in vllm.vllm_command("python", tmp_path, "127.0.0.1", 8000)


def test_the_api_key_goes_in_the_environment_never_on_the_command_line(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert "VLLM_API_KEY" not in vllm.vllm_environment()
    monkeypatch.setenv("VLLM_API_KEY", "the-users")
    assert vllm.vllm_environment()["VLLM_API_KEY"] == "the-users"  # never dropped: that would open the server
    assert vllm.vllm_environment("sk-secret")["VLLM_API_KEY"] == "sk-secret"
    cmd = vllm.vllm_command("python", tmp_path, "127.0.0.1", 8000)
    assert "--api-key" not in cmd


def test_serve_passes_the_key_to_vllm_and_stops_it_when_the_parent_lets_go(monkeypatch, tmp_path, capfd):
    """serve() end to end with the fake vLLM Python: conversion, start, health, key, stop on the lifeline's EOF."""
    _fake_vllm.fake_model(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CAPCAL_VLLM_PYTHON", str(_fake_vllm.fake_python(tmp_path)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    read_fd, write_fd = os.pipe()

    def let_go_once_healthy():
        deadline = time.monotonic() + 60
        while not _healthy(f"http://127.0.0.1:{port}") and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # serve() announces it
        os.close(write_fd)

    watcher = threading.Thread(target=let_go_once_healthy)
    watcher.start()
    try:
        assert vllm.serve("fake", "127.0.0.1", port, parent_fd=read_fd, api_key="sk-secret") == 0
    finally:
        watcher.join()
        os.close(read_fd)
    info = json.loads((tmp_path / "vllm.json").read_text())
    assert info["key"] == "sk-secret" and not any("sk-secret" in arg for arg in info["argv"])
    err = capfd.readouterr().err
    assert "requests need the API key" in err and "sk-secret" not in err
    assert not _healthy(f"http://127.0.0.1:{port}")  # stopped
