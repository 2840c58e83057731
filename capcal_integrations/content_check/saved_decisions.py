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
* Writers take an exclusive ``fcntl`` lock on ``.lock`` in the folder (readers need none: the rename is atomic).
* The folder is the user's (:mod:`.saved_folder`): made 0700, files 0600, and not used at all (decisions kept in
  memory, one WARNING) where another user owns it or could write it.
* A file is input, not trust: only a regular file of the user's, at most :data:`~.prompts.files.DECISION_BYTES`
  read, decoded with its errors caught (:func:`~.prompts.files.read_untrusted`: a FIFO cannot hang a ranking, a
  symbolic link to ``/dev/zero`` cannot fill memory), every field checked against its type and range
  (:meth:`~.content_decision.ContentDecision.from_json`) and its key against the one asked for. A file that does not
  pass is ignored, with one WARNING per file, and the check decides afresh (and saves over it).

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
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError
from ..prompts.files import DECISION_BYTES, read_untrusted
from . import saved_folder, saved_readings
from .contrast import Reading
from .decision import ContentDecision, Key, kept, key_id  # kept, key_id: re-exported (decision.py holds them)
from .saved_folder import write_atomically  # re-exported (batch files are written so too)

__all__ = ["folder", "kept", "key_id", "Store", "Saved", "STORE", "write_atomically", "chosen"]

log = logging.getLogger("capcal_integrations")
FORMAT = 1  # the envelope's version ("capcal_saved_decision")
MIN_PREFIX = 8  # the fewest characters of an id that ``forget`` takes (``forget 4`` deleted every id starting so)


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
        if where is None or not kept(key) or not saved_folder.usable(where):
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
        if not saved_folder.usable(where, create=True):
            return None
        try:
            with saved_folder.locked(where):
                saved_folder.clean(where)
                write_atomically(path, json.dumps(envelope, indent=1) + "\n")
                saved_readings.drop(where, ident)  # decided: the readings are done with
        except OSError as err:
            saved_folder.warn_once(f"{where}: save", "capcal: cannot save content decisions in %s (%s); they hold for "
                                   "this process only", where, err)
            return None
        saved_folder.forget_warnings(str(path))
        log.debug("capcal: content decision saved in %s", path)
        return path

    def load_readings(self, key: Key) -> saved_readings.Progress | None:
        """The readings kept for ``key`` while its check decides, or ``None`` (none, or a file that does not pass:
        one WARNING)."""
        where = self.folder
        if where is None or not kept(key) or not saved_folder.usable(where):
            return None
        progress = saved_readings.load(where, key_id(key))
        if progress is not None and (progress.problem or dict(progress.key) != dict(key)):
            _warn_once(progress.path, progress.problem or "it is about another key", "the check reads afresh")
            return None
        return progress

    def save_readings(self, key: Key, readings: Sequence[Reading], read: Sequence[str], e_value: float) -> None:
        """Keep a deciding check's readings (merged with another process's, under the folder's lock)."""
        where = self.folder
        if where is None or not kept(key) or not saved_folder.usable(where, create=True) or self._key(where) is None:
            return
        ident = key_id(key)
        try:
            saved_folder.make(saved_readings.path(where, ident).parent)
            with saved_folder.locked(where):
                saved_folder.clean(where)
                if self._decided(where, ident):  # another process decided meanwhile: its readings are done with
                    saved_readings.drop(where, ident)
                    return
                write_atomically(saved_readings.path(where, ident),
                                 saved_readings.merged(where, ident, key, readings, read, e_value))
        except OSError as err:
            saved_folder.warn_once(f"{where}: save readings", "capcal: cannot keep the content check's readings in %s "
                                   "(%s); they hold for this process only", where, err)

    def keyed(self, identity: str) -> str:
        """A query's identity (:func:`~.check.query_identity`) as this store keeps it: hashed under the folder's
        random key (:func:`~.saved_folder.secret`), so the folder's readings do not say which public queries were
        asked; unchanged where nothing is kept."""
        where = self.folder
        key = self._key(where) if where is not None and saved_folder.usable(where) else None
        return identity if key is None else saved_folder.keyed(key, identity)

    @staticmethod
    def _key(where: pathlib.Path) -> bytes | None:
        return saved_folder.secret(where) if where.is_dir() else None

    def _decided(self, where: pathlib.Path, ident: str) -> bool:
        """Whether the folder holds a usable decision of the key ``ident`` that its readings cannot change (one not
        undecided: an undecided one is read on by a larger ``check_lists``)."""
        saved = self._read(where / f"{ident}.json")
        return saved is not None and saved.decision is not None and saved.decision.verdict != "undecided"

    def progress(self) -> list[saved_readings.Progress]:
        """Every check in progress kept in the folder (unusable files with their ``problem``), oldest first; not
        the readings of a key decided meanwhile (:meth:`_decided`: a slower process's, written after the decision)."""
        where = self.folder
        if where is None:
            return []
        return [p for p in saved_readings.entries(where) if p.problem or not self._decided(where, p.id)]

    def problem(self) -> str:
        """Why the folder is not used (``""``: it is, or it does not exist): for ``capcal status``."""
        where = self.folder
        return "" if where is None else saved_folder.problem(where) or saved_folder.problem(where / "readings")

    def forget_readings(self, which: str | None) -> list[saved_readings.Progress]:
        """Delete the kept readings :func:`chosen` by ``which`` (``None``: all); those deleted."""
        where = self.folder
        ids = chosen(self, which) if which is not None else None
        gone = [p for p in (saved_readings.entries(where) if where is not None else []) if ids is None or p.id in ids]
        if gone and where is not None:
            with saved_folder.locked(where):
                for p in gone:
                    saved_readings.drop(where, p.id)
        return gone

    def entries(self) -> list[Saved]:
        """Every file of the folder, read (unusable ones with their ``problem``), oldest first."""
        where = self.folder
        if where is None or not where.is_dir():
            return []
        found = [s for s in (self._read(p) for p in sorted(where.glob("*.json"))) if s is not None]
        return sorted(found, key=lambda s: s.saved_at)

    def forget(self, which: str | None) -> list[Saved]:
        """Delete the files :func:`chosen` by ``which`` (``None``: all); the ones deleted. An
        :class:`~.errors.InputError` when ``which`` matches none."""
        where = self.folder
        ids = chosen(self, which) if which is not None else None
        gone = [s for s in self.entries() if ids is None or s.id in ids]
        if which is not None and not gone:
            raise InputError(f"no saved content decision has the id or model {which!r} (capcal decisions lists them)")
        if gone and where is not None:
            with saved_folder.locked(where):
                for s in gone:
                    with contextlib.suppress(FileNotFoundError):
                        s.path.unlink()
        return gone

    @staticmethod
    def _read(path: pathlib.Path) -> Saved | None:
        ident = path.stem
        try:
            text = read_untrusted(path, DECISION_BYTES, own=True)
        except FileNotFoundError:
            return None
        except InputError as err:
            return Saved(ident, path, None, problem=str(err))
        try:
            envelope = json.loads(text)
            if not isinstance(envelope, dict) or envelope.get("capcal_saved_decision") != FORMAT:
                raise InputError(f"not a capcal saved decision (version {FORMAT})")
            when, source = envelope.get("saved_at", ""), envelope.get("source", "")
            if not (isinstance(when, str) and isinstance(source, str)):
                raise InputError("'saved_at' and 'source' must be text")
            decision = ContentDecision.from_json(json.dumps(envelope.get("decision")))
        except (ValueError, RecursionError, InputError) as err:
            return Saved(ident, path, None, problem=str(err) or type(err).__name__)
        if key_id(decision.key) != ident:
            return Saved(ident, path, None, saved_at=when, source=source, problem="its key does not match its file name")
        return Saved(ident, path, decision, when, source)


def chosen(store: Store, which: str) -> set[str]:
    """The ids ``which`` names among the store's decisions and checks in progress: a whole id, a model's name (all
    of its), or a prefix of at least :data:`MIN_PREFIX` characters that only one id has; an
    :class:`~.errors.InputError` listing the matches for a shorter or an ambiguous prefix (nothing is deleted)."""
    where = store.folder
    rows = [(s.id, dict(s.decision.key).get("model", "") if s.decision is not None else "") for s in store.entries()]
    rows += [(p.id, p.model) for p in (saved_readings.entries(where) if where is not None else [])]
    exact = {i for i, model in rows if which in (i, model)}
    if exact:
        return exact
    starting = sorted({i for i, _ in rows if i.startswith(which)})
    if len(starting) == 1 and len(which) >= MIN_PREFIX:
        return set(starting)
    if starting:
        raise InputError(f"{which!r} is {'too short' if len(which) < MIN_PREFIX else 'ambiguous'}: it starts "
                         f"{', '.join(starting)}; give a whole id, or at least {MIN_PREFIX} characters of one id "
                         "(nothing was forgotten)")
    return set()


def _warn_once(path: pathlib.Path, problem: str, then: str = "the check decides afresh") -> None:
    saved_folder.warn_once(str(path), "capcal: the saved file %s is ignored (%s); %s and saves over it (capcal "
                           "decisions forget removes it)", path, problem, then)


#: The store of :func:`folder`, looked up at every call (the commands'; a reranker keeps :meth:`Store.here`).
STORE = Store()
