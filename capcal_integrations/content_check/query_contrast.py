"""The query-free contrast: does the model's preference among the passages depend on the query?

The content check (:mod:`.contrast`) asks whether the passages move the model, slot effects cancelled. A model
with consistent preferences of its own (length, style, a word) passes that test without reading the query;
both packaged models have such preferences on DL19 (the ``real-decision-*`` runs of the decisions results), and the
alignment evidence that keeps them out also delays a reader (its ``tradeoff`` run). This rule
reads each query's list in pairs of orders (:func:`reading_orders`: the content check's four, and for lists of
fewer than :data:`THIRD_BELOW` slot pairs a third pair), each order twice: with the query, and with the query
replaced by :data:`~.prompts.QUERY_PLACEHOLDER`. A pair of orders shows every passage pair ``m`` (passages
``m`` and ``m + h``) at one slot pair in both orientations, so the slot effects cancel in its estimate of the
pair's content difference (:func:`estimate`); a preference that is the same whatever the query cancels in the
difference of the estimates with and without the query, ``d_i = e_i - f_i`` (:func:`differences`). What is left
is twice the query's effect on the pair, plus noise, ``K`` times over (``K`` pairs of orders).

Each ``d_i`` is **centred** over the list's pairs (:func:`centred`): in the given order the pair ``(m, m + h)`` is
always ``h`` first-stage ranks apart, so a query effect that only lifts the first stage's better half (a lexical
match; what both packaged models show on DL19: the ``query-free-*`` runs) is a constant and drops
out like no effect at all; a reader's differs from pair to pair with relevance and remains.

**Without a query effect** (or with one alike in every pair) the ``K`` centred estimates are independent and each
is symmetric about zero, so flipping the sign of any of them leaves their distribution unchanged. The query's
**e-value** (:func:`judge`) compares the observed signs with all ``2^(K-1)`` sign patterns (a flip of all of them
changes nothing): ``exp(kappa T) / mean over patterns of exp(kappa T')``, with ``T = sum_{i<j} <c_i, c_j> / S`` the
estimates' agreement (``S`` their mean square, the same for every pattern) and ``kappa = KAPPA * (h - 1)``. Its
mean is exactly 1 without a query effect, whatever the noise's size, shape or ties; one query multiplies the
evidence by at most ``2^(K-1)``: 2 for a long list, 4 for a short one read in three pairs of orders.

**Sharper with the query.** Real models prefer, with the query, a sharper copy of what they prefer without it (the
packaged 0.5B's consistent signal is 1.31x larger with the query, the 1.5B's 1.67x): ``d_i = (lambda - 1) f_i``
agrees from pair to pair though nothing is read. So a query's e-value is the least, over ``lambda`` in :data:`SCALES`
(0.5-2), of the sign-flip e-value of ``e_i - lambda f_i`` (:func:`judge_scaled`): at most the one at the model's own
scale (mean at most 1), so the product over queries is a test supermartingale for any such model, its scale free to
change from query to query. The taste gate takes the same least over 0.5-3 (:data:`WIDE_SCALES`).

* the query's **score** is the mean over pairs of estimates of the weighted share of passage pairs whose centred
  estimates agree in sign (in [-1, 1]; the "does not read" side of the test);
* its **alignment** is ``sum(d_1 + ... + d_K) / sum |d_1 + ... + d_K|`` (not centred), positive when what the
  query adds goes the first stage's way;
* its **taste** is the same score of the with-query estimates ``e_i`` alone, with their sign-flip e-value: whether,
  with the query, the model prefers some passages consistently at all (the "does not read" / "cannot tell" split of
  :class:`~.evidence.Evidence`).

A :class:`~.contrast.Reading` of this rule holds ``4K`` vectors: the ``2K`` orders with the query, then the same
orders query-free. Pure functions; the rule is registered in :mod:`.rules` (``guard="query"``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from . import contrast
from .contrast import Reading, estimate, rotated_pair, share

__all__ = ["THIRD_BELOW", "KAPPA", "SCALES", "WIDE_SCALES", "reading_orders", "split", "estimate", "estimate_pairs",
           "differences", "centred", "judge", "judge_scaled", "relation", "summary", "facts"]

#: Lists of fewer slot pairs than this are read in a third pair of orders (twelve readings instead of eight): a
#: short list's two estimates agree by chance too often to bet much on (mixed lengths 3-30 at s = 1: "reads"
#: within 12 queries in 92-95 % of testbed runs with two, 98.8-100 % with three; the ``decisions-query`` run).
THIRD_BELOW = 10
#: How strongly one query's agreement counts, per degree of freedom of its centred estimates (``kappa = KAPPA *
#: (h - 1)``); chosen on the testbed's mixed lengths (0.15-0.5 tried: the ``decisions-query`` run).
KAPPA = 0.15
#: The scales ``lambda`` of a model's own preference that the rule's null allows (with the query, a model may prefer
#: what it prefers without it, more or less sharply): a query's e-value is the least over these (:func:`judge_scaled`).
#: Down to 0.5 (a dampened copy costs a reader nothing); not above 2: subtracting a larger multiple of the noisy
#: query-free estimates drowns a reader's signal (up to 3 or 4: readers at s = .5 "read" within 24 queries in 50-90 %
#: of runs); a sharper copy is left to the taste gate (:func:`relation`, :data:`WIDE_SCALES`, :class:`~.evidence.Evidence`).
SCALES = tuple(sorted({1.0, *(round(0.5 * 4.0 ** (k / 20), 4) for k in range(21))}))  # 0.5 ... 2.0, geometric, and 1
#: The scales 2-3 (the same geometric step) of the taste gate's e-value over 0.5-3: the least of a query's e-value over
#: :data:`SCALES` and over these (:class:`~.evidence.Evidence`: "reads" needs their product at ``WIDE_E``, or more).
WIDE_SCALES = tuple(round(2.0 * 1.5 ** (k / 6), 4) for k in range(7))


def reading_orders(n: int) -> list[list[int]]:
    """The rule's orders (slot ``j`` shows passage ``order[j]``), in pairs that show each passage pair at one slot
    pair both ways: the content check's four (:func:`~.contrast.reading_orders`), then for lists of fewer than
    :data:`THIRD_BELOW` slot pairs the slot pairs rotated by two (two slot pairs: passages ``m`` and ``m + h`` side
    by side instead).

    >>> reading_orders(4)[4:]
    [[0, 2, 1, 3], [2, 0, 3, 1]]
    >>> reading_orders(7)[4:]
    [[2, 0, 1, 5, 3, 4, 6], [5, 3, 4, 2, 0, 1, 6]]
    >>> len(reading_orders(20))
    4
    """
    h = n // 2
    orders = list(contrast.reading_orders(n))
    if h >= THIRD_BELOW:
        return orders
    if h == 2:  # rotating two slot pairs by two is no rotation
        tail = list(range(4, n))
        return [*orders, [0, 2, 1, 3, *tail], [2, 0, 3, 1, *tail]]
    return [*orders, *rotated_pair(n, 2)]


def split(reading: Reading) -> tuple[Reading, Reading]:
    """The readings with the query (the first half of the vectors) and without it (the second half)."""
    k = len(reading.slots)
    if k not in (8, 12):
        raise ValueError(f"the query-free contrast needs eight or twelve readings (the orders with the query, then "
                         f"without), got {k}")
    return Reading(reading.slots[:k // 2], reading.empty), Reading(reading.slots[k // 2:], reading.empty)


def estimate_pairs(reading: Reading) -> tuple[list[list[float]], list[list[float]]]:
    """``(e, f)``: per pair of orders ``i`` and passage pair, the slot-free estimate with the query (``e_i``) and
    without it (``f_i``)."""
    with_query, free = split(reading)
    orders = reading_orders(len(reading.slots[0]))
    if len(orders) != len(with_query.slots):
        raise ValueError(f"a list of {len(reading.slots[0])} passages is read in {len(orders)} orders, got {len(free.slots)}")
    es, fs = [], []
    for i in range(0, len(orders), 2):
        es.append(estimate(orders[i], orders[i + 1], with_query.slots[i], with_query.slots[i + 1]))
        fs.append(estimate(orders[i], orders[i + 1], free.slots[i], free.slots[i + 1]))
    return es, fs


def differences(reading: Reading, scale: float = 1.0) -> list[list[float]]:
    """``d_i = e_i - scale * f_i`` per pair of orders ``i`` and passage pair: what the query adds to each slot-free
    estimate beyond ``scale`` times the model's query-free preference."""
    es, fs = estimate_pairs(reading)
    return [[x - scale * y for x, y in zip(e, f)] for e, f in zip(es, fs)]


def _dot(x: Sequence[float], y: Sequence[float]) -> float:
    return math.fsum(u * v for u, v in zip(x, y))


def centred(values: list[float]) -> list[float]:
    """``values`` less their mean: what differs from pair to pair.

    >>> centred([3.0, 1.0, 2.0])
    [1.0, -1.0, 0.0]
    """
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def judge(ds: Sequence[Sequence[float]]) -> tuple[float, float, int, float]:
    """``(score, alignment, pairs, e)`` from the ``K`` estimates of what the query adds (module docstring).

    A shift alike in every pair counts for nothing, however large; estimates that agree from pair to pair do:

    >>> judge([[5.0, 5.0, 5.0], [5.0, 5.0, 5.0]])
    (0.0, 1.0, 3, 1.0)
    >>> [round(x, 3) for x in judge([[6.0, 4.0, 5.0], [6.5, 4.5, 4.0]])]
    [1.0, 1.0, 3, 1.215]
    """
    cs = [centred(list(d)) for d in ds]
    k, h = len(cs), len(cs[0])
    pairs = list(itertools.combinations(range(k), 2))
    score = sum(share([x * y for x, y in zip(cs[i], cs[j])]) for i, j in pairs) / len(pairs)
    aligned = share([sum(col) for col in zip(*ds)])
    scale = math.fsum(x * x for c in cs for x in c) / k
    if not scale > 0 or not math.isfinite(scale):
        return score, aligned, h, 1.0
    kappa = KAPPA * max(1, h - 1)
    agree = {(i, j): kappa * math.fsum(x * y for x, y in zip(cs[i], cs[j])) / scale for i, j in pairs}
    ts = [sum(g * signs[i] * signs[j] for (i, j), g in agree.items())
          for signs in ((1, *rest) for rest in itertools.product((1, -1), repeat=k - 1))]
    top = max(ts)
    return score, aligned, h, math.exp(ts[0] - top) / (math.fsum(math.exp(t - top) for t in ts) / len(ts))


def judge_scaled(es: Sequence[Sequence[float]], fs: Sequence[Sequence[float]], scales: Sequence[float] | None = None
                 ) -> tuple[float, float, int, float]:
    """:func:`judge` of ``d_i = e_i - lambda f_i`` at the scale ``lambda`` that gives the least e-value, from
    ``min(SCALES)`` to ``max(SCALES)`` (the grid :data:`SCALES`, then refined between the best point's neighbours):
    ``(score, alignment, pairs, e)`` at that scale.

    For each fixed ``lambda``, a model whose preference with the query is ``lambda`` times its query-free one (plus
    noise, plus an effect alike in every pair) leaves estimates ``d_i`` that are symmetric and independent, so that
    scale's e-value has mean at most 1; the least over the scales is at most the true scale's, and so is a valid
    e-value for every model of that null, whatever its scale (which may differ from query to query). A query effect
    that is no multiple of the model's own preference (relevance) remains at every scale.

    A sharper copy of the model's own taste is no evidence; relevance on top of it is:

    >>> own, rel = [1.0, -2.0, 0.5, 3.0, -1.5], [2.0, 0.0, -1.0, 1.0, -2.0]
    >>> n1, n2, n3 = [0.1, -0.2, 0.05, 0.1, -0.1], [-0.1, 0.05, 0.1, -0.15, 0.0], [0.0, 0.1, -0.1, 0.05, 0.1]
    >>> free = [own, [x + n for x, n in zip(own, n3)]]
    >>> sharper = [[1.3 * x + n for x, n in zip(own, n1)], [1.3 * x + n for x, n in zip(own, n2)]]
    >>> d = [[x - y for x, y in zip(e, f)] for e, f in zip(sharper, free)]  # what the query adds at scale 1
    >>> round(judge(d)[3], 3), round(judge_scaled(sharper, free)[3], 3)
    (1.516, 0.982)
    >>> round(judge_scaled([[x + r for x, r in zip(e, rel)] for e in sharper], free)[3], 3)
    1.53
    """
    ce, cf = [centred(list(e)) for e in es], [centred(list(f)) for f in fs]
    k, h = len(ce), len(ce[0]) if ce else 0
    if k < 2 or h < 1:
        return judge([list(e) for e in es]) if es else (0.0, 0.0, 0, 1.0)

    # <c_i(l), c_j(l)> = ee - l (ef + fe) + l^2 ff, c_i(l) = centred(e_i) - l centred(f_i): any scale's e-value from these
    quad = {(i, j): (_dot(ce[i], ce[j]), _dot(ce[i], cf[j]) + _dot(cf[i], ce[j]), _dot(cf[i], cf[j]))
            for i in range(k) for j in range(i, k)}
    e_at = _e_at(quad, k, KAPPA * max(1, h - 1))
    grid = sorted(SCALES if scales is None else scales)
    values = [e_at(x) for x in grid]
    i = min(range(len(grid)), key=values.__getitem__)
    best, best_e = grid[i], values[i]
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    for _ in range(16):  # golden-section search of the least e-value between the best point's neighbours (to 1e-4)
        a, b = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        fa, fb = e_at(a), e_at(b)
        for x, fx in ((a, fa), (b, fb)):
            if fx < best_e:
                best, best_e = x, fx
        lo, hi = (lo, b) if fa <= fb else (a, hi)
    score, aligned, pairs_, _ = judge([[x - best * y for x, y in zip(e, f)] for e, f in zip(es, fs)])
    return score, aligned, pairs_, best_e


def _e_at(quad: dict[tuple[int, int], tuple[float, float, float]], k: int, kappa: float) -> Callable[[float], float]:
    """:func:`judge`'s e-value of ``centred(e_i) - scale * centred(f_i)`` by scale, from the inner products ``quad``. For
    ``K = 2`` (lists of ten slot pairs or more) the same arithmetic written out, with the same floats (a sum of two
    floats rounds as ``fsum`` does, ``x + 0.0`` is ``fsum([x])``): it runs some fifty times a query."""
    def general(scale: float) -> float:
        inner = {ij: a - scale * b + scale * scale * c for ij, (a, b, c) in quad.items()}
        norm = math.fsum(inner[i, i] for i in range(k)) / k
        if not norm > 0 or not math.isfinite(norm):
            return 1.0
        agree = [(i, j, kappa * inner[i, j] / norm) for i, j in itertools.combinations(range(k), 2)]
        ts = [math.fsum(g * signs[i] * signs[j] for i, j, g in agree)
              for signs in ((1, *rest) for rest in itertools.product((1, -1), repeat=k - 1))]
        top = max(ts)
        return math.exp(ts[0] - top) / (math.fsum(math.exp(t - top) for t in ts) / len(ts))

    if k != 2:
        return general
    (a0, b0, c0), (a1, b1, c1), (a, b, c) = quad[0, 0], quad[1, 1], quad[0, 1]

    def two(scale: float) -> float:
        squared = scale * scale
        total = (a0 - scale * b0 + squared * c0) + (a1 - scale * b1 + squared * c1)
        if not math.isfinite(total):  # where fsum would raise or differ
            return general(scale)
        if not total / 2 > 0:
            return 1.0
        g = kappa * (a - scale * b + squared * c) / (total / 2)
        t0, t1 = g + 0.0, -g + 0.0  # the sign patterns (1, 1) and (1, -1)
        top = max(t0, t1)
        first = math.exp(t0 - top)
        return first / ((first + math.exp(t1 - top)) / 2)

    return two


def relation(es: Sequence[Sequence[float]], fs: Sequence[Sequence[float]]) -> float:
    """How much of the model's with-query preference its query-free one accounts for: their correlation over the list's
    passage pairs (centred), from products of **different** pairs of orders only (each reading's own noise drops out:
    ``sum_{i != j} <e_i, f_j> / sqrt(sum <e_i, e_j> sum <f_i, f_j>)``), in [-1, 1]; 0 where either shows no signal.
    Near 1 for a copy of a taste that shows above the noise (scaled, sharpened non-linearly, per passage), .82 for the
    testbed's reader at s = .5 with a taste of SD .5, 0 for a plain reader; for a taste below the noise an estimate far
    from its true 1 (.76 on average at SD .17 sharpened 3x).

    >>> own, rel = [1.0, -2.0, 0.5, 3.0, -1.5], [2.0, 0.0, -1.0, 1.0, -2.0]
    >>> round(relation([[2 * x for x in own]] * 2, [own] * 2), 3), round(relation([rel] * 2, [own] * 2), 3)
    (1.0, 0.587)
    """
    ce, cf = [centred(list(e)) for e in es], [centred(list(f)) for f in fs]
    pairs = list(itertools.combinations(range(len(ce)), 2))
    ee = math.fsum(_dot(ce[i], ce[j]) for i, j in pairs)
    ff = math.fsum(_dot(cf[i], cf[j]) for i, j in pairs)
    ef = math.fsum(_dot(ce[i], cf[j]) + _dot(ce[j], cf[i]) for i, j in pairs) / 2
    if not (ee > 0 and ff > 0) or not math.isfinite(ee * ff):
        return 0.0
    return max(-1.0, min(1.0, ef / math.sqrt(ee * ff)))


def summary(reading: Reading) -> tuple[float, float, int, float, float, float, float, float]:
    """``(score, alignment, pairs, e, taste, e_taste, related, e_wide)``, as :meth:`~.evidence.Evidence.add` takes
    them: what the query adds (:func:`judge_scaled`), the with-query estimates' own agreement and sign-flip e-value
    (:func:`judge` of ``e_i``: does the model prefer some passages consistently with the query, whatever the reason),
    how much of that its query-free preference accounts for (:func:`relation`), and the query's e-value over the wider
    range of scales 0.5-3 (the least of ``e`` and :func:`judge_scaled` over :data:`WIDE_SCALES`).

    A preference the query does not change counts for nothing (though it is a taste); one it creates does:

    >>> b, own, rel = [1.0, 0.0, 0.5, -1.0, 0.2, 0.3], [0.3, -0.2, 0.1, 0.4, 0.0, 0.1], [2.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    >>> read = lambda c: [tuple(b[j] + c[o[j]] for j in range(6)) for o in reading_orders(6)]
    >>> [round(x, 3) for x in summary(Reading((*read([x + y for x, y in zip(own, rel)]), *read(own))))]
    [1.0, 0.902, 3, 2.101, 1.0, 2.101, 0.901, 2.101]
    >>> [round(x, 3) for x in summary(Reading((*read(own), *read(own))))]
    [0.0, 0.0, 3, 1.0, 1.0, 2.101, 1.0, 1.0]
    """
    return facts(*estimate_pairs(reading))


def facts(es: Sequence[Sequence[float]], fs: Sequence[Sequence[float]]
          ) -> tuple[float, float, int, float, float, float, float, float]:
    """:func:`summary` from the estimates with the query (``es``) and without it (``fs``)."""
    taste, _, _, e_taste = judge(es)
    scaled = judge_scaled(es, fs)
    return (*scaled, taste, e_taste, relation(es, fs), min(scaled[3], judge_scaled(es, fs, WIDE_SCALES)[3]))
