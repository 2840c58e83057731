"""Decide from judged queries: calibrate only where the labels show that calibrating beats the given order.

The label-free check (:mod:`.content_check`) asks whether the query moves the model's preferences; it cannot tell
a query-dependent taste (or a copy of the retriever's order) from relevance. Judged queries can. A user with a
few dozen judged queries (a RAG team's evaluation set) decides from them: each list is ranked by the calibrated
method, kept in its given order and ranked by the uncalibrated method (``vanilla``, or ``first-token`` beside
``first-token-capcal``); the per-query differences of nDCG@10 (trec_eval's: linear gains) between the calibrated
ranking and the given order are paired, and the decision is **calibrate** only when the lower end of their
two-sided 95 % Student-t interval is above zero (:func:`label_verdict`).

Why this bound: the given order is what the reranker returns otherwise, so calibrating must beat it, not merely
tie; a one-sided 2.5 % error at a true gain of zero, less where calibrating hurts (no content, a follower of the
retriever, a taste of the model's own: ``benchmarks/judged.py`` measures each on the testbed); Student-t because
per-query nDCG differences are bounded and, at 20 queries, close enough to normal for a 95 % interval (the
testbed's false-calibrate rates check it). The uncalibrated method is measured beside it and reported, not
decided on.

Pure, but for :func:`rank_judged` and :func:`arank_judged`, which rank the judged lists through a reranker
(:meth:`.CapCalReranker.decide` and ``adecide``: the decision is then set like the check's own and kept).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .check import ContentDecision, decision_key

__all__ = ["LEVEL", "MIN_JUDGED", "Judged", "LabelEvidence", "ndcg10", "t_quantile", "paired_interval",
           "label_verdict", "judged_triples", "uncalibrated", "rank_judged", "arank_judged", "label_decision"]

#: The two-sided level of the interval whose lower end must clear zero.
LEVEL = 0.95
#: The fewest judged queries (with at least one graded passage and two passages) a decision is taken on.
MIN_JUDGED = 5

Judged = tuple[str, Sequence[Any], Sequence[int]]


def ndcg10(order: Sequence[int], grades: Sequence[int]) -> float:
    """trec_eval's nDCG@10 of ``order`` (input indices, best first) under ``grades`` (one per input passage):
    linear gains, ``log2(rank + 1)`` discounts, the ideal from the list's own grades.

    >>> round(ndcg10([1, 0, 2], [1, 3, 1]), 4), ndcg10([0, 1], [0, 0])
    (1.0, 0.0)
    >>> round(ndcg10([0, 1, 2], [1, 3, 1]), 4)  # (1 + 3 / log2 3 + 1 / 2) / (3 + 1 / log2 3 + 1 / 2)
    0.8213
    """
    def dcg(gains: Sequence[float]) -> float:
        return math.fsum(g / math.log2(r + 2) for r, g in enumerate(gains[:10]) if g > 0)

    best = dcg(sorted(grades, reverse=True))
    return dcg([grades[i] for i in order]) / best if best > 0 else 0.0


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz's method)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c if abs(1.0 + num / c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _t_cdf(t: float, df: float) -> float:
    """Student's t distribution function."""
    if t == 0:
        return 0.5
    x = df / (df + t * t)
    a, b = df / 2.0, 0.5
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    tail = front * _beta_cf(a, b, x) / a if x < (a + 1) / (a + b + 2) else 1.0 - front * _beta_cf(b, a, 1 - x) / b
    return 1.0 - tail / 2 if t >= 0 else tail / 2


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on its distribution function).

    >>> round(t_quantile(0.975, 19), 3), round(t_quantile(0.975, 4), 3), round(t_quantile(0.9, 1), 3)
    (2.093, 2.776, 3.078)
    """
    if not 0 < p < 1 or df <= 0:
        raise InputError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def paired_interval(diffs: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of paired differences and its two-sided Student-t interval at ``level``.

    >>> m, lo, hi = paired_interval([0.1, 0.2, 0.0, 0.3, 0.1])
    >>> round(m, 3), round(lo, 3), round(hi, 3)  # t(.975, 4) = 2.776, SD .114
    (0.14, -0.002, 0.282)
    """
    n = len(diffs)
    if n < 2:
        raise InputError(f"a paired interval needs at least 2 differences, got {n}")
    mean = math.fsum(diffs) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class LabelEvidence:
    """What the judged queries show: per query, nDCG@10 of the calibrated ranking, the given order and the
    uncalibrated method; the calibrated-minus-given differences' mean (``gain``) and its 95 % interval."""

    calibrated: tuple[float, ...]
    given: tuple[float, ...]
    uncalibrated: tuple[float, ...]
    gain: float
    low: float
    high: float

    @classmethod
    def of(cls, calibrated: Sequence[float], given: Sequence[float], uncalibrated: Sequence[float],
           level: float = LEVEL) -> LabelEvidence:
        gain, low, high = paired_interval([c - g for c, g in zip(calibrated, given, strict=True)], level)
        return cls(tuple(calibrated), tuple(given), tuple(uncalibrated), gain, low, high)

    @property
    def calibrate(self) -> bool:
        """Calibrate: the interval's lower end above zero (:func:`label_verdict`)."""
        return label_verdict(self.low)

    @property
    def uncalibrated_gain(self) -> float:
        return math.fsum(u - g for u, g in zip(self.uncalibrated, self.given)) / max(1, len(self.given))

    def p_value(self) -> float:
        """The one-sided paired t-test's p-value of "calibrating does not beat the given order"."""
        n = len(self.given)
        half = self.high - self.gain
        if half <= 0:
            return 0.0 if self.gain > 0 else 1.0
        se = half / t_quantile(0.5 + LEVEL / 2, n - 1)
        return 1.0 - _t_cdf(self.gain / se, n - 1)


def label_verdict(low: float) -> bool:
    """Calibrate only when the interval's lower end is above zero: calibrating beats the given order."""
    return low > 0.0


def judged_triples(judged: Any) -> list[tuple[str, list[Any], list[int]]]:
    """``judged`` as ``(query, passages, grades)`` triples, checked: one grade (an integer >= 0) per passage; lists
    with fewer than two passages or no graded passage say nothing about an order and are left out; at least
    :data:`MIN_JUDGED` remain, else an :class:`~.errors.InputError`."""
    if isinstance(judged, (str, bytes)) or not hasattr(judged, "__iter__"):
        raise InputError("judged must be a sequence of (query, passages, grades) triples")
    out = []
    for i, item in enumerate(judged):
        try:
            query, passages, grades = item
        except (TypeError, ValueError):
            raise InputError(f"judged item {i}: expected a (query, passages, grades) triple, got {type(item).__name__}") \
                from None
        if not isinstance(query, str):
            raise InputError(f"judged item {i}: the query must be a string, got {type(query).__name__}")
        passages, grades = list(passages), list(grades)
        if len(passages) != len(grades):
            raise InputError(f"judged item {i} ({query[:40]!r}): {len(passages)} passages but {len(grades)} grades")
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in grades):
            raise InputError(f"judged item {i} ({query[:40]!r}): grades must be integers >= 0, got {grades[:5]}...")
        if len(passages) >= 2 and any(grades):
            out.append((query, passages, grades))
    if len(out) < MIN_JUDGED:
        raise InputError(f"judged: {len(out)} usable judged queries (two passages or more, one graded above 0); "
                         f"a decision from labels needs at least {MIN_JUDGED} (20 or more are typical)")
    return out


def uncalibrated(method: str) -> str:
    """The uncalibrated counterpart of a calibrated method: what calibration is measured against besides the
    given order."""
    return "first-token" if method.startswith("first-token") else "vanilla"


Scores = tuple[list[float], list[float], list[float]]


def _rankers(reranker: Any) -> Any:
    opts = reranker.options
    if not opts.calibrated:
        raise InputError(f"decide() decides whether to calibrate; method {opts.method!r} does not calibrate: use "
                         "method='auto', 'capcal' or 'first-token-capcal'")
    if opts.guard is None:
        raise InputError("decide() sets the decision the content check uses, and guard=None has no check (it always "
                         "calibrates): decide with the reranker you rank with, guard='query' (the default)")
    return reranker.with_options(guard=None)


def _add(scores: Scores, order: Sequence[int], plain: Sequence[int], grades: Sequence[int]) -> None:
    for column, ranked in zip(scores, (order, range(len(grades)), plain)):
        column.append(ndcg10(ranked, grades))


def rank_judged(reranker: Any, judged: Sequence[Judged]) -> Scores:
    """nDCG@10 per judged list (checked triples: :func:`judged_triples`) of the calibrated ranking, the given order
    and the uncalibrated method, each ranked by ``reranker`` with its options (``guard=None``: no check)."""
    calibrated, scores, plain = _rankers(reranker), ([], [], []), None
    for query, passages, grades in judged:
        ranking = calibrated.rerank(query, passages)
        plain = plain or reranker.with_options(guard=None, method=uncalibrated(ranking.method))
        _add(scores, ranking.order, plain.rerank(query, passages).order, grades)
    return scores


async def arank_judged(reranker: Any, judged: Sequence[Judged]) -> Scores:
    """:func:`rank_judged` over the async API."""
    calibrated, scores, plain = _rankers(reranker), ([], [], []), None
    for query, passages, grades in judged:
        ranking = await calibrated.arerank(query, passages)
        plain = plain or reranker.with_options(guard=None, method=uncalibrated(ranking.method))
        _add(scores, ranking.order, (await plain.arerank(query, passages)).order, grades)
    return scores


def label_decision(caps: Any, opts: Any, scores: Scores) -> ContentDecision:
    """The decision of these options' key on a probed endpoint (``caps``) from the judged lists' ``scores``
    (:func:`rank_judged`): "reads" (calibrate) when :func:`label_verdict` says so, at the alpha the calibrated
    rankings used (``"auto"`` without the check is 1)."""
    evidence = LabelEvidence.of(*scores)
    alpha = float(opts.alpha) if isinstance(opts.alpha, (int, float)) else 1.0
    n = len(evidence.given)
    return ContentDecision(evidence.calibrate, "reads" if evidence.calibrate else "does not read", evidence.p_value(),
                           1.0, evidence.gain, n, alpha, alpha, (), decision_key(caps.model, caps.weights, opts),
                           judged=n, gain=evidence.gain, gain_low=evidence.low, gain_high=evidence.high,
                           uncalibrated_gain=evidence.uncalibrated_gain)
