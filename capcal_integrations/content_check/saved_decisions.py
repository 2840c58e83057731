"""Content-check decisions kept across processes: one file per key in the user's cache folder.

A decision is about one key (:func:`~.content_check.decision_key`: the model's name, a fingerprint of its weights,
the reading options and the rule), so a restart on the same model and options ranks with it at once, with no
deciding prompt, and never with another model's. Where: ``$CAPCAL_DECISIONS_DIR``, else ``decisions/`` in the
cache folder of ``capcal serve`` (``$CAPCAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/capcal``, else
``~/.cache/capcal``), as the environment says when a reranker is made; ``CAPCAL_DECISIONS_DIR=off`` keeps
nothing. Only decisions about weights the server reports are kept (:func:`~.decision.kept`): a served name
alone is not the same model after a restart.

* Each file is ``<id>.json`` (``id``: the first 16 hex digits of the key's SHA-256), written whole to a temporary
  file beside it and renamed over it (``os.replace``): a reader sees the old decision or the new one, never half.
* Writers take an exclusive ``fcntl`` lock on ``.lock`` in the folder (readers need none: the rename is atomic);
  the folder is made 0700.
* A file is read as data: every field checked against its type (:meth:`~.content_decision.ContentDecision.from_json`)
  and its key against the one asked for. A file that does not pass is ignored, with one WARNING per file, and the
  check decides afresh (and saves over it).

A check still deciding keeps its readings beside them (:mod:`.saved_readings`), so the next process goes on
from there. ``capcal status`` (or ``capcal decisions``) lists both, ``capcal decisions forget`` deletes them
(:mod:`.decisions_command`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pathlib
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from . import saved_readings
from .contrast import Reading
from .decision import ContentDecision, Key, kept, key_id  # kept, key_id: re-exported (decision.py holds them)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the rename alone keeps files whole
    fcntl = None  # type: ignore[assignment]

__all__ = ["folder", "kept", "key_id", "Store", "Saved", "STORE", "write_atomically", "describe", "describe_progress"]

log = logging.getLogger("capcal_integrations")
FORMAT = 1  # the envelope's version ("capcal_saved_decision")
_warned: set[str] = set()  # files already warned about (one WARNING per file and process)
_warned_lock = threading.Lock()


def folder() -> pathlib.Path | None:
    """Where decisions are kept (module docstring); ``None`` with ``CAPCAL_DECISIONS_DIR=off``."""
    own = os.environ.get("CAPCAL_DECISIONS_DIR")
    if own:
        return None if own.strip().lower() == "off" else pathlib.Path(own).expanduser()
    if os.environ.get("CAPCAL_CACHE_DIR"):  # as capcal serve's cache_dir (server/models.py)
        return pathlib.Path(os.environ["CAPCAL_CACHE_DIR"]).expanduser() / "decisions"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache") / "capcal" / "decisions"


@dataclass(frozen=True)
class Saved:
    """One file of the store: its id and path, and the decision with when and how it was taken (``problem``: why
    the file cannot be used, the decision then ``None``)."""

    id: str
    path: pathlib.Path
    decision: ContentDecision | None
    saved_at: str = ""
    source: str = ""
    problem: str = ""


class Store:
    """The decisions of one folder (default: :func:`folder`, looked up at every call, so the environment can change
    it). ``load`` and ``save`` never raise for a file or folder they cannot use: a WARNING, and the check goes on
    without the store."""

    def __init__(self, where: str | os.PathLike[str] | None = None, *, off: bool = False) -> None:
        self._where = None if where is None else pathlib.Path(where)
        self._off = off

    @classmethod
    def here(cls) -> Store:
        """The store of :func:`folder` as it is now, kept: a reranker's, so that what its checks read and decide
        stays where it was when the reranker was made, whatever the environment says later (``off`` with
        ``CAPCAL_DECISIONS_DIR=off``)."""
        where = folder()
        return cls(where) if where is not None else cls(off=True)

    @property
    def folder(self) -> pathlib.Path | None:
        if self._off:
            return None
        return self._where if self._where is not None else folder()

    def load(self, key: Key) -> ContentDecision | None:
        """The saved decision of ``key``, or ``None`` (none saved, or a file that does not pass: one WARNING)."""
        where = self.folder
        if where is None or not kept(key):
            return None
        saved = self._read(where / f"{key_id(key)}.json")
        if saved is None:
            return None
        if saved.problem or saved.decision is None or saved.decision.key != key:
            _warn_once(saved.path, saved.problem or "it is about another key")
            return None
        log.info("capcal: the content decision saved %s (%s) is used: %s", saved.saved_at, saved.path, saved.decision)
        return saved.decision

    def save(self, decision: ContentDecision, source: str = "") -> pathlib.Path | None:
        """Keep ``decision`` for its key (atomically, under the folder's lock); its path, or ``None`` when not kept."""
        where = self.folder
        if where is None or not kept(decision.key):
            return None
        ident = key_id(decision.key)
        envelope = {"capcal_saved_decision": FORMAT, "id": ident, "source": source,
                    "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "decision": json.loads(decision.to_json())}
        path = where / f"{ident}.json"
        try:
            where.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._locked(where):
                write_atomically(path, json.dumps(envelope, indent=1) + "\n")
                saved_readings.drop(where, ident)  # decided: the readings are done with
        except OSError as err:
            log.warning("capcal: cannot save the content decision in %s (%s); it holds for this process only",
                        where, err)
            return None
        with _warned_lock:
            _warned.discard(str(path))
        log.debug("capcal: content decision saved in %s", path)
        return path

    def load_readings(self, key: Key) -> saved_readings.Progress | None:
        """The readings kept for ``key`` while its check decides, or ``None`` (none, or a file that does not pass:
        one WARNING)."""
        where = self.folder
        if where is None or not kept(key):
            return None
        progress = saved_readings.load(where, key_id(key))
        if progress is not None and (progress.problem or dict(progress.key) != dict(key)):
            _warn_once(progress.path, progress.problem or "it is about another key", "the check reads afresh")
            return None
        return progress

    def save_readings(self, key: Key, readings: Sequence[Reading], read: Sequence[str], e_value: float) -> None:
        """Keep a deciding check's readings (merged with another process's, under the folder's lock)."""
        where = self.folder
        if where is None or not kept(key):
            return
        ident = key_id(key)
        try:
            saved_readings.path(where, ident).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._locked(where):
                write_atomically(saved_readings.path(where, ident),
                                 saved_readings.merged(where, ident, key, readings, read, e_value))
        except OSError as err:
            log.warning("capcal: cannot keep the content check's readings in %s (%s); they hold for this process only",
                        where, err)

    def progress(self) -> list[saved_readings.Progress]:
        """Every check in progress kept in the folder (unusable files with their ``problem``), oldest first."""
        where = self.folder
        return [] if where is None else saved_readings.entries(where)

    def forget_readings(self, which: str | None) -> list[saved_readings.Progress]:
        """Delete the kept readings whose id or model starts with ``which`` (``None``: all); those deleted."""
        where = self.folder
        chosen = [p for p in self.progress() if which is None or p.id.startswith(which) or p.model == which]
        if chosen and where is not None:
            with self._locked(where):
                for p in chosen:
                    saved_readings.drop(where, p.id)
        return chosen

    def entries(self) -> list[Saved]:
        """Every file of the folder, read (unusable ones with their ``problem``), oldest first."""
        where = self.folder
        if where is None or not where.is_dir():
            return []
        found = [s for s in (self._read(p) for p in sorted(where.glob("*.json"))) if s is not None]
        return sorted(found, key=lambda s: s.saved_at)

    def forget(self, which: str | None) -> list[Saved]:
        """Delete the files whose id or model starts with ``which`` (``None``: all); the ones deleted. An
        :class:`~.errors.InputError` when ``which`` matches none."""
        where = self.folder
        chosen = [s for s in self.entries() if which is None or s.id.startswith(which)
                  or (s.decision is not None and dict(s.decision.key).get("model", "") == which)]
        if which is not None and not chosen:
            raise InputError(f"no saved content decision has the id or model {which!r} (capcal decisions lists them)")
        if chosen and where is not None:
            with self._locked(where):
                for s in chosen:
                    with contextlib.suppress(FileNotFoundError):
                        s.path.unlink()
        return chosen

    @staticmethod
    def _read(path: pathlib.Path) -> Saved | None:
        ident = path.stem
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as err:
            return Saved(ident, path, None, problem=f"cannot read it ({err})")
        try:
            envelope = json.loads(text)
            if not isinstance(envelope, dict) or envelope.get("capcal_saved_decision") != FORMAT:
                raise InputError(f"not a capcal saved decision (version {FORMAT})")
            when, source = envelope.get("saved_at", ""), envelope.get("source", "")
            if not (isinstance(when, str) and isinstance(source, str)):
                raise InputError("'saved_at' and 'source' must be text")
            decision = ContentDecision.from_json(json.dumps(envelope.get("decision")))
        except (ValueError, InputError) as err:
            return Saved(ident, path, None, problem=str(err))
        if key_id(decision.key) != ident:
            return Saved(ident, path, None, saved_at=when, source=source, problem="its key does not match its file name")
        return Saved(ident, path, decision, when, source)

    @staticmethod
    @contextlib.contextmanager
    def _locked(where: pathlib.Path) -> Iterator[None]:
        """The folder's writers' lock (``fcntl.flock`` on ``.lock``); nothing where ``fcntl`` is missing."""
        if fcntl is None:
            yield
            return
        fd = os.open(where / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def write_atomically(path: pathlib.Path, text: str) -> None:
    """``text`` in ``path``, whole or not at all: a temporary file beside it, synced, renamed over it."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def _warn_once(path: pathlib.Path, problem: str, then: str = "the check decides afresh") -> None:
    with _warned_lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    log.warning("capcal: the saved file %s is ignored (%s); %s and saves over it (capcal decisions forget removes "
                "it)", path, problem, then)


#: The store of :func:`folder`, looked up at every call (the commands'; a reranker keeps :meth:`Store.here`).
STORE = Store()


def describe(saved: Saved) -> dict[str, Any]:
    """One saved decision as a listing shows it: id, model, what else its key holds, verdict, source, when."""
    d = saved.decision
    key = dict(d.key) if d is not None else {}
    rest = {k: v for k, v in key.items() if k not in ("model", "weights")}
    summary = ", ".join(f"{k}={v}" for k, v in rest.items() if k in ("template", "prompt", "rule", "window"))
    return {"id": saved.id, "model": key.get("model", "?"), "weights": key.get("weights", ""), "key": summary,
            "verdict": d.verdict if d is not None else f"unusable: {saved.problem}", "source": saved.source,
            "saved_at": saved.saved_at, "lists": d.lists if d is not None else None, "path": str(saved.path)}


def describe_progress(progress: saved_readings.Progress) -> dict[str, Any]:
    """A check in progress as a listing shows it, in :func:`describe`'s columns."""
    key = dict(progress.key)
    summary = ", ".join(f"{k}={v}" for k, v in key.items() if k in ("template", "prompt", "rule", "window"))
    verdict = (f"deciding: {len(progress.readings)} queries read, e = {progress.e_value:.3g}" if not progress.problem
               else f"unusable: {progress.problem}")
    return {"id": progress.id, "model": key.get("model", "?"), "weights": key.get("weights", ""), "key": summary,
            "verdict": verdict, "source": "check in progress", "saved_at": progress.saved_at,
            "lists": len(progress.readings), "path": str(progress.path)}
