"""Quality measures (through ir_measures, i.e. pytrec_eval) and paired significance over queries."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from itertools import product
from typing import NamedTuple

from .data import Qrel, ScoredDoc

__all__ = ["MEASURES", "CANDIDATES_NDCG", "per_query", "mean", "PairedTest", "paired_test", "sign_flip_p"]

#: Display name -> ir_measures measure string; ``{rel}`` is the dataset's binary relevance threshold.
MEASURES = {"nDCG@10": "nDCG@10", "MRR@10": "RR(rel={rel})@10", "R@20": "R(rel={rel})@20"}
#: nDCG@10 as the CapCal release computes it (``code/src/ir_metrics_wrapper.py``): the ideal ranking
#: is built from the judgements of the reranked candidates only, not from all of the query's qrels, so
#: it reads higher than trec_eval's nDCG@10 whenever relevant passages were not retrieved.
CANDIDATES_NDCG = "nDCG@10, judged candidates only (as the CapCal release)"


def per_query(qrels: Iterable[Qrel], run: Iterable[ScoredDoc], qids: Sequence[str], rel: int = 1,
              ) -> dict[str, dict[str, float]]:
    """``{measure name: {qid: value}}`` for every qid in ``qids`` (0.0 where the run has no entry, e.g. a
    query without any relevant judgement, which trec_eval skips)."""
    import ir_measures  # lazy: it sets up logging handlers at import

    measures = {name: ir_measures.parse_measure(spec.format(rel=rel)) for name, spec in MEASURES.items()}
    by_measure = {m: name for name, m in measures.items()}
    out: dict[str, dict[str, float]] = {name: dict.fromkeys(qids, 0.0) for name in measures}
    wanted = set(qids)
    qrels = [ir_measures.Qrel(*q) for q in qrels if q.query_id in wanted]
    run = [ir_measures.ScoredDoc(*d) for d in run if d.query_id in wanted]
    for metric in ir_measures.iter_calc(list(measures.values()), qrels, run):
        out[by_measure[metric.measure]][metric.query_id] = float(metric.value)
    ranked = {(d.query_id, d.doc_id) for d in run}
    out[CANDIDATES_NDCG] = dict.fromkeys(qids, 0.0)
    candidates = [q for q in qrels if (q.query_id, q.doc_id) in ranked]
    for metric in ir_measures.iter_calc([measures["nDCG@10"]], candidates, run):
        out[CANDIDATES_NDCG][metric.query_id] = float(metric.value)
    return out


def mean(values: Mapping[str, float] | Sequence[float]) -> float:
    vals = list(values.values()) if isinstance(values, Mapping) else list(values)
    return math.fsum(vals) / len(vals) if vals else float("nan")


class PairedTest(NamedTuple):
    """``a`` vs ``b`` over the queries both have: mean difference ``a - b``, wins/ties/losses of ``a``,
    a two-sided paired t-test p-value and a two-sided sign-flip permutation p-value."""

    n: int
    diff: float
    wins: int
    ties: int
    losses: int
    t_p: float
    perm_p: float


def sign_flip_p(diffs: Sequence[float], *, samples: int = 20000, seed: int = 0) -> float:
    """Two-sided paired permutation test: the share of sign assignments whose mean difference is at
    least as far from zero as the observed one. Exact (all ``2^n`` assignments) for ``n <= 16``, else
    ``samples`` random ones (plus the observed, so p > 0).

    >>> sign_flip_p([1.0, 2.0, 3.0])  # of 8 assignments only +++ and --- reach |mean| >= 2
    0.25
    >>> sign_flip_p([0.0, 0.0])
    1.0
    """
    n = len(diffs)
    if n == 0:
        return float("nan")
    observed = abs(math.fsum(diffs)) - 1e-12
    if n <= 16:
        hits = sum(1 for signs in product((1, -1), repeat=n)
                   if abs(math.fsum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed)
        return hits / 2 ** n
    rng = random.Random(seed)
    hits = 1 + sum(1 for _ in range(samples)
                   if abs(math.fsum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed)
    return hits / (samples + 1)


def paired_test(a: Mapping[str, float], b: Mapping[str, float]) -> PairedTest:
    """Compare per-query values of two methods on their common queries.

    >>> t = paired_test({"q1": 0.5, "q2": 0.7, "q3": 0.4}, {"q1": 0.4, "q2": 0.7, "q3": 0.1})
    >>> t.n, round(t.diff, 3), (t.wins, t.ties, t.losses), t.perm_p
    (3, 0.133, (2, 1, 0), 0.5)
    """
    from scipy import stats

    common = [q for q in a if q in b]
    diffs = [a[q] - b[q] for q in common]
    n = len(diffs)
    if n == 0:
        return PairedTest(0, float("nan"), 0, 0, 0, float("nan"), float("nan"))
    wins = sum(d > 1e-12 for d in diffs)
    losses = sum(d < -1e-12 for d in diffs)
    if n < 2 or all(abs(d - diffs[0]) < 1e-15 for d in diffs):
        t_p = 1.0 if all(abs(d) < 1e-15 for d in diffs) else float("nan")
    else:
        t_p = float(stats.ttest_rel([a[q] for q in common], [b[q] for q in common]).pvalue)
    return PairedTest(n, math.fsum(diffs) / n, wins, n - wins - losses, losses, t_p, sign_flip_p(diffs))
