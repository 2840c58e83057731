"""The query-free contrast: does the model's preference among the passages depend on the query?

The content check (:mod:`.contrast`) asks whether the passages move the model, slot effects cancelled. A model
with consistent preferences of its own (length, style, a word) passes that test without reading the query;
both packaged models have such preferences on DL19 (``benchmarks/results/real-decision-*.md``), and the
alignment evidence that keeps them out also delays a reader (``benchmarks/results/tradeoff.md``). This rule
reads each query's list in pairs of orders (:func:`reading_orders`: the content check's four, and for lists of
fewer than :data:`THIRD_BELOW` slot pairs a third pair), each order twice: with the query, and with the query
replaced by :data:`~.prompts.QUERY_PLACEHOLDER`. A pair of orders shows every passage pair ``m`` (passages
``m`` and ``m + h``) at one slot pair in both orientations, so the slot effects cancel in its estimate of the
pair's content difference (:func:`estimate`); a preference that is the same whatever the query cancels in the
difference of the estimates with and without the query, ``d_i = e_i - f_i`` (:func:`differences`). What is left
is twice the query's effect on the pair, plus noise, ``K`` times over (``K`` pairs of orders).

Each ``d_i`` is **centred** over the list's pairs (:func:`centred`): in the given order the pair ``(m, m + h)`` is
always ``h`` first-stage ranks apart, so a query effect that only lifts the first stage's better half (a lexical
match; what both packaged models show on DL19: ``benchmarks/results/query-free-*.md``) is a constant and drops
out like no effect at all; a reader's differs from pair to pair with relevance and remains.

**Without a query effect** (or with one alike in every pair) the ``K`` centred estimates are independent and each
is symmetric about zero, so flipping the sign of any of them leaves their distribution unchanged. The query's
**e-value** (:func:`judge`) compares the observed signs with all ``2^(K-1)`` sign patterns (a flip of all of them
changes nothing): ``exp(kappa T) / mean over patterns of exp(kappa T')``, with ``T = sum_{i<j} <c_i, c_j> / S`` the
estimates' agreement (``S`` their mean square, the same for every pattern) and ``kappa = KAPPA * (h - 1)``. Its
mean is exactly 1 without a query effect, whatever the noise's size, shape or ties, so the product over queries
is a test martingale (:class:`~.contrast.Evidence`); one query multiplies it by at most ``2^(K-1)``: 2 for a long
list, 4 for a short one read in three pairs of orders.

* the query's **score** is the mean over pairs of estimates of the weighted share of passage pairs whose centred
  estimates agree in sign (in [-1, 1]; the "does not read" side of the test);
* its **alignment** is ``sum(d_1 + ... + d_K) / sum |d_1 + ... + d_K|`` (not centred), positive when what the
  query adds goes the first stage's way.

A :class:`~.contrast.Reading` of this rule holds ``4K`` vectors: the ``2K`` orders with the query, then the same
orders query-free. Pure functions; the rule is registered in :mod:`.rules` (``guard="query"``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from . import contrast
from .contrast import Reading, estimate, rotated_pair, share

__all__ = ["THIRD_BELOW", "KAPPA", "reading_orders", "split", "estimate", "differences", "centred", "judge", "summary"]

#: Lists of fewer slot pairs than this are read in a third pair of orders (twelve readings instead of eight): a
#: short list's two estimates agree by chance too often to bet much on (mixed lengths 3-30 at s = 1: "reads"
#: within 12 queries in 92-95 % of testbed runs with two, 98.8-100 % with three; ``benchmarks/results/decisions-query.md``).
THIRD_BELOW = 10
#: How strongly one query's agreement counts, per degree of freedom of its centred estimates (``kappa = KAPPA *
#: (h - 1)``); chosen on the testbed's mixed lengths (0.15-0.5 tried: ``benchmarks/results/decisions-query.md``).
KAPPA = 0.15


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


def differences(reading: Reading) -> list[list[float]]:
    """``d_i`` per pair of orders ``i`` and passage pair: what the query adds to each slot-free estimate."""
    with_query, free = split(reading)
    orders = reading_orders(len(reading.slots[0]))
    if len(orders) != len(with_query.slots):
        raise ValueError(f"a list of {len(reading.slots[0])} passages is read in {len(orders)} orders, got "
                         f"{len(with_query.slots)}")
    out = []
    for i in range(0, len(orders), 2):
        q = estimate(orders[i], orders[i + 1], with_query.slots[i], with_query.slots[i + 1])
        f = estimate(orders[i], orders[i + 1], free.slots[i], free.slots[i + 1])
        out.append([x - y for x, y in zip(q, f)])
    return out


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


def summary(reading: Reading) -> tuple[float, float, int, float]:
    """``(score, alignment, pairs, e)`` of what the query adds, as :meth:`~.contrast.Evidence.add` takes them.

    A preference the query does not change counts for nothing; one it creates does:

    >>> b, own, rel = [1.0, 0.0, 0.5, -1.0, 0.2, 0.3], [0.3, -0.2, 0.1, 0.4, 0.0, 0.1], [2.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    >>> read = lambda c: [tuple(b[j] + c[o[j]] for j in range(6)) for o in reading_orders(6)]
    >>> [round(x, 3) for x in summary(Reading((*read([x + y for x, y in zip(own, rel)]), *read(own))))]
    [1.0, 1.0, 3, 2.101]
    >>> summary(Reading((*read(own), *read(own))))
    (0.0, 0.0, 3, 1.0)
    """
    return judge(differences(reading))
