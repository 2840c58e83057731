"""The query-free contrast: does the model's preference among the passages depend on the query?

The content check (:mod:`.contrast`) asks whether the passages move the model, slot effects cancelled. A model
with consistent preferences of its own (length, style, a word) passes that test without reading the query;
both packaged models have such preferences on DL19 (``benchmarks/results/real-decision-*.md``), and the
alignment evidence that keeps them out also delays a reader (``benchmarks/results/tradeoff.md``). This rule
reads each query's list in the same four orders (:func:`~.contrast.reading_orders`) twice: with the query, and
with the query replaced by :data:`~.prompts.QUERY_PLACEHOLDER`. For passage pair ``m``, what the query adds is
``d1 = e1 - f1`` and ``d2 = e2 - f2`` (:func:`~.contrast.estimates` of the two readings). Slot effects cancel
in each estimate, and a preference that is the same whatever the query cancels in the difference; what is
left is twice the query's effect on the pair, plus noise.

* The query's **score** is the weighted share of pairs whose two ``d``, each **centred** over the list's pairs
  (:func:`centred`), agree in sign. Centring removes what the query adds alike to every pair: in the given order
  the pair ``(m, m + h)`` is always ``h`` first-stage ranks apart, so a query effect that only lifts the
  first-stage's better half (a lexical match; what both packaged models show on DL19:
  ``benchmarks/results/query-free-*.md``) is a constant and scores 0 like no effect at all; a reader's differs
  from pair to pair with relevance and remains. ``E = 0`` when the query changes nothing or only shifts every
  pair alike: the centred noises of the two estimates are independent and each symmetric about zero;
* its **alignment** is ``sum(d1 + d2) / sum |d1 + d2|`` (not centred), positive when what the query adds goes
  the first stage's way.

A :class:`~.contrast.Reading` of this rule holds eight vectors: the four orders with the query, then the same
four query-free. Pure functions; the rule is registered in :mod:`.rules` (``guard="query"``).
"""

from __future__ import annotations

from .contrast import Reading, estimates, share

__all__ = ["split", "differences", "centred", "scores", "summary"]


def split(reading: Reading) -> tuple[Reading, Reading]:
    """The readings with the query (the first four vectors) and without it (the last four)."""
    if len(reading.slots) != 8:
        raise ValueError(f"the query-free contrast needs eight readings (four with the query, four without), "
                         f"got {len(reading.slots)}")
    return Reading(reading.slots[:4], reading.empty), Reading(reading.slots[4:], reading.empty)


def differences(reading: Reading) -> tuple[list[float], list[float]]:
    """``(d1, d2)`` per passage pair: what the query adds to each of the two slot-free estimates."""
    with_query, free = split(reading)
    (q1, q2), (f1, f2) = estimates(with_query), estimates(free)
    return [a - b for a, b in zip(q1, f1)], [a - b for a, b in zip(q2, f2)]


def centred(values: list[float]) -> list[float]:
    """``values`` less their mean: what differs from pair to pair.

    >>> centred([3.0, 1.0, 2.0])
    [1.0, -1.0, 0.0]
    """
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def scores(d1: list[float], d2: list[float]) -> tuple[float, float, int]:
    """``(score, alignment, pairs)`` from the two estimates of what the query adds (module docstring).

    A shift alike in every pair scores 0, however large; a difference between pairs counts:

    >>> scores([5.0, 5.0, 5.0], [5.0, 5.0, 5.0])
    (0.0, 1.0, 3)
    >>> scores([6.0, 4.0, 5.0], [6.5, 4.5, 4.0])[0]
    1.0
    """
    c1, c2 = centred(d1), centred(d2)
    return share([x * y for x, y in zip(c1, c2)]), share([x + y for x, y in zip(d1, d2)]), len(d1)


def summary(reading: Reading) -> tuple[float, float, int]:
    """``(score, alignment, pairs)`` of what the query adds, as :meth:`~.contrast.Evidence.add` takes them.

    A preference the query does not change scores 0; one it creates scores 1:

    >>> from capcal_integrations.contrast import reading_orders
    >>> b, own, rel = [1.0, 0.0, 0.5, -1.0], [0.3, -0.2, 0.1, 0.4], [2.0, 0.0, 0.0, 1.0]
    >>> read = lambda c: [tuple(b[j] + c[o[j]] for j in range(4)) for o in reading_orders(4)]
    >>> [round(x, 3) for x in summary(Reading((*read([x + y for x, y in zip(own, rel)]), *read(own))))]
    [1.0, 0.333, 2]
    >>> summary(Reading((*read(own), *read(own))))
    (0.0, 0.0, 2)
    """
    return scores(*differences(reading))

