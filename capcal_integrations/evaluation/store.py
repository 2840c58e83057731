"""A resumable record store: one JSON object per line, keyed by (kind, method key, qid, variant).

Every finished reranking is appended (and flushed) at once, so an interrupted run loses at most the
reranking in flight; on restart the file is read back and finished work is skipped. Failed attempts
are not stored (they are retried on the next run) but are counted in the log.
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["Store", "record_key"]

Key = tuple[str, str, str, str]


def record_key(kind: str, method: str, qid: str, variant: object = "") -> Key:
    """``variant`` tells apart several rerankings of one query: a shuffle index or a needle position."""
    return (kind, method, qid, "" if variant is None else str(variant))


class Store:
    """Records of one evaluation output directory (``records.jsonl``)."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._records: dict[Key, dict[str, Any]] = {}
        if self.path.is_file():
            with open(self.path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    try:
                        rec = json.loads(line)
                    except ValueError:  # a line cut short by a kill: the reranking runs again
                        log.warning("%s:%d: skipping an unreadable line", self.path, n)
                        continue
                    self._records[self._key(rec)] = rec

    @staticmethod
    def _key(rec: Mapping[str, Any]) -> Key:
        return record_key(rec["kind"], rec["method"], rec["qid"], rec.get("variant", ""))

    def __contains__(self, key: Key) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: Key) -> dict[str, Any] | None:
        return self._records.get(key)

    def add(self, rec: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
            f.flush()
        self._records[self._key(rec)] = rec

    def select(self, kind: str, method: str | None = None) -> Iterator[dict[str, Any]]:
        """Records of one kind (and method key), in insertion order."""
        for rec in self._records.values():
            if rec["kind"] == kind and (method is None or rec["method"] == method):
                yield rec
