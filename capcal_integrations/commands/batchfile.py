"""The batch's files (:mod:`.batch`): the lists of its input, what identifies each across runs, its output
lines, and which lists an output already holds.

A list is known by its identity, never by its line number: its ``qid``, else a hash of its query and
passages (:func:`list_hash`; the k-th of identical lists without a qid is told apart by ``copy``). An input
that changed under its output is refused (:func:`pending`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..types import Ranking

__all__ = ["read_rows", "rows_of", "list_hash", "identities", "pending", "record", "finished"]

log = logging.getLogger(__name__)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lists of a JSONL file, one ``{"query": ..., "passages": [...]}`` (``candidates`` also
    accepted, an optional ``qid``) per non-empty line; each gets ``line``, its 0-based line number."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as err:
                    raise InputError(f"{path}:{number + 1}: not a JSON line ({err})") from None
                rows.append(_checked_row(row, f"{path}:{number + 1}", number))
    return rows


def _checked_row(row: Any, where: str, line: int) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise InputError(f"{where}: expected a JSON object with 'query' and 'passages'")
    row = dict(row)
    row.setdefault("passages", row.get("candidates"))
    if not isinstance(row.get("query"), str) or not isinstance(row.get("passages"), (list, tuple)):
        raise InputError(f"{where}: every list needs 'query' (text) and 'passages' (a list)")
    row["passages"] = list(row["passages"])
    row.setdefault("line", line)
    return row


def list_hash(row: Mapping[str, Any]) -> str:
    """What a list is, whatever line it is on: a hash of its query and passages.

    >>> list_hash({"query": "q", "passages": ["a", "b"]}) == list_hash({"line": 7, "query": "q", "passages": ["a", "b"]})
    True
    """
    text = json.dumps([row["query"], list(row["passages"])], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def identities(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """What identifies each list across runs: ``("qid", qid)``, else ``("list", its hash, k)`` for the k-th list
    with that content (identical lists without a qid are told apart by their order among themselves)."""
    seen: dict[str, int] = {}
    out: list[tuple[Any, ...]] = []
    for row in rows:
        if "qid" in row:
            out.append(("qid", row["qid"]))
        else:
            h = list_hash(row)
            out.append(("list", h, seen.get(h, 0)))
            seen[h] = seen.get(h, 0) + 1
    return out


def pending(rows: Sequence[Mapping[str, Any]], done: Mapping[tuple[Any, ...], str]) -> list[Mapping[str, Any]]:
    """The ``rows`` that ``done`` (:func:`finished`: identity -> list hash) does not hold; an :class:`InputError`
    when the input changed under the output: a list the output holds is not in the input, or a ``qid``'s list
    is not the one the output ranked."""
    keys = identities(rows)
    if len(set(keys)) < len(keys):
        raise InputError("two lists share a qid: a resumed run could not tell them apart")
    changed = [key for key, row in zip(keys, rows) if key in done and done[key] != list_hash(row)]
    gone = [key for key in done if key not in set(keys)]
    if changed or gone:
        first = (changed or gone)[0]
        what = f"qid {first[1]!r}" if first[0] == "qid" else f"the list with hash {first[1]}"
        raise InputError(f"the input changed since the output was written ({len(changed)} list(s) with another content "
                         f"under their qid, {len(gone)} list(s) of the output no longer in the input; first: {what}); "
                         "restore the input, or give another output")
    return [row for row, key in zip(rows, keys) if key not in done]


def record(row: Mapping[str, Any], ranking: Ranking, top_n: int | None = None) -> dict[str, Any]:
    """The output line of one list (the shape ``capcal rerank`` writes, plus ``line``, and what identifies the
    list on a resumed run: ``list_hash``, ``copy`` for an identical list without a qid, and ``qid``)."""
    ranked = [{"index": i, "score": ranking.scores[i], "passage": row["passages"][i]} for i in ranking.order]
    out = {"query": row["query"], "method": ranking.method, "order": list(ranking.order),
           "ranked": ranked[:top_n] if top_n else ranked, "requests": ranking.usage.requests,
           "upper_bounds": ranking.upper_bounds, "line": row["line"], "list_hash": list_hash(row)}
    if ranking.notes:
        out["notes"] = list(ranking.notes)
    if row.get("copy"):
        out["copy"] = row["copy"]
    if "qid" in row:
        out["qid"] = row["qid"]
    return out


def finished(output: str | os.PathLike[str]) -> dict[tuple[Any, ...], str]:
    """The lists ``output`` already holds: identity (:func:`identities`) -> list hash. A torn last line (a run
    stopped mid-write) is cut off the file, so that the next line starts clean; any other unreadable line
    (or one without a list hash: an older version's, resumed by line number) is an :class:`InputError`."""
    path = Path(output)
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning("batch: %s ends in a torn line (%d bytes): cut off, its list is ranked again", path, len(data) - end)
        with open(path, "r+b") as f:
            f.truncate(end)
    done = {}
    for number, line in enumerate(data[:end].decode("utf-8").splitlines()):
        try:
            row = json.loads(line)
            h = row["list_hash"]
            done[("qid", row["qid"]) if "qid" in row else ("list", h, row.get("copy", 0))] = h
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}:{number + 1} is not a line this batch wrote (or an older version's, which "
                             "resumed by line number); give another --output") from None
    return done


def rows_of(source: Any) -> list[dict[str, Any]]:
    """The lists of a JSONL path, a Ray Dataset (``iter_rows``) or an iterable of mappings, in order.
    A Dataset's rows need a ``qid``: Ray Data does not promise an order, so a row number would not
    name the same list in the next run."""
    if isinstance(source, (str, os.PathLike)):
        return read_rows(source)
    dataset = hasattr(source, "iter_rows")
    rows = [_checked_row(row, f"row {k}", k) for k, row in enumerate(source.iter_rows() if dataset else source)]
    if dataset and not all("qid" in row for row in rows):
        raise InputError("every row of a Ray Dataset needs a 'qid' (its order may change between runs, so a row "
                         "number could not say which lists a resumed run has done)")
    return rows
