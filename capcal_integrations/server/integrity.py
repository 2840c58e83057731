"""Cache entries that are whole, built by one process at a time, and checked by content before use.

The model cache (:mod:`.models`: assembled GGUF files; :mod:`.vllm`: their Hugging Face conversions)
is shared by every process of the user. Two of them may build the same entry at once, a kill may stop
one half-way, a disk or a careless hand may change a file. So:

* :func:`file_lock` holds an exclusive ``flock`` on a lock file beside the entry while it is checked
  and built: a second builder waits, then finds the first one's result;
* an entry is built under a temporary name and renamed into place only when complete, so a reader
  sees the old entry or the new one, never a mix;
* :func:`sha256_file` checks files by content, once per process and file state (path, size, mtime,
  inode): hashing the 491 MB model takes a couple of seconds, paid once, not at every call;
* a converted folder carries a marker that records the sha256 of its source and of every file in it
  (:func:`write_marker`); :func:`marker_problem` says what no longer matches.

Limits: this protects against accidents and concurrent builders, not against someone who can write
to the cache folder (they could rewrite a marker too). ``flock`` is advisory and may not work on
some network file systems.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pathlib
from collections.abc import Iterator

log = logging.getLogger(__name__)

__all__ = ["file_lock", "sha256_file", "remember_sha256", "tree_sha256", "write_marker", "marker_problem", "MARKER"]

#: The file that marks a finished conversion; it lists what the folder must hold.
MARKER = ".complete"
_MARKER_FORMAT = 1

# (path, size, mtime_ns, inode, device) -> sha256: what this process has already hashed
_hashed: dict[tuple[str, int, int, int, int], str] = {}


def _state(path: pathlib.Path, st: os.stat_result) -> tuple[str, int, int, int, int]:
    return (str(path.absolute()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _digest(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: pathlib.Path) -> str:
    """The sha256 of ``path``, hashed once per process for a given state of the file (a changed
    size, mtime or inode hashes it again). Raises ``OSError`` if it cannot be read."""
    before = path.stat()
    key = _state(path, before)
    if key in _hashed:
        return _hashed[key]
    digest = _digest(path)
    if _state(path, path.stat()) == key:  # not remembered if the file changed while it was read
        _hashed[key] = digest
    return digest


def remember_sha256(path: pathlib.Path, digest: str) -> None:
    """Record that ``path`` (as it is now) has sha256 ``digest``: for a file this process just wrote and
    hashed while writing it."""
    _hashed[_state(path, path.stat())] = digest


@contextlib.contextmanager
def file_lock(target: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive lock on ``target``'s cache entry (``<target>.lock`` beside it) for the block.

    The lock file is removed on release, so the cache holds no litter. A waiter may then hold a lock
    on a file that is no longer there; it checks, after locking, that the path still names the file
    it locked, and starts over if not.
    """
    path = target.with_name(target.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for another process that is building %s", target)
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # the holder before us removed that file: lock the current one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # while still locked: a waiter on this file sees it is gone and starts over
        os.close(fd)


def tree_sha256(folder: pathlib.Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` except the marker. A symbolic link
    or other non-regular entry is listed as such, so it never matches a recorded hash."""
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(folder):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(root, d)))]:
            path = pathlib.Path(root, name)
            rel = path.relative_to(folder).as_posix()
            if rel == MARKER:
                continue
            out[rel] = sha256_file(path) if path.is_file() and not path.is_symlink() else "not a regular file"
    return out


def write_marker(folder: pathlib.Path, source: pathlib.Path, source_sha256: str) -> None:
    """Mark ``folder`` (converted from ``source``) complete: the sha256 of the source and of every file."""
    marker = {"format": _MARKER_FORMAT, "source": source.name, "source_sha256": source_sha256,
              "files": tree_sha256(folder)}
    (folder / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")


def marker_problem(folder: pathlib.Path, source_sha256: str) -> str | None:
    """None if ``folder`` is a complete conversion of the source with sha256 ``source_sha256`` and holds
    exactly the files its marker lists, with their recorded sha256; else what is wrong, for the log."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except FileNotFoundError:
        return "no completion marker" if folder.exists() else "absent"
    except (OSError, ValueError) as err:
        return f"unreadable completion marker ({err})"
    if not isinstance(marker, dict) or marker.get("format") != _MARKER_FORMAT or not isinstance(marker.get("files"), dict):
        return "completion marker of an unknown format"
    if marker.get("source_sha256") != source_sha256:
        return f"converted from another file (sha256 {marker.get('source_sha256')}, expected {source_sha256})"
    try:
        found = tree_sha256(folder)
    except OSError as err:
        return f"unreadable ({err})"
    recorded: dict[str, str] = marker["files"]
    if extra := sorted(set(found) - set(recorded)):
        return f"files the conversion did not write: {', '.join(extra[:5])}"
    if missing := sorted(set(recorded) - set(found)):
        return f"missing files: {', '.join(missing[:5])}"
    if changed := sorted(k for k in recorded if found[k] != recorded[k]):
        return f"files whose sha256 changed: {', '.join(changed[:5])}"
    return None
