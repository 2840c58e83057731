"""The judged-query files ``capcal decide`` reads, each as ``(query, passages, grades)`` triples:

* ``beir``: a BEIR folder as BEIR ships it (``corpus.jsonl``: ``{"_id", "title", "text"}``; ``queries.jsonl``:
  ``{"_id", "text"}``; ``qrels/test.tsv``: ``query-id corpus-id score`` under a header line), each query's
  candidates from a TREC run file (``--run``) or BM25 over the corpus (:func:`bm25_run`);
* ``trec``: a TREC run (``qid Q0 docid rank score tag``) and qrels (``qid 0 docid grade``), the passages from
  a corpus and the questions from a queries file (BEIR's JSONL or ``id<TAB>text`` lines);
* ``judged``: JSONL, one ``{"query": ..., "passages": [...], "grades": [...]}`` per line (``capcal label``
  writes it; a passage is a string or ``{"text", "title"?, "id"?}``).

A malformed file is an :class:`~capcal_integrations.errors.InputError` that names the file, the line and what
is wrong. Queries with no candidate graded above 0 are left out (they say nothing about an order).
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from ..errors import InputError
from ..types import Document

__all__ = ["read_judged", "read_trec", "read_beir", "read_run", "read_qrels", "bm25_run", "tokens"]

log = logging.getLogger(__name__)

Triples = list[tuple[str, list[Any], list[int]]]


def _lines(path: str | pathlib.Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a text file's non-blank lines; a missing file is an InputError."""
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield n, line.rstrip("\n")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _bad(path: Any, n: int, what: str) -> InputError:
    return InputError(f"{path}, line {n}: {what}")


def _json_lines(path: str | pathlib.Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, line in _lines(path):
        try:
            value = json.loads(line)
        except ValueError as err:
            raise _bad(path, n, f"not JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(value, dict):
            raise _bad(path, n, f"expected a JSON object, got {type(value).__name__}")
        yield n, value


def _grade(path: Any, n: int, raw: str) -> int:
    try:
        grade = int(raw)
    except ValueError:
        raise _bad(path, n, f"the grade {raw!r} is not an integer") from None
    if grade < -1:
        raise _bad(path, n, f"the grade {raw!r} is below 0")
    return max(grade, 0)  # TREC's -1 (junk) counts as not relevant


def read_judged(path: str | pathlib.Path) -> Triples:
    """The triples of a JSONL file of ``{"query", "passages", "grades"}`` lines (a later line for the same query
    replaces an earlier one: a grading page's newest state; one whose ``"ungraded"`` list is not empty, a question
    still being graded, is left out)."""
    out: dict[str, tuple[str, list[Any], list[int]]] = {}
    pending: set[str] = set()
    for n, value in _json_lines(path):
        query, passages, grades = value.get("query"), value.get("passages"), value.get("grades")
        if not isinstance(query, str) or not query.strip():
            raise _bad(path, n, "\"query\" must be a non-empty string")
        if not isinstance(passages, list) or not isinstance(grades, list):
            raise _bad(path, n, "\"passages\" and \"grades\" must be lists")
        if len(passages) != len(grades):
            raise _bad(path, n, f"{len(passages)} passages but {len(grades)} grades")
        docs = []
        for i, p in enumerate(passages):
            if isinstance(p, str):
                docs.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                docs.append(Document(p["text"], str(p.get("id", "")) or None, p.get("title") or None))
            else:
                raise _bad(path, n, f"passage {i} must be a string or an object with \"text\"")
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in grades):
            raise _bad(path, n, f"grades must be integers >= 0, got {grades[:10]}")
        if value.get("ungraded"):
            out.pop(query, None)
            pending.add(query)
            continue
        pending.discard(query)
        out[query] = (query, docs, list(grades))
    if pending:
        log.info("%s: %d questions still being graded are left out", path, len(pending))
    return list(out.values())


def read_run(path: str | pathlib.Path, top: int | None = None) -> dict[str, list[str]]:
    """A TREC run (``qid Q0 docid rank score [tag]``): each query's doc ids best first (by score, ties in the
    file's order), the first ``top``."""
    scored: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for n, line in _lines(path):
        parts = line.split()
        if len(parts) not in (5, 6):
            raise _bad(path, n, f"expected 'qid Q0 docid rank score tag' (6 fields), got {len(parts)} fields")
        try:
            score = float(parts[4])
            int(parts[3])
        except ValueError:
            raise _bad(path, n, f"rank {parts[3]!r} must be an integer and score {parts[4]!r} a number") from None
        scored[parts[0]].append((-score, n, parts[2]))
    return {qid: [d for _, _, d in sorted(rows)][:top] for qid, rows in scored.items()}


def read_qrels(path: str | pathlib.Path) -> dict[str, dict[str, int]]:
    """TREC qrels (``qid 0 docid grade``) or BEIR's TSV (``query-id corpus-id score``, a header line)."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for n, line in _lines(path):
        parts = line.split()
        if n == 1 and parts[-1].lower() == "score":
            continue  # BEIR's header
        if len(parts) not in (3, 4):
            raise _bad(path, n, f"expected 'qid 0 docid grade' or 'query-id corpus-id score', got {len(parts)} fields")
        out[parts[0]][parts[-2]] = _grade(path, n, parts[-1])
    return dict(out)


def _texts(path: str | pathlib.Path, what: str) -> dict[str, Any]:
    """id -> text of a BEIR JSONL (``_id``, ``text``, ``title``: a corpus gives Documents) or ``id<TAB>text``."""
    out: dict[str, Any] = {}
    jsonl = str(path).endswith(".jsonl")
    for n, row in (_json_lines(path) if jsonl else ((n, line) for n, line in _lines(path))):
        if jsonl:
            if not isinstance(row.get("_id"), (str, int)) or not isinstance(row.get("text"), str):
                raise _bad(path, n, f"a {what} line needs \"_id\" and \"text\"")
            key = str(row["_id"])
            out[key] = Document(row["text"], key, row.get("title") or None) if what == "corpus" else row["text"]
        else:
            key, tab, text = row.partition("\t")
            if not tab:
                raise _bad(path, n, f"expected 'id<TAB>text' ({what}), found no tab")
            out[key] = Document(text, key) if what == "corpus" else text
    return out


def _triples(queries: dict[str, str], run: dict[str, list[str]], qrels: dict[str, dict[str, int]],
             corpus: dict[str, Any], run_path: Any) -> Triples:
    out = []
    for qid, docids in run.items():
        if qid not in queries:
            raise InputError(f"{run_path}: query {qid!r} is in the run but not in the queries file")
        missing = [d for d in docids if d not in corpus]
        if missing:
            raise InputError(f"{run_path}: query {qid!r} ranks {missing[0]!r}, which the corpus does not hold")
        grades = [qrels.get(qid, {}).get(d, 0) for d in docids]
        if any(grades):
            out.append((queries[qid], [corpus[d] for d in docids], grades))
    return out


def read_trec(run: str, qrels: str, corpus: str, queries: str, top: int = 20) -> Triples:
    """The triples of a TREC run and qrels, the passages from ``corpus`` and the questions from ``queries``."""
    return _triples(_texts(queries, "queries"), read_run(run, top), read_qrels(qrels), _texts(corpus, "corpus"), run)


def read_beir(folder: str, run: str | None = None, top: int = 20, split: str = "test") -> Triples:
    """The triples of a BEIR folder: the judged queries of ``qrels/{split}.tsv``, each with the top ``top`` of
    ``run`` (a TREC run file) or of BM25 over the corpus (:func:`bm25_run`)."""
    root = pathlib.Path(folder)
    qrels = read_qrels(root / "qrels" / f"{split}.tsv")
    queries = {q: t for q, t in _texts(root / "queries.jsonl", "queries").items() if q in qrels}
    corpus = _texts(root / "corpus.jsonl", "corpus")
    ranked = read_run(run, top) if run else bm25_run(queries, corpus, top)
    return _triples(queries, {q: d for q, d in ranked.items() if q in queries}, qrels, corpus, run or root)


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens, as BM25 compares them.

    >>> tokens("Fleas live 2-3 months, a 10th!")
    ['fleas', 'live', 'months', '10th']
    """
    return re.findall(r"\w\w+", text.lower())


def bm25_run(queries: dict[str, str], corpus: dict[str, Any], top: int = 20, k1: float = 0.9,
             b: float = 0.4) -> dict[str, list[str]]:
    """Each query's ``top`` corpus ids by BM25 (Lucene's idf; k1 0.9, b 0.4, as the shared data's BM25 runs) over
    title and text: ``bm25s`` where installed, else the same formula here.

    >>> bm25_run({"q": "flea life"}, {"a": "a cat", "b": "the life of a flea", "c": "flea"}, top=2)
    {'q': ['b', 'c']}
    """
    ids = list(corpus)
    texts = [d if isinstance(d, str) else " ".join(filter(None, (d.title, d.text))) for d in corpus.values()]
    try:
        import bm25s
    except ImportError:
        return _bm25(queries, ids, [tokens(t) for t in texts], top, k1, b)
    index = bm25s.BM25(k1=k1, b=b)
    index.index(bm25s.tokenize(texts, stopwords=None, show_progress=False), show_progress=False)
    k = min(top, len(ids))
    hits, _ = index.retrieve(bm25s.tokenize(list(queries.values()), stopwords=None, show_progress=False), k=k,
                             show_progress=False)
    return {qid: [ids[i] for i in row] for qid, row in zip(queries, hits)}


def _bm25(queries: dict[str, str], ids: list[str], docs: list[list[str]], top: int, k1: float,
          b: float) -> dict[str, list[str]]:
    log.info("bm25s is not installed: BM25 over %d passages in pure Python", len(docs))
    df = Counter(t for d in docs for t in set(d))
    avg = sum(map(len, docs)) / max(1, len(docs))
    counts = [Counter(d) for d in docs]
    out = {}
    for qid, text in queries.items():
        terms = [t for t in set(tokens(text)) if t in df]
        idf = {t: math.log(1 + (len(docs) - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
        scores = [sum(idf[t] * c[t] * (k1 + 1) / (c[t] + k1 * (1 - b + b * len(d) / avg)) for t in terms if t in c)
                  for c, d in zip(counts, docs)]
        out[qid] = [ids[i] for i in sorted(range(len(ids)), key=lambda i: -scores[i])[:top]]
    return out
