"""Which local server is ours: the state file ``capcal serve`` leaves, and the checks before trusting it.

Anything can listen on 127.0.0.1:8080: another user's program, or one that took the port after our
server exited. A ``capcal`` command reuses a running server only if all of this holds, checked in
this order so that nothing (no key, no query) is sent before the local checks pass:

1. ``<cache>/servers/<port>.json`` exists, in a directory of this user's with mode 0700, and is a
   regular file of this user's with mode 0600 (a file only we could have written);
2. the process it names is alive, belongs to this user, and is the very process that wrote it (same
   start time and command line, so a reused PID does not count);
3. every socket listening on the port belongs to this user (Linux's ``/proc/net/tcp``);
4. the server proves it knows the key: ``GET /v1/models`` without it is refused (401/403) and with it
   succeeds. Both llama.cpp (``api_keys``) and vLLM (``--api-key``) guard that route.

Steps 2 and 3 read ``/proc``: elsewhere no server is reused (each command starts its own, or takes
``--base-url`` and ``--api-key``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import secrets
import socket
import stat
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field, fields

from ..errors import ServerError
from ..redaction import redact_argv
from .models import cache_dir

log = logging.getLogger(__name__)

__all__ = ["ServerRecord", "new_key", "state_dir", "state_path", "record_server", "forget_server",
           "check_own_server", "find_own_server", "NotOurs"]

_PROC = pathlib.Path("/proc")


def new_key() -> str:
    """A fresh random API key (256 bits)."""
    return "capcal-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ServerRecord:
    """What a serving process wrote about itself."""

    host: str
    port: int
    pid: int
    api_key: str = field(repr=False)  # never in a repr (logs, tracebacks): see __repr__
    engine: str
    model: str
    start_time: int | None  # /proc/<pid>/stat field 22 (clock ticks after boot); None without /proc
    cmdline: tuple[str, ...]

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown.update(api_key="***" if self.api_key else "", cmdline=tuple(redact_argv(self.cmdline)))
        return f"ServerRecord({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def base_url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return (f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}") + "/v1"


class NotOurs(Exception):
    """A check failed: the reason says which (internal; :func:`find_own_server` logs it)."""


def state_dir(create: bool = False) -> pathlib.Path:
    """``<cache>/servers``; with ``create``, made (mode 0700) if missing and closed to others if open."""
    path = cache_dir() / "servers"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise ServerError(f"{path} is not a directory of yours: remove it, or set CAPCAL_CACHE_DIR")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
    return path


def state_path(port: int) -> pathlib.Path:
    return state_dir() / f"{port}.json"


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from field 3 (state) on; the command name may hold spaces and parentheses."""
    return (_PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()


def _start_time(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[19])  # field 22
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return tuple(sys.orig_argv) if pid == os.getpid() else ()
    return tuple(os.fsdecode(a) for a in raw.split(b"\0")[:-1])


def record_server(host: str, port: int, api_key: str, *, engine: str, model: str) -> pathlib.Path:
    """Write this process's state file for ``port`` (mode 0600, replaced atomically); returns its path."""
    pid = os.getpid()
    data = {"host": host, "port": port, "pid": pid, "api_key": api_key, "engine": engine, "model": model,
            "start_time": _start_time(pid), "cmdline": list(_cmdline(pid))}
    path = state_dir(create=True) / f"{port}.json"
    tmp = path.with_name(f".{port}.{pid}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # whatever the umask
        json.dump(data, f)
    os.replace(tmp, path)
    return path


def forget_server(path: pathlib.Path) -> None:
    """Remove ``path`` if it still describes this process (another server may have replaced it)."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def _read_record(port: int) -> ServerRecord:
    """Steps 1 and the parsing: the state file, if only this user could have written it."""
    directory = state_dir()
    uid = os.getuid()
    try:
        dst = os.lstat(directory)
    except FileNotFoundError:
        raise NotOurs("no capcal serve of yours recorded a server (no state directory)") from None
    if not stat.S_ISDIR(dst.st_mode) or dst.st_uid != uid or dst.st_mode & 0o077:
        raise NotOurs(f"{directory} is not a directory of yours closed to others (mode "
                      f"{stat.S_IMODE(dst.st_mode):o}, owner uid {dst.st_uid})")
    path = directory / f"{port}.json"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise NotOurs(f"no capcal serve of yours recorded a server on port {port} ({path} is missing)") from None
    except OSError as e:  # a symbolic link (ELOOP), unreadable, ...
        raise NotOurs(f"cannot open {path}: {e.strerror or e}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o600:
            raise NotOurs(f"{path} is not a file of yours with mode 600 (mode {stat.S_IMODE(st.st_mode):o}, "
                          f"owner uid {st.st_uid})")
        try:
            d = json.load(f)
            record = ServerRecord(str(d["host"]), int(d["port"]), int(d["pid"]), str(d["api_key"]), str(d["engine"]),
                                  str(d["model"]), None if d["start_time"] is None else int(d["start_time"]),
                                  tuple(str(a) for a in d["cmdline"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise NotOurs(f"{path} is not a state file capcal wrote") from None
    if record.port != port or not record.api_key:
        raise NotOurs(f"{path} names port {record.port} or has no key")
    return record


def _check_process(record: ServerRecord) -> None:
    """Step 2: the recorded process is alive, this user's, and the one that wrote the file."""
    proc = _PROC / str(record.pid)
    try:
        owner = os.stat(proc).st_uid
        state = _stat_fields(record.pid)[0]
    except (OSError, IndexError):
        raise NotOurs(f"its server process {record.pid} is no longer running") from None
    if owner != os.getuid():
        raise NotOurs(f"process {record.pid} belongs to another user (uid {owner})")
    if state in ("Z", "X"):
        raise NotOurs(f"its server process {record.pid} has exited")
    if record.start_time is None or _start_time(record.pid) != record.start_time:
        raise NotOurs(f"process {record.pid} is not the server that wrote the state file (another start time)")
    if _cmdline(record.pid) != record.cmdline:
        raise NotOurs(f"process {record.pid} runs another command than the server that wrote the state file")


def listener_uids(port: int) -> list[int]:
    """The owners of every TCP socket listening on ``port`` (IPv4 and IPv6), from ``/proc/net``."""
    uids = []
    for table in ("tcp", "tcp6"):
        try:
            rows = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()  # sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
            if len(f) > 7 and f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port:
                uids.append(int(f[7]))
    return uids


def _check_listener(record: ServerRecord) -> None:
    """Step 3: whatever listens on the port is this user's (not a stranger who took it)."""
    uids = listener_uids(record.port)
    if not uids:
        raise NotOurs(f"nothing listens on port {record.port} (the server is still starting, or gone)")
    if any(u != os.getuid() for u in uids):
        raise NotOurs(f"a socket of another user (uid {next(u for u in uids if u != os.getuid())}) listens on "
                      f"port {record.port}")


def _status(url: str, api_key: str | None, timeout: float) -> int:
    """The HTTP status of GET ``url`` (0 if unreachable). Never through a proxy: the key stays on this machine."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return 0


def _check_key(record: ServerRecord, timeout: float) -> None:
    """Step 4: refused without the key, answered with it."""
    url = record.base_url + "/models"
    if (status := _status(url, None, timeout)) not in (401, 403):
        raise NotOurs(f"it answers {url} without the key (HTTP {status or 'no answer'}), so it is not the keyed "
                      "server that wrote the state file")
    if (status := _status(url, record.api_key, timeout)) != 200:
        raise NotOurs(f"it does not accept its recorded key (HTTP {status or 'no answer'} from {url})")


def check_own_server(port: int, *, timeout: float = 5.0) -> ServerRecord:
    """The record of the server on ``port`` that this user's ``capcal serve`` started, after every check
    of the module docstring passed; else :class:`NotOurs` with the reason."""
    if not (_PROC / "self" / "stat").is_file():
        raise NotOurs("checking who runs a local server needs Linux's /proc")
    record = _read_record(port)
    _check_process(record)
    _check_listener(record)
    _check_key(record, timeout)
    return record


def _listening(port: int) -> bool:
    """Whether anything accepts TCP connections on 127.0.0.1:``port`` (connects and closes; sends nothing)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def find_own_server(port: int) -> ServerRecord | None:
    """:func:`check_own_server`, or None; says why a running server is not reused."""
    try:
        return check_own_server(port)
    except NotOurs as why:
        if state_path(port).exists() or _listening(port):
            log.info("not reusing the server on port %d: %s", port, why)
        else:
            log.debug("no server on port %d: %s", port, why)
        return None
