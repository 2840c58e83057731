"""``capcal decide --data DIR``: decide from judged queries whether to calibrate this model
(:meth:`~.CapCalReranker.decide`; the rule: :mod:`.judged`).

    capcal decide --data ../shared/data/trec-dl19-passage --queries 20       # the embedded model
    capcal decide --data my-eval --base-url http://127.0.0.1:8000/v1 --json

``DIR`` is a folder in the shared data layout (``candidates.jsonl.gz``: each query's candidates, best first;
``qrels.txt``: ``qid 0 docid grade``). Each query's top ``--top`` candidates are ranked calibrated, in their given
order and uncalibrated (queries judged before on this model and these options are not ranked again: the decision
pools them); the decision is printed (``--json``: its JSON, for ``decision=``) and kept like the content check's own,
so the next ``capcal rerank``, service or ``capcal decide`` on this model and these options goes on from it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["add_parser", "judged_from", "run"]


def add_parser(sub: Any, method_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("decide", help="decide from judged queries whether to calibrate this model (the label-free "
                                      "check is the fallback)")
    p.add_argument("--data", required=True, help="a folder in the shared data layout (candidates.jsonl.gz, qrels.txt)")
    p.add_argument("--top", type=int, default=20, help="candidates per query ranked (default 20)")
    p.add_argument("--queries", type=int, default=None, help="only the first N queries (default: all judged ones)")
    p.add_argument("--json", action="store_true", help="print the decision's JSON (pass it as decision=)")
    method_options(p)


def judged_from(path: str, top: int = 20, queries: int | None = None) -> list[tuple[str, list[Any], list[int]]]:
    """``(query, passages, grades)`` of a data folder's queries: the top ``top`` candidates, their grades (0 where
    unjudged); queries with no candidate graded above 0 left out."""
    from ..evaluation.data import load_dataset

    data = load_dataset(path)
    grades = data.grades()
    out = []
    for topic in data.topics:
        cands = topic.candidates[:top]
        judged = [grades.get(topic.qid, {}).get(c.docid, 0) for c in cands]
        if any(judged):
            out.append((topic.query, [c.document() for c in cands], judged))
    return out[:queries] if queries is not None else out


def run(args: argparse.Namespace, reranker: Any) -> int:
    triples = judged_from(args.data, args.top, args.queries)
    sys.stderr.write(f"capcal decide: ranking {len(triples)} judged queries three ways (calibrated, given order, "
                     f"uncalibrated; those judged before are pooled, not ranked again) on {reranker.model or 'the endpoint'}\n")
    decision = reranker.decide(triples)
    sys.stdout.write((decision.to_json() if args.json else str(decision)) + "\n")
    return 0
