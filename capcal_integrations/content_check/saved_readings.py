"""A content check's readings kept across processes until it decides: one file per key, beside the decisions.

The check needs a median of 8-15 queries to decide, minutes a query on a CPU server; a script that ranks a few
lists and exits would otherwise start every run at "0 queries read" and never decide. So each query read is kept
under ``readings/<id>.json`` in the decisions folder (:func:`~.saved_decisions.folder`; ``id``: the key's, as
:func:`~.decision.key_id`), and the next process's check on the same key goes on from there. The file goes
once the key has a decision (the decision's own file then holds what matters).

* What is kept: each query's reading (its first-step log-probabilities by slot, :class:`~.contrast.Reading`) and
  its identity (:func:`~.content_check.query_identity`: a SHA-256 of the query's words, never the words, hashed
  again under the folder's random key, :func:`~.saved_folder.keyed`, so the file does not say which public queries
  were asked), so a query read in one process is not read, and counted, again in the next (the null suite's repeated
  queries), plus the evidence so far for ``capcal status``. Version 1 files held unkeyed identities: they are not
  read (their queries would count twice).
* Processes reading at once: a save merges under the folder's lock (a query already in the file is not added
  twice), written whole and renamed over the old file (``Store.save_readings``).
* A file is input, not trust (:func:`~.prompts.files.read_untrusted`): only a regular file of the user's, at most
  :data:`MAX_BYTES` read (counted as read, not as ``stat`` says), decoded with its errors caught, every field
  type-checked, each reading's shape checked; a file that does not pass is ignored with one WARNING and the check
  reads afresh (and saves over it). The readings of a key decided meanwhile are not listed nor kept
  (``Store.progress``, ``Store.save_readings``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import pathlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..prompts.files import read_untrusted
from .contrast import Reading

__all__ = ["Progress", "load", "merged", "path", "drop", "entries", "FORMAT", "MAX_BYTES"]

log = logging.getLogger("capcal_integrations")
FORMAT = 2  # the envelope's version ("capcal_check_readings"; 2: query identities keyed per folder)
MAX_BYTES = 8 << 20  # a file larger than this is not read (a 40-query check of 20-passage lists is ~100 KiB)
_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Progress:
    """One key's check in progress as kept: its readings and their queries' identities (one each, in the order
    read), the evidence when last saved (``queries``, ``e_value``), when, and ``problem`` (why the file cannot be
    used; the rest then empty)."""

    id: str
    path: pathlib.Path
    key: tuple[tuple[str, str], ...] = ()
    readings: tuple[Reading, ...] = ()
    read: tuple[str, ...] = ()
    e_value: float = 1.0
    saved_at: str = ""
    problem: str = ""

    @property
    def model(self) -> str:
        return dict(self.key).get("model", "?")


def _folder(where: pathlib.Path) -> pathlib.Path:
    return where / "readings"


def load(where: pathlib.Path, ident: str) -> Progress | None:
    """The kept readings of the key ``ident`` in the decisions folder ``where``; ``None`` when none are kept."""
    file = path(where, ident)
    try:
        text = read_untrusted(file, MAX_BYTES, own=True)
    except FileNotFoundError:
        return None
    except InputError as err:
        return Progress(ident, file, problem=str(err))
    try:
        return _parse(ident, file, json.loads(text))
    except (ValueError, TypeError, RecursionError, InputError) as err:
        return Progress(ident, file, problem=str(err) or type(err).__name__)


def _parse(ident: str, file: pathlib.Path, data: Any) -> Progress:
    if not isinstance(data, dict) or data.get("capcal_check_readings") != FORMAT:
        raise InputError(f"not a capcal check's readings (version {FORMAT})")
    key, rows, when, e = data.get("key"), data.get("readings"), data.get("saved_at", ""), data.get("e_value", 1.0)
    if not (isinstance(key, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in key.items())):
        raise InputError("'key' must be an object of text")
    if not isinstance(rows, list) or not isinstance(when, str) or not _number(e) or e < 0:
        raise InputError("'readings' must be a list, 'saved_at' text and 'e_value' a number >= 0")
    readings, read = [], []
    for row in rows:
        if not isinstance(row, dict) or not (isinstance(row.get("query"), str) and _HEX.fullmatch(row["query"])):
            raise InputError("each reading needs its query's identity (64 hex digits)")
        slots, empty = row.get("slots"), row.get("empty")
        if not (isinstance(slots, list) and all(_vector(s) for s in slots) and (empty is None or _vector(empty))):
            raise InputError("a reading's 'slots' must be lists of finite numbers ('empty' one list or null)")
        readings.append(Reading(tuple(tuple(float(x) for x in s) for s in slots),
                                None if empty is None else tuple(float(x) for x in empty)))
        read.append(row["query"])
    if len(set(read)) != len(read):
        raise InputError("a query is read twice")
    return Progress(ident, file, tuple(key.items()), tuple(readings), tuple(read), float(e), when)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _vector(xs: Any) -> bool:
    return isinstance(xs, list) and all(_number(x) for x in xs)


def _row(query: str, reading: Reading) -> dict[str, Any]:
    return {"query": query, "slots": [list(s) for s in reading.slots],
            "empty": None if reading.empty is None else list(reading.empty)}


def path(where: pathlib.Path, ident: str) -> pathlib.Path:
    """The file of the key ``ident``'s readings in the decisions folder ``where``."""
    return _folder(where) / f"{ident}.json"


def merged(where: pathlib.Path, ident: str, key: Sequence[tuple[str, str]], readings: Sequence[Reading],
           read: Sequence[str], e_value: float) -> str:
    """The file's new text: ``readings`` (of the queries ``read``), then what another process kept meanwhile (its
    queries not in ``read``). Read under the folder's lock by the writer (:class:`~.saved_decisions.Store`)."""
    before = load(where, ident)
    rows = [_row(q, r) for q, r in zip(read, readings)]
    if before is not None and not before.problem and dict(before.key) == dict(key):
        ours = set(read)
        rows += [_row(q, r) for q, r in zip(before.read, before.readings) if q not in ours]
    return json.dumps({"capcal_check_readings": FORMAT, "id": ident, "key": dict(key), "e_value": e_value,
                       "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "readings": rows}) + "\n"


def drop(where: pathlib.Path, ident: str) -> None:
    """Forget the kept readings of the key ``ident`` (decided, or forgotten by the user)."""
    with contextlib.suppress(FileNotFoundError):
        path(where, ident).unlink()


def entries(where: pathlib.Path) -> list[Progress]:
    """Every check in progress kept in the decisions folder ``where``, read (unusable ones with their problem)."""
    folder = _folder(where)
    if not folder.is_dir() or folder.is_symlink():
        return []
    found = [p for p in (load(where, f.stem) for f in sorted(folder.glob("*.json"))) if p is not None]
    return sorted(found, key=lambda p: p.saved_at)
