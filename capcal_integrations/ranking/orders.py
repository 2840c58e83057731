"""Pure functions on orderings: sliding windows, aggregation, argsort, rank-consistent scores and
Kendall's tau. No I/O; each example in a docstring is worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from itertools import combinations

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


def order_of_scores(scores: Sequence[float]) -> list[int]:
    """Indices by descending score; ties keep the earlier index first.

    >>> order_of_scores([0.1, 0.5, 0.2, 0.5])
    [1, 3, 2, 0]
    """
    return sorted(range(len(scores)), key=lambda j: (-scores[j], j))


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
