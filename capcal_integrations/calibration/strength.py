"""The calibration strength ``alpha``, chosen label-free: one grid, one agreement curve, one tie-break.

A reranker without position bias ranks a list alike whatever order it is shown in. Both label-free
choices of ``alpha`` use that: :func:`choose` ranks each query's list as read in several orders (the
content check's four readings, :mod:`.contrast`; or ``choose_alpha``'s random shuffles, :mod:`..tuning`)
at every strength of the grid, maps each ranking back to the passages, and keeps the strength whose
rankings agree most (mean Kendall tau over the pairs of readings, averaged over the queries); among
equally agreeing strengths the one nearest 1 (:func:`pick`); the content check's choice keeps 1 unless the best
beats it by :data:`MARGIN` standard errors over the queries. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from itertools import combinations
from typing import TypeVar

from .formulas import calibrated, order_of_scores

__all__ = ["kendall_tau", "mean_pairwise_tau", "ALPHAS", "MARGIN", "pick", "choose", "agreement_of", "implied_order"]

#: The strengths tried (0 = no calibration).
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
#: The content check's ``alpha="auto"`` chooses a strength other than 1 only where its agreement beats 1's by more
#: than this many standard errors (paired over the queries; ``choose_alpha`` keeps the highest agreement). On the
#: testbed the query rule decides after ~9 queries, and the best-agreeing strength of so few lost up to .043 nDCG@10
#: to CapCal at 1 after the decision; with 2, every fixed-shape cell is within .01 of the best fixed method
#: (``benchmarks/results/quality/quality.md``, run ``after-decision``).
MARGIN = 2.0

View = TypeVar("View")


def pick(curve: dict[float, float]) -> float:
    """The strength of highest agreement; ties go to the one nearest 1 (then the smaller).

    >>> pick({0.5: 0.8, 1.5: 0.8, 2.0: 0.1})
    0.5
    """
    best = max(curve.values())
    return min((a for a, t in curve.items() if t >= best - 1e-12), key=lambda a: (abs(a - 1.0), a))


def choose(queries: Sequence[Sequence[tuple[Sequence[int], View]]], order_of: Callable[[View, float], list[int]],
           alphas: Sequence[float] = ALPHAS, margin: float = 0.0) -> tuple[float, dict[float, float]]:
    """``(alpha, curve)``: each query is its readings ``(perm, view)`` (``perm[slot]``: the passage a slot showed);
    ``order_of(view, alpha)`` ranks one reading's slots at that strength. ``curve[alpha]``: the mean over the
    queries of the mean Kendall tau between their readings' rankings, passage by passage. With ``margin``, a
    strength other than 1 must beat 1's agreement by ``margin`` standard errors (paired over the queries).

    >>> views = [[([0, 1], (0.6, 0.4)), ([1, 0], (0.3, 0.7))]]  # passage 0 wins in both readings
    >>> choose(views, lambda p, a: order_of_scores(p), alphas=(0.0, 1.0))
    (1.0, {0.0: 1.0, 1.0: 1.0})
    """
    taus = {float(alpha): [agreement_of(readings, order_of, alpha) for readings in queries] for alpha in alphas}
    curve = {alpha: math.fsum(t) / len(t) for alpha, t in taus.items()}
    best = pick(curve)
    if margin and 1.0 in taus and best != 1.0 and len(queries) > 1:  # another strength must beat 1 by margin SEs
        gains = [a - b for a, b in zip(taus[best], taus[1.0])]
        mean = math.fsum(gains) / len(gains)
        se = math.sqrt(math.fsum((g - mean) ** 2 for g in gains) / (len(gains) - 1) / len(gains))
        if mean <= margin * se:
            best = 1.0
    return best, curve


def agreement_of(readings: Sequence[tuple[Sequence[int], View]], order_of: Callable[[View, float], list[int]],
                 alpha: float) -> float:
    """One query's agreement at ``alpha``: the mean Kendall tau between its readings' rankings, passage by passage."""
    return mean_pairwise_tau([[perm[j] for j in order_of(view, alpha)] for perm, view in readings])


def implied_order(real: Sequence[float], empty: Sequence[float] | None, alpha: float, form: str = "additive",
                  first_only: bool = False) -> list[int]:
    """The ranking (slots, best first) that calibrated decoding gives when every later step's distributions
    are the first step's restricted to the labels left (renormalised); ``first_only``: the first step's order.
    ``real`` and ``empty``: log-probabilities by slot.

    >>> p, q = [math.log(x) for x in (0.5, 0.3, 0.2)], [math.log(x) for x in (0.6, 0.2, 0.2)]
    >>> implied_order(p, q, 0.0), implied_order(p, q, 1.0)
    ([0, 1, 2], [1, 2, 0])
    """
    remaining, order = list(range(len(real))), []
    while len(remaining) > 1:
        p = _softmax([real[i] for i in remaining])
        scores = p if empty is None else calibrated(p, _softmax([empty[i] for i in remaining]), alpha, form)
        ranked = order_of_scores(scores)
        if first_only:
            return order + [remaining[j] for j in ranked]
        order.append(remaining.pop(ranked[0]))
    return order + remaining


def _softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]


def kendall_tau(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Kendall's tau between two rankings (best first) of the same items: ``(concordant - discordant)
    / (n (n - 1) / 2)``. 1 = identical order, -1 = reversed.

    >>> kendall_tau("abc", "abc"), kendall_tau("abc", "cba")
    (1.0, -1.0)
    >>> kendall_tau("abcd", "bacd")  # 1 discordant pair of 6: (5 - 1) / 6
    0.6666666666666666
    """
    if sorted(map(str, a)) != sorted(map(str, b)) or len(set(a)) != len(a):
        raise ValueError("kendall_tau needs two orderings of the same distinct items")
    n = len(a)
    if n < 2:
        return 1.0
    where = {item: r for r, item in enumerate(b)}
    mapped = [where[item] for item in a]
    discordant = sum(1 for i, j in combinations(range(n), 2) if mapped[i] > mapped[j])
    pairs = n * (n - 1) // 2
    return (pairs - 2 * discordant) / pairs


def mean_pairwise_tau(rankings: Sequence[Sequence[Hashable]]) -> float:
    """Mean Kendall tau over all pairs of rankings of the same items (1.0 = order-invariant).

    >>> mean_pairwise_tau(["abc", "abc", "cba"])  # pairs: 1, -1, -1
    -0.3333333333333333
    """
    pairs = list(combinations(rankings, 2))
    if not pairs:
        raise ValueError("need at least two rankings")
    return math.fsum(kendall_tau(a, b) for a, b in pairs) / len(pairs)
