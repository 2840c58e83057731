"""``capcal demo``: one real DL19 query on the model, what the reranker does with its defaults first (and why: the
content check's note), then vanilla and the calibrated method forced (``guard=None``), with the empty-prompt prior.
``forcing=False`` (the user chose ``--guard``): the two methods with the user's options only."""

from __future__ import annotations

import json
import sys
import time
from importlib import resources

from ..reranker import CapCalReranker
from ..types import Ranking

__all__ = ["run"]


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def run(rr: CapCalReranker, forcing: bool = True) -> int:
    demo = json.loads(resources.files("capcal_integrations.commands").joinpath("demo.json").read_text(encoding="utf-8"))
    query, passages = demo["query"], demo["passages"]
    texts = [p["text"] for p in passages]
    _out(f"Query: {query}   ({len(texts)} BM25 passages from TREC DL19; grade = NIST relevance 0-3)\n")
    results = _ranked(rr, query, texts, forcing)
    if forcing:
        default = results["default"][0]
        _out("1. What the reranker does with its defaults on this model (column 'default'):")
        _out(f"   {'; '.join(default.notes) or default.method}")
        _out("2. What calibration does when forced (guard=None: the other two columns):\n")
    methods = list(results)
    prior = results[methods[-1]][0].prior or ()
    _out("Empty-prompt prior (what the model gives each slot with no content):")
    _out("  " + "  ".join(f"[{i + 1}] {p:.2f}" for i, p in enumerate(prior)) + "\n")
    _out(f"{'rank':>4}  " + "".join(f"{m:<26}" for m in methods))
    for r in range(len(texts)):
        cells = [f"[{i + 1}] grade {passages[i]['grade']}  {passages[i]['text'][:9]}…"
                 for i in (results[m][0].order[r] for m in methods)]
        _out(f"{r + 1:>4}  " + "".join(f"{c:<26}" for c in cells))
    _out()
    best_grade = max(p["grade"] for p in passages)
    for method, (ranking, seconds) in results.items():
        best = next(r for r, i in enumerate(ranking.order) if passages[i]["grade"] == best_grade)
        _out(f"{method:>18}: most relevant passage at rank {best + 1}; {ranking.usage.requests} requests, "
             f"{seconds:.1f} s")
        for note in ranking.notes:  # e.g. the content check kept the BM25 order
            _out(f"{'':>18}  {note}")
    if forcing:
        _out("\n(The default decides, over the queries it ranks, whether the query changes which passages the model "
             "prefers, and keeps the BM25 order until then and for a model that does not: docs/content-check.md. With "
             "judged queries, `capcal decide --data DIR` decides from them; --guard none always calibrates.)")
    return 0


def _ranked(rr: CapCalReranker, query: str, texts: list[str], forcing: bool) -> dict[str, tuple[Ranking, float]]:
    """Each column's ranking and seconds: ``default`` (with ``forcing``) first, then vanilla and the calibrated
    method (``auto``: the one it ran) with ``guard=None`` (with ``forcing``) or the user's options."""
    from tqdm import tqdm

    def timed(reranker: CapCalReranker) -> tuple[Ranking, float]:
        start = time.perf_counter()
        return reranker.rerank(query, texts), time.perf_counter() - start

    forced = rr.with_options(guard=None) if forcing else rr
    calibrated = rr.method if rr.method not in ("vanilla", "psc") else "auto"
    results = {}
    for method in tqdm(("vanilla", calibrated), desc="reranking (cold prompts take ~10 s on 2 cores)", unit="method"):
        ranking, seconds = timed(forced.with_options(method=method))
        results[ranking.method] = (ranking, seconds)
    if forcing:  # ranked last (its content check then reads in the background beside nothing), shown first
        results = {"default": timed(rr.with_options(method=calibrated)), **results}
    return results
