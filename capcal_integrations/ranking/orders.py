"""Pure functions on orderings: sliding windows, aggregation and rank-consistent scores (the argsort of scores
is :func:`~..calibration.formulas.order_of_scores`, Kendall's tau :mod:`..calibration.strength`'s; both importable
here too). No I/O; each example in a docstring is worked out by hand."""

from __future__ import annotations

from collections.abc import Sequence

from ..calibration.formulas import order_of_scores
from ..calibration.strength import kendall_tau, mean_pairwise_tau

__all__ = ["windows", "borda", "order_of_scores", "rank_scores", "kendall_tau", "mean_pairwise_tau"]


def windows(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """Back-to-front sliding windows ``[start, end)`` over ``n`` ranked items, as RankGPT runs them.

    The last window is shifted to start at 0 rather than shrunk, so the top is always compared in a
    full window (RankGPT's loop would skip the head when ``n - size`` is not a multiple of ``stride``).

    >>> windows(100, 20, 10)[:2], len(windows(100, 20, 10)), windows(100, 20, 10)[-1]
    ([(80, 100), (70, 90)], 9, (0, 20))
    >>> windows(25, 20, 10)
    [(5, 25), (0, 20)]
    >>> windows(20, 20, 10), windows(5, 20, 10), windows(0, 20, 10)
    ([(0, 20)], [(0, 5)], [])
    """
    if n <= 0:
        return []
    if n <= size:
        return [(0, n)]
    out = []
    end = n
    while True:
        start = max(0, end - size)
        out.append((start, start + size))
        if start == 0:
            return out
        end -= stride


def borda(rankings: Sequence[Sequence[int]], n: int) -> list[int]:
    """Borda aggregation: an item at rank ``r`` (0-based) of a list of ``n`` earns ``n - 1 - r``
    points; ties are broken by the input index. Returns the aggregated order.

    >>> borda([[0, 1, 2], [1, 0, 2], [1, 2, 0]], 3)  # points: 0 -> 3, 1 -> 5, 2 -> 1
    [1, 0, 2]
    """
    points = [0] * n
    for ranking in rankings:
        for r, item in enumerate(ranking):
            points[item] += n - 1 - r
    return sorted(range(n), key=lambda i: (-points[i], i))


def rank_scores(order: Sequence[int], confidence: Sequence[float]) -> tuple[float, ...]:
    """``(n - r - 1 + c) / n`` for the item at rank ``r``: strictly follows ``order``.

    >>> rank_scores([2, 0, 1], [0.5, 1.0, 0.25])  # ranks 2 -> 0, 0 -> 1, 1 -> 2; c is capped at 0.999
    (0.5, 0.333, 0.75)
    """
    n = len(order)
    scores = [0.0] * n
    for r, item in enumerate(order):
        scores[item] = (n - r - 1 + min(max(confidence[item], 0.0), 0.999)) / n
    return tuple(scores)
