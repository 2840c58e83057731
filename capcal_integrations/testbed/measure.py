"""Measure the library's methods on the testbed: nDCG@10 and how often the content decision says "reads".

For every slot scenario, content slope ``s`` and draw (a noise seed: one simulated model), every
method ranks every list through a fresh :class:`~capcal_integrations.CapCalReranker` (its own endpoint
state: a per-model decision is taken afresh) on the same simulated endpoint, so methods are compared on
the same draws. Lists are taken in an order shuffled per draw (a decision made on the first lists does
not always see the same ones). nDCG@10 is trec_eval's (linear gains, the ideal from all of the
query's judgements). A test instrument: the numbers say what the rules do on the testbed's model.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .endpoint import PassageIndex, SimulatedServer
from .model import _digest, scenario

__all__ = ["BenchList", "METHODS", "bench_lists", "ndcg10", "measure", "Row", "table", "decisions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchList:
    """One list: its query, passages in first-stage order, their grades, and every judged grade of the query."""

    query: str
    passages: tuple[str, ...]
    grades: tuple[int, ...]
    ideal: tuple[int, ...]


#: Methods measured, as ranking options (``None``: the first-stage order). ``default`` is whatever the
#: default options do.
METHODS: dict[str, dict[str, Any] | None] = {
    "bm25": None,
    "vanilla": {"method": "vanilla"},
    "capcal-adaptive": {"method": "capcal", "alpha": "adaptive", "guard": None},
    "capcal-1": {"method": "capcal", "alpha": 1.0, "guard": None},
    "default": {},
}


def bench_lists(data: Any, top: int = 20) -> list[BenchList]:
    """The first ``top`` candidates of every topic of a dataset (a directory in the shared format or a
    :class:`~capcal_integrations.evaluation.data.Dataset`)."""
    from ..evaluation.data import load_dataset

    dataset = load_dataset(data) if not hasattr(data, "topics") else data
    grades = dataset.grades()
    out = []
    for t in dataset.topics:
        judged = grades.get(t.qid, {})
        cands = t.candidates[:top]
        out.append(BenchList(t.query, tuple(c.text if not c.title else f"Title: {c.title} Content: {c.text}" for c in cands),
                             tuple(judged.get(c.docid, 0) for c in cands), tuple(sorted(judged.values(), reverse=True))))
    if not out:
        raise InputError("the dataset has no topics")
    return out


def ndcg10(order_grades: Sequence[int], ideal: Sequence[int]) -> float:
    """trec_eval's nDCG@10: linear gains, ``log2(rank + 1)`` discounts, the ideal from all judgements.

    >>> round(ndcg10([0, 3, 1], [3, 1, 1]), 4)  # (3 / log2 3 + 1 / 2) / (3 + 1 / log2 3 + 1 / 2)
    0.5792
    """
    def dcg(gains: Sequence[int]) -> float:
        return math.fsum(g / math.log2(r + 2) for r, g in enumerate(gains[:10]) if g > 0)

    best = dcg(sorted(ideal, reverse=True))
    return dcg(order_grades) / best if best > 0 else 0.0


def decisions(ranking: Any) -> tuple[int, int]:
    """``(reads, decided)`` of one ranking: its content decision when it carries one (``ranking.content``),
    else the per-window guard's (windows checked, and those not kept in their given order)."""
    content = getattr(ranking, "content", None)
    if content is not None:
        return int(bool(content.reads)), 1
    checked = len(ranking.agreement)
    return checked - len(ranking.guarded), checked


@dataclass(frozen=True)
class Row:
    scenario: str
    s: float
    method: str
    ndcg10: float
    reads_share: float | None
    ndcg10_se: float = 0.0  # standard error over draws
    draws: int = 0
    lists: int = 0
    seconds: float = 0.0  # per ranking

    def json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "s": self.s, "method": self.method, "ndcg10": round(self.ndcg10, 4),
                "reads_share": None if self.reads_share is None else round(self.reads_share, 4)}


def measure(lists: Sequence[BenchList], *, scenarios: Sequence[str], s_values: Sequence[float], draws: int,
            methods: Mapping[str, dict[str, Any] | None] | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> list[Row]:
    """One :class:`Row` per (scenario, s, method): nDCG@10 averaged over lists and draws, and the share
    of the method's content decisions that said "reads" (``None`` for a method that takes none)."""
    methods = METHODS if methods is None else methods
    index = PassageIndex((b.query, b.passages, b.grades) for b in lists)
    rows = []
    for name in scenarios:
        for s in s_values:
            per_draw: dict[str, list[float]] = {m: [] for m in methods}
            reads: dict[str, list[int]] = {m: [0, 0] for m in methods}
            spent: dict[str, float] = dict.fromkeys(methods, 0.0)
            for draw in range(draws):
                model = scenario(name, s, seed=draw_seed(seed, name, s, draw))
                server = SimulatedServer(index, model)
                order = list(range(len(lists)))
                random.Random(f"{seed}/{draw}").shuffle(order)
                for method, opts in methods.items():
                    start = time.perf_counter()
                    scores, (r, d) = _run(server, [lists[i] for i in order], opts)
                    spent[method] += time.perf_counter() - start
                    per_draw[method].append(math.fsum(scores) / len(scores))
                    reads[method][0] += r
                    reads[method][1] += d
            for method in methods:
                values = per_draw[method]
                mean = math.fsum(values) / len(values)
                se = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) if len(
                    values) > 1 else 0.0
                r, d = reads[method]
                rows.append(Row(name, float(s), method, mean, r / d if d else None, se, draws, len(lists),
                                spent[method] / (draws * len(lists))))
                if progress:
                    progress(f"{name} s={s:g} {method}: nDCG@10 {mean:.4f} (+-{se:.4f})"
                             + (f", reads {r}/{d}" if d else "") + f", {rows[-1].seconds * 1000:.0f} ms per list")
    return rows


def draw_seed(seed: int, name: str, s: float, draw: int) -> int:
    """The noise seed of one draw: fixed by the run's seed, the scenario, ``s`` and the draw number."""
    return _digest(f"{seed}/{name}/{s:g}/{draw}") & 0xFFFFFFFF


def _run(server: SimulatedServer, lists: Sequence[BenchList], opts: dict[str, Any] | None) -> tuple[list[float], tuple[int, int]]:
    if opts is None:
        return [ndcg10(b.grades, b.ideal) for b in lists], (0, 0)
    from . import SimulatedEndpoint

    reranker = SimulatedEndpoint(server).reranker(**opts)
    scores, reads, decided = [], 0, 0
    for b in lists:
        ranking = reranker.rerank(b.query, list(b.passages))
        scores.append(ndcg10([b.grades[i] for i in ranking.order], b.ideal))
        r, d = decisions(ranking)
        reads, decided = reads + r, decided + d
    return scores, (reads, decided)


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table: scenario, s, method, nDCG@10 (standard error over draws), reads share."""
    out = ["| scenario | s | method | nDCG@10 | reads share |", "|---|---:|---|---:|---:|"]
    for r in rows:
        share = "" if r.reads_share is None else f"{r.reads_share:.2f}"
        out.append(f"| {r.scenario} | {r.s:g} | {r.method} | {r.ndcg10:.4f} ± {r.ndcg10_se:.4f} | {share} |")
    return "\n".join(out)
