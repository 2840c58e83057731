"""The decisions folder as the user's own: made 0700 (the parents it makes too), used only while it is the user's.

What is read from the folder steers rankings (a planted ``"reads": true`` file makes a model calibrate), so the
folder is used only where nobody else can write it:

* :func:`usable`: the folder (and ``readings/`` in it) owned by the effective user and not writable by group or
  others; else not used at all, with one WARNING per folder and process saying why and what to do: decisions are
  then kept in memory only. Each file is checked again as it is read (:func:`~.prompts.files.read_untrusted`).
* :func:`make`: every folder it creates 0700 (``mkdir(parents=True)`` would make the parents 0755).
* :func:`locked`: the writers' ``fcntl`` lock on ``.lock``, opened without following a symbolic link.
* :func:`write_atomically`: a 0600 temporary file beside the target, synced and renamed over it; :func:`clean`
  removes the temporaries a killed writer left (older than :data:`STALE` seconds).
* :func:`secret`: the folder's random key (``.secret``, 0600, made once), with which the query identities kept in
  the folder are hashed (:func:`keyed`): the unsalted SHA-256 of a query's words is matched against a public query
  list at once.

One WARNING per problem and process (:func:`warn_once`), never one per query.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import pathlib
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator

from ..errors import InputError
from ..prompts.files import not_yours, read_untrusted

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the rename alone keeps files whole
    fcntl = None  # type: ignore[assignment]

__all__ = ["usable", "make", "locked", "write_atomically", "clean", "secret", "keyed", "warn_once", "STALE"]

log = logging.getLogger("capcal_integrations")
STALE = 60.0  # seconds: a temporary file this old is a killed writer's (a write takes milliseconds)
_said: set[str] = set()  # the problems already warned about (one WARNING each per process)
_secrets: dict[str, bytes] = {}  # each folder's key, read once per process
_lock = threading.Lock()


def warn_once(what: str, message: str, *args: object) -> None:
    """``message`` at WARNING the first time ``what`` (a folder or file and its problem) is met in this process."""
    with _lock:
        if what in _said:
            return
        _said.add(what)
    log.warning(message, *args)


def forget_warnings(what: str) -> None:
    """``what`` may be warned about again (a file saved over: if it breaks again, that is news)."""
    with _lock:
        _said.discard(what)


def make(where: pathlib.Path) -> None:
    """``where`` made if missing, with every missing parent, each 0700 (the umask can only take more away)."""
    missing = []
    for folder in (where, *where.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)


def problem(where: pathlib.Path) -> str:
    """Why ``where`` cannot be the user's decisions folder (``""`` if it can, or does not exist)."""
    try:
        info = where.stat()
    except FileNotFoundError:
        return ""
    except OSError as err:
        return f"cannot look at it ({err.strerror or err})"
    if not where.is_dir():
        return "not a folder"
    return not_yours(info)


def usable(where: pathlib.Path, create: bool = False) -> bool:
    """Whether the decisions folder ``where`` may be used (and ``readings/`` in it, where it exists): made first if
    ``create`` (an error making it: ``False``, with one WARNING); else one WARNING per folder and process saying why
    not, and ``False``."""
    try:
        if create:
            make(where)
    except OSError as err:
        warn_once(f"{where}: make", "capcal: cannot make the decisions folder %s (%s); content decisions hold for this "
                  "process only (set CAPCAL_DECISIONS_DIR to a folder of yours, or =off)", where, err)
        return False
    for folder in (where, where / "readings"):
        why = problem(folder)
        if why:
            warn_once(f"{folder}: {why}", "capcal: the decisions folder %s is not used: it is %s, so another user could "
                      "steer the rankings through it; content decisions are kept in memory only (make it yours: chown "
                      "it and chmod 700 it, or set CAPCAL_DECISIONS_DIR to a folder of yours)", folder, why)
            return False
    return where.is_dir()


@contextlib.contextmanager
def locked(where: pathlib.Path) -> Iterator[None]:
    """The folder's writers' lock (``fcntl.flock`` on ``.lock``, never through a symbolic link); nothing where
    ``fcntl`` is missing."""
    if fcntl is None:
        yield
        return
    fd = os.open(where / ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def write_atomically(path: pathlib.Path, text: str) -> None:
    """``text`` in ``path`` (0600), whole or not at all: a temporary file beside it, synced, renamed over it."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def clean(where: pathlib.Path, now: float | None = None) -> list[pathlib.Path]:
    """Remove the temporary files (``.*.tmp``) older than :data:`STALE` that killed writers left in ``where`` and
    its ``readings/`` (under the writers' lock: a live writer's is seconds old at most); those removed."""
    now = time.time() if now is None else now
    gone = []
    for folder in (where, where / "readings"):
        with contextlib.suppress(OSError):
            for path in folder.glob(".*.tmp"):
                with contextlib.suppress(OSError):
                    if now - path.lstat().st_mtime > STALE:
                        path.unlink()
                        gone.append(path)
    return gone


def secret(where: pathlib.Path) -> bytes | None:
    """The folder's random key (``.secret``, 0600): made once, by whichever process comes first (written whole,
    then linked into place: never half a key), read once per process; ``None`` where there is none to be had."""
    with _lock:
        known = _secrets.get(str(where))
    if known is not None:
        return known
    path = where / ".secret"
    try:
        if not path.exists():
            fd, temporary = tempfile.mkstemp(prefix=".secret.", suffix=".tmp", dir=where)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(secrets.token_hex(32) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                with contextlib.suppress(FileExistsError):
                    os.link(temporary, path)  # fails if another process made it first: theirs is the key
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
        text = read_untrusted(path, 1024, own=True).strip()
        if len(text) < 32:
            raise InputError("too short to be a key")
    except (OSError, InputError) as err:
        warn_once(f"{path}: secret", "capcal: cannot use the key %s of the decisions folder (%s); the check's readings "
                  "are not kept across processes (capcal decisions forget --all, or delete that file)", path, err)
        return None
    key = text.encode()
    with _lock:
        _secrets[str(where)] = key
    return key


def keyed(key: bytes, identity: str) -> str:
    """A query's identity as the folder keeps it: HMAC-SHA-256 under the folder's key (64 hex digits)."""
    return hmac.new(key, identity.encode(), hashlib.sha256).hexdigest()
