"""Measure the library's methods on the testbed: nDCG@10 and how often the content decision says "reads".

For every slot scenario, content slope ``s`` and draw (a noise seed: one simulated model), every
method ranks every list through a fresh :class:`~capcal_integrations.CapCalReranker` (its own endpoint
state: a per-model decision is taken afresh) on the same simulated endpoint, so methods are compared on
the same draws. Lists are taken in an order shuffled per draw (a decision made on the first lists does
not always see the same ones). nDCG@10 is trec_eval's (linear gains, the ideal from all of the
query's judgements). A test instrument: the numbers say what the rules do on the testbed's model.

The lists and the **traffic shapes** they reach the reranker in (``fixed``, ``mixed``, ``windows``,
``concurrent``; :data:`~.workload.SHAPES`) are :mod:`.workload`'s; the rows measured and their Markdown tables
are :mod:`.results`'s (both re-exported here). :func:`estimate` times a few lists of a shape to say how long a
measurement will take.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .endpoint import PassageIndex, SimulatedServer
from .model import _digest, scenario
from .results import PIVOT, Row, pivot, table  # noqa: F401 - re-exported
from .workload import (  # noqa: F401 - re-exported
    CONCURRENCY,
    LENGTHS,
    SHAPE_TOP,
    SHAPES,
    BenchList,
    bench_lists,
    shaped,
)

__all__ = ["BenchList", "METHODS", "SHAPES", "SHAPE_TOP", "bench_lists", "ndcg10", "measure", "Row", "table", "decisions",
           "shaped", "estimate"]

log = logging.getLogger(__name__)


#: Methods measured, as ranking options (``None``: the first-stage order). ``default`` is whatever the
#: default options do (the content check's query rule, ``guard="query"``).
METHODS: dict[str, dict[str, Any] | None] = {
    "bm25": None,
    "vanilla": {"method": "vanilla"},
    "capcal-adaptive": {"method": "capcal", "alpha": "adaptive", "guard": None},
    "capcal-1": {"method": "capcal", "alpha": 1.0, "guard": None},
    "default": {"check_wait": True},
    "content": {"check_wait": True, "guard": "content"},  # the content rule (an earlier default)
    "capcal-chosen": {"method": "capcal", "alpha": "chosen", "guard": None},
}
#: ``alpha="chosen"`` (``capcal-chosen``): the strength the default's content check chose on its first lists
#: in the same draw (1 if it did not decide), on every list.
#: The strengths of the ``capcal-best`` row: CapCal at each fixed alpha, its rankings implied by the first
#: step of the ``capcal-1`` run (every later step the first step's distributions restricted to the labels
#: left, which is what the testbed's Plackett-Luce model answers), the best of them reported.
IMPLIED_ALPHAS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def ndcg10(order_grades: Sequence[int], ideal: Sequence[int]) -> float:
    """trec_eval's nDCG@10: linear gains, ``log2(rank + 1)`` discounts, the ideal from all judgements.

    >>> round(ndcg10([0, 3, 1], [3, 1, 1]), 4)  # (3 / log2 3 + 1 / 2) / (3 + 1 / log2 3 + 1 / 2)
    0.5792
    """
    def dcg(gains: Sequence[int]) -> float:
        return math.fsum(g / math.log2(r + 2) for r, g in enumerate(gains[:10]) if g > 0)

    best = dcg(sorted(ideal, reverse=True))
    return dcg(order_grades) / best if best > 0 else 0.0


def decisions(reranker: Any) -> tuple[int, int]:
    """``(reads, decided)``: the content check's decision once the lists are ranked (one per reranker: a fresh
    one per draw), ``(0, 0)`` while there is none."""
    decision = _decision(reranker)
    return (int(decision.reads), 1) if decision is not None else (0, 0)


def _decision(reranker: Any) -> Any:
    """The reranker's content decision (None before it is taken, or for a library without the check)."""
    method = getattr(reranker, "content_decision", None)
    return method() if method is not None else None


def measure(lists: Sequence[BenchList], *, scenarios: Sequence[str], s_values: Sequence[float], draws: int,
            methods: Mapping[str, dict[str, Any] | None] | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None, shape: str = "fixed") -> list[Row]:
    """One :class:`Row` per (scenario, s, method): nDCG@10 averaged over lists and draws, and the share
    of the method's content decisions that said "reads" (``None`` for a method that takes none). ``shape``
    (:data:`SHAPES`) is how the lists reach the reranker; ``lists`` need :data:`SHAPE_TOP` candidates for it."""
    methods = METHODS if methods is None else methods
    shaped(lists[:0], shape)  # an unknown shape fails here
    if shape == "windows" and all(len(b.passages) <= 20 for b in lists):
        log.warning("testbed: the windows shape needs lists longer than the window (20); these have at most %d passages",
                    max(len(b.passages) for b in lists))
    concurrency = CONCURRENCY if shape == "concurrent" else None
    index = PassageIndex((b.query, b.passages, b.grades) for b in lists)
    rows = []
    for name in scenarios:
        for s in s_values:
            per_draw: dict[str, list[float]] = {m: [] for m in [*methods, "capcal-best"]}
            after: dict[str, list[float]] = {m: [] for m in [*methods, "capcal-best"]}  # over the lists ranked after
            # the default's decision (its deciding phase left out), per draw
            # per method: reads, decided, windows calibrated, windows, requests, prompt tokens, uncached tokens
            counts: dict[str, list[float]] = {m: [0.0] * 7 for m in methods}
            implied: dict[float, list[float]] = {a: [] for a in IMPLIED_ALPHAS}
            spent: dict[str, float] = dict.fromkeys(methods, 0.0)
            implied_ok, passages = True, 0
            after_implied: dict[float, list[float]] = {}
            for draw in range(draws):
                model = scenario(name, s, seed=draw_seed(seed, name, s, draw))
                server = SimulatedServer(index, model)
                order = list(range(len(lists)))
                random.Random(f"{seed}/{draw}").shuffle(order)
                cut = shaped(lists, shape, seed, draw)
                chosen = [cut[i] for i in order]
                passages += sum(len(b.passages) for b in chosen)
                picked, ranked_after = 1.0, []
                per_list: dict[str, list[float]] = {}
                for method, opts in methods.items():
                    if opts is not None and opts.get("alpha") == "chosen":
                        opts = {**opts, "alpha": picked}
                    start = time.perf_counter()
                    reranker, rankings = _run(server, chosen, opts, concurrency)
                    spent[method] += time.perf_counter() - start
                    orders = [r.order for r in rankings] if rankings else [tuple(range(len(b.grades))) for b in chosen]
                    per_list[method] = [ndcg10([b.grades[i] for i in o], b.ideal) for b, o in zip(chosen, orders)]
                    per_draw[method].append(_mean(per_list[method]))
                    decided = _decision(reranker) if method == "default" else None
                    if method == "default":
                        ranked_after = [k for k, x in enumerate(rankings) if any(n.startswith("content check (")
                                                                                 for n in x.notes)]
                    if decided is not None:
                        picked = decided.alpha
                    if reranker is not None:
                        r, d = decisions(reranker)  # (0, 0) where no check ran (guard=None)
                        windows = sum(_windows(x) for x in rankings)
                        c = counts[method]
                        c[0], c[1] = c[0] + r, c[1] + d
                        c[2] += windows - sum(int(x.kept_given_order) for x in rankings)
                        c[3] += windows
                        c[4] += sum(x.usage.requests for x in rankings)
                        c[5] += sum(x.usage.prompt_tokens for x in rankings)
                        c[6] += sum(x.usage.prompt_tokens - x.usage.cached_tokens for x in rankings)
                    implied_ok = implied_ok and all(_windows(x) == 1 for x in rankings)  # one window: the whole list
                    if method == "capcal-1" and rankings and implied_ok:
                        for a in IMPLIED_ALPHAS:
                            per_list[f"implied {a:g}"] = [ndcg10([b.grades[i] for i in _implied(x, a)], b.ideal)
                                                          for b, x in zip(chosen, rankings)]
                            implied[a].append(_mean(per_list[f"implied {a:g}"]))
                if "default" in methods and ranked_after:
                    for method in methods:
                        after[method].append(_mean([per_list[method][k] for k in ranked_after]))
                    if implied_ok and f"implied {IMPLIED_ALPHAS[0]:g}" in per_list:
                        for a in IMPLIED_ALPHAS:
                            after_implied.setdefault(a, []).append(_mean([per_list[f"implied {a:g}"][k] for k in ranked_after]))
            if implied_ok and any(implied.values()):
                best = max(IMPLIED_ALPHAS, key=lambda a: _mean(implied[a]))
                per_draw["capcal-best"] = implied[best]
            if implied_ok and after_implied and len(after_implied[IMPLIED_ALPHAS[0]]) == len(after["default"]):
                after["capcal-best"] = after_implied[max(IMPLIED_ALPHAS, key=lambda a: _mean(after_implied[a]))]
            for method in [*methods, "capcal-best", *(f"{m}@decided" for m in [*methods, "capcal-best"])]:
                values = after[method[:-len("@decided")]] if method.endswith("@decided") else per_draw[method]
                if not values:
                    continue
                mean = _mean(values)
                se = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) if len(
                    values) > 1 else 0.0
                c = counts.get(method, [0.0] * 7)
                per = draws * len(lists)
                note = (f"alpha {best:g}; implied by capcal-1's first steps; alpha 1 implied "
                        f"{_mean(implied[1.0]):.4f}") if method == "capcal-best" else ""
                rows.append(Row(name, float(s), method, mean, c[0] / c[1] if c[1] else None, se, draws, len(lists),
                                spent.get(method, 0.0) / per, c[2] / c[3] if c[3] else None, c[4] / per, c[5] / per,
                                c[6] / per, note, shape, passages / per))
                if progress:
                    progress(f"{rows[-1].cell} s={s:g} {method}: nDCG@10 {mean:.4f} (+-{se:.4f})"
                             + (f", reads {c[0]:.0f}/{c[1]:.0f}" if c[1] else "") + f", {rows[-1].seconds * 1000:.0f} ms per list"
                             + (f" ({note})" if note else ""))
    return rows


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _windows(ranking: Any) -> int:
    return len({s.window for s in ranking.steps}) or 1


def _implied(ranking: Any, alpha: float) -> list[int]:
    """The capcal ranking at ``alpha`` implied by a ranking's first step (one window: the whole list)."""
    from ..calibration.strength import implied_order

    if not ranking.steps:  # kept in its given order
        return list(ranking.order)
    first = ranking.steps[0]
    order = implied_order([math.log(max(x, 1e-300)) for x in first.p], [math.log(max(x, 1e-300)) for x in first.q], alpha)
    return [first.candidates[j] for j in order]


def draw_seed(seed: int, name: str, s: float, draw: int) -> int:
    """The noise seed of one draw: fixed by the run's seed, the scenario, ``s`` and the draw number."""
    return _digest(f"{seed}/{name}/{s:g}/{draw}") & 0xFFFFFFFF


def _run(server: SimulatedServer, lists: Sequence[BenchList], opts: dict[str, Any] | None,
         concurrency: int | None = None) -> tuple[Any, list[Any]]:
    """A fresh reranker with ``opts`` on the server, and its rankings of ``lists`` (none for the first-stage order):
    one after another, or ``concurrency`` at a time through ``arerank_many``."""
    if opts is None:
        return None, []
    from . import SimulatedEndpoint

    reranker = SimulatedEndpoint(server).reranker(**opts)
    items = [(b.query, list(b.passages)) for b in lists]
    if concurrency:
        return reranker, asyncio.run(reranker.arerank_many(items, concurrency=concurrency))
    return reranker, [reranker.rerank(q, p) for q, p in items]


def estimate(lists: Sequence[BenchList], *, scenarios: Sequence[str], s_values: Sequence[float], draws: int,
             methods: Mapping[str, dict[str, Any] | None] | None = None, shape: str = "fixed", seed: int = 0,
             sample: int = 2) -> tuple[float, dict[str, float]]:
    """How long :func:`measure` will take with these arguments, roughly: ``sample`` lists of the shape ranked by
    every method (the first scenario, the largest ``s``; after one short list that warms the reranker up, as
    the measure's first list does for the rest), the time per list times the lists, draws, scenarios and ``s``
    values. ``(seconds, seconds per list by method)``."""
    methods = METHODS if methods is None else methods
    chosen = shaped(lists, shape, seed, 0)[:max(1, sample)]
    warm = replace(lists[0], passages=lists[0].passages[:4], grades=lists[0].grades[:4])
    server = SimulatedServer(PassageIndex((b.query, b.passages, b.grades) for b in lists),
                             scenario(scenarios[0], max(s_values), seed=draw_seed(seed, scenarios[0], max(s_values), 0)))
    per_list = {}
    for method, opts in methods.items():
        if opts is None:
            per_list[method] = 0.0
            continue
        if opts.get("alpha") == "chosen":
            opts = {**opts, "alpha": 1.0}
        from . import SimulatedEndpoint

        reranker = SimulatedEndpoint(server).reranker(**opts)
        reranker.rerank(warm.query, list(warm.passages))
        start = time.perf_counter()
        if shape == "concurrent":
            asyncio.run(reranker.arerank_many([(b.query, list(b.passages)) for b in chosen], concurrency=CONCURRENCY))
        else:
            for b in chosen:
                reranker.rerank(b.query, list(b.passages))
        per_list[method] = (time.perf_counter() - start) / len(chosen)
    return math.fsum(per_list.values()) * len(lists) * draws * len(scenarios) * len(s_values), per_list
