"""Benchmark data in the shared format, and TREC run files.

A dataset directory holds ``candidates.jsonl.gz`` (one query per line with its first-stage candidates,
best first) and ``qrels.txt`` (``qid 0 docid grade``). Records follow ir_measures' NamedTuples, so they
can be handed to it directly.
"""

from __future__ import annotations

import gzip
import json
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import InputError
from ..types import Document

__all__ = ["Qrel", "ScoredDoc", "Candidate", "Topic", "Dataset", "load_dataset", "grade_map", "run_of", "write_run",
           "read_run"]


class Qrel(NamedTuple):
    """One relevance judgement (ir_measures' field names)."""

    query_id: str
    doc_id: str
    relevance: int


class ScoredDoc(NamedTuple):
    """One line of a run: higher ``score`` = ranked higher (ir_measures' field names)."""

    query_id: str
    doc_id: str
    score: float


@dataclass(frozen=True)
class Candidate:
    docid: str
    text: str
    title: str | None = None
    bm25_rank: int = 0
    bm25_score: float = 0.0

    def document(self) -> Document:
        return Document(self.text, self.docid, self.title or None)


@dataclass(frozen=True)
class Topic:
    """A query and its first-stage candidates in first-stage order."""

    qid: str
    query: str
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class Dataset:
    name: str
    topics: tuple[Topic, ...]
    qrels: tuple[Qrel, ...]

    def grades(self) -> dict[str, dict[str, int]]:
        """``{qid: {docid: grade}}``."""
        return grade_map(self.qrels)

    @property
    def rel_threshold(self) -> int:
        """The grade from which binary measures count a document relevant: 2 for graded TREC DL
        judgements (0-3), 1 for binary ones (BEIR)."""
        return 2 if any(q.relevance >= 2 for q in self.qrels) else 1

    def select(self, queries: int | None) -> Dataset:
        """The first ``queries`` topics (file order), with their qrels."""
        if queries is None or queries >= len(self.topics):
            return self
        topics = self.topics[:queries]
        keep = {t.qid for t in topics}
        return Dataset(self.name, topics, tuple(q for q in self.qrels if q.query_id in keep))


#: the layout a dataset directory must have, said by the error for one that lacks it
LAYOUT = ('Expected DIR/candidates.jsonl.gz (gzipped JSON lines: {"qid": ..., "query": ..., "candidates": '
          '[{"docid": ..., "text": ...}, ...]}, best first) and DIR/qrels.txt (lines: qid 0 docid grade)')


def load_dataset(path: str | pathlib.Path) -> Dataset:
    """Read a directory in the shared format. Topics without any judgement are kept (they count as
    zero in every measure, as trec_eval does not; ir_measures skips them) but logged by the caller."""
    root = pathlib.Path(path)
    cand_file, qrels_file = root / "candidates.jsonl.gz", root / "qrels.txt"
    for f in (cand_file, qrels_file):
        if not f.is_file():
            raise InputError(f"{root} is not a dataset in the shared format: missing {f.name}. {LAYOUT}")
    topics = []
    with gzip.open(cand_file, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            cands = tuple(
                Candidate(str(c["docid"]), c["text"], c.get("title"), int(c.get("bm25_rank", r + 1)),
                          float(c.get("bm25_score", 0.0)))
                for r, c in enumerate(row["candidates"]))
            topics.append(Topic(str(row["qid"]), row["query"], cands))
    qrels = []
    with open(qrels_file, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                qrels.append(Qrel(parts[0], parts[2], int(parts[3])))
    return Dataset(root.name, tuple(topics), tuple(qrels))


def run_of(qid: str, ranked: Sequence[str], rest: Iterable[str] = ()) -> list[ScoredDoc]:
    """A run for one query: ``ranked`` docids best first, then ``rest`` (e.g. the first-stage tail
    that was not reranked). Scores are ``n - rank``, so they strictly follow the order.

    >>> run_of("q", ["b", "a"], ["c"])
    [ScoredDoc(query_id='q', doc_id='b', score=3.0), ScoredDoc(query_id='q', doc_id='a', score=2.0), \
ScoredDoc(query_id='q', doc_id='c', score=1.0)]
    """
    seen = set(ranked)
    docids = list(ranked) + [d for d in rest if d not in seen]
    n = len(docids)
    return [ScoredDoc(qid, d, float(n - r)) for r, d in enumerate(docids)]


def write_run(path: str | pathlib.Path, run: Iterable[ScoredDoc], tag: str) -> None:
    """TREC run format: ``qid Q0 docid rank score tag`` (rank 1-based, per query by descending score)."""
    by_query: dict[str, list[ScoredDoc]] = {}
    for d in run:
        by_query.setdefault(d.query_id, []).append(d)
    tag = tag.replace(" ", "_") or "run"
    with open(path, "w", encoding="utf-8") as f:
        for qid, docs in by_query.items():
            for rank, d in enumerate(sorted(docs, key=lambda x: -x.score), 1):
                f.write(f"{qid} Q0 {d.doc_id} {rank} {d.score:g} {tag}\n")


def read_run(path: str | pathlib.Path) -> list[ScoredDoc]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5:
                out.append(ScoredDoc(parts[0], parts[2], float(parts[4])))
    return out


def grade_map(qrels: Iterable[Qrel]) -> dict[str, dict[str, int]]:
    """``{qid: {docid: grade}}``."""
    out: dict[str, dict[str, int]] = {}
    for q in qrels:
        out.setdefault(q.query_id, {})[q.doc_id] = q.relevance
    return out
