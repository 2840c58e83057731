"""``capcal decide``: decide from judged queries whether to calibrate this model
(:meth:`~.CapCalReranker.decide`; the rule: :mod:`.judged`), from the files a team already has.

    capcal decide --data ../shared/data/trec-dl19-passage --queries 20       # the embedded model
    capcal decide --data my-beir-folder --run bm25.trec                    # BEIR, candidates from a run
    capcal decide --data my-beir-folder                                    # BEIR, candidates by BM25
    capcal decide --run run.trec --qrels qrels.txt --corpus corpus.jsonl --questions queries.jsonl
    capcal decide --judged labels.jsonl --base-url http://127.0.0.1:8000/v1 --json   # capcal label's file

The formats (:mod:`.judged_files`; ``--format`` names one, else it is told from what is given): ``layout``, a
folder in the shared data layout (``candidates.jsonl.gz``: each query's candidates, best first; ``qrels.txt``:
``qid 0 docid grade``); ``beir``, a folder as BEIR ships it (``corpus.jsonl``, ``queries.jsonl``,
``qrels/test.tsv``); ``trec``, a run and qrels; ``judged``, a JSONL of ``(query, passages, grades)``. Each
query's top ``--top`` candidates are ranked calibrated, in their given order and uncalibrated (queries judged before
on this model and these options are not ranked again: the decision pools them); the decision is printed (``--json``:
its JSON, for ``decision=``) and kept like the content check's own, so the next ``capcal rerank``, service or
``capcal decide`` on this model and these options goes on from it. What it saw (:mod:`.decision_report`): the
queries calibrating helped and hurt most, listed, and in ``--out DIR`` the decision's JSON, each query's nDCG@10
(TSV) and a plot of their differences (SVG).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import InputError

__all__ = ["add_parser", "judged_from", "read_triples", "run", "FORMATS"]

FORMATS = ("layout", "beir", "trec", "judged")


def add_parser(sub: Any, method_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("decide", help="decide from judged queries whether to calibrate this model (the label-free "
                                      "check is the fallback)")
    p.add_argument("--data", help="a folder: the shared data layout (candidates.jsonl.gz, qrels.txt) or BEIR's "
                                  "(corpus.jsonl, queries.jsonl, qrels/test.tsv)")
    p.add_argument("--judged", metavar="FILE", help="a JSONL of {query, passages, grades} (capcal label writes it)")
    p.add_argument("--run", metavar="FILE", help="a TREC run: the candidates (with a BEIR folder or --qrels)")
    p.add_argument("--qrels", metavar="FILE", help="TREC qrels for --run (qid 0 docid grade)")
    p.add_argument("--corpus", metavar="FILE", help="the passages of --run: BEIR's corpus.jsonl or 'id<TAB>text'")
    p.add_argument("--questions", metavar="FILE", help="the queries of --run: BEIR's queries.jsonl or 'id<TAB>text'")
    p.add_argument("--format", choices=FORMATS, default=None, help="the input's format (default: told from the "
                                                                  "arguments and what the folder holds)")
    p.add_argument("--split", default="test", help="a BEIR folder's qrels split (qrels/SPLIT.tsv; default test)")
    p.add_argument("--top", type=int, default=20, help="candidates per query ranked (default 20)")
    p.add_argument("--queries", type=int, default=None, help="only the first N queries (default: all judged ones)")
    p.add_argument("--json", action="store_true", help="print the decision's JSON (pass it as decision=)")
    p.add_argument("--out", metavar="DIR", help="a folder for the decision (decision.json), each query's nDCG@10 "
                                                "(queries.tsv) and their differences' plot (queries.svg)")
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


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    if args.judged:
        return "judged"
    if args.data:
        if os.path.exists(os.path.join(args.data, "candidates.jsonl.gz")):
            return "layout"
        if os.path.exists(os.path.join(args.data, "corpus.jsonl")):
            return "beir"
        raise InputError(f"{args.data}: neither the shared data layout (candidates.jsonl.gz, qrels.txt) nor a BEIR "
                         "folder (corpus.jsonl, queries.jsonl, qrels/test.tsv); name the format with --format")
    if args.run and args.qrels:
        return "trec"
    raise InputError("capcal decide needs judged queries: --data DIR, --judged FILE, or --run FILE --qrels FILE "
                     "--corpus FILE --questions FILE")


def read_triples(args: argparse.Namespace) -> list[tuple[str, list[Any], list[int]]]:
    """The judged queries the arguments name, in the format they name or show."""
    from . import judged_files as files

    fmt = _format(args)
    needs = {"layout": ("data",), "beir": ("data",), "trec": ("run", "qrels", "corpus", "questions"),
             "judged": ("judged",)}[fmt]
    missing = [f"--{n}" for n in needs if not getattr(args, n)]
    if missing:
        raise InputError(f"capcal decide --format {fmt} needs {' '.join(missing)}")
    if fmt == "layout":
        return judged_from(args.data, args.top, args.queries)
    if fmt == "beir":
        triples = files.read_beir(args.data, args.run, args.top, args.split)
    elif fmt == "trec":
        triples = files.read_trec(args.run, args.qrels, args.corpus, args.questions, args.top)
    else:
        triples = files.read_judged(args.judged)
    return triples[:args.queries] if args.queries is not None else triples


def run(args: argparse.Namespace, reranker: Any, triples: list[tuple[str, list[Any], list[int]]] | None = None) -> int:
    """Decide from the judged queries the arguments name (``triples``: already read) and show what it saw."""
    from .decision_report import report

    triples = read_triples(args) if triples is None else triples
    sys.stderr.write(f"capcal decide: ranking {len(triples)} judged queries three ways (calibrated, given order, "
                     f"uncalibrated; those judged before are pooled, not ranked again) on {reranker.model or 'the endpoint'}\n")
    decision = reranker.decide(triples)
    sys.stdout.write((decision.to_json() if args.json else str(decision)) + "\n")
    report(reranker, triples, decision, args.out or None, sys.stderr)
    return 0
