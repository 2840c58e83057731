"""Position-bias measures, as pure functions on plain sequences.

Positions are 1-based input slots (the identifier ``[k]`` a passage had in the prompt); rankings are
sequences of item ids, best first.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterable, Mapping, Sequence

from ..ranking.orders import kendall_tau, mean_pairwise_tau

__all__ = [
    "shuffle_of",
    "position_histogram",
    "kl_from_uniform",
    "expected_kl_uniform",
    "kendall_tau",
    "mean_pairwise_tau",
    "pick_needle",
    "needle_list",
    "rank_of",
    "mean_by_position",
]


def shuffle_of(n: int, key: str) -> list[int]:
    """A deterministic random permutation of ``range(n)`` for ``key`` (e.g. ``"qid/3"``): the same
    shuffles whatever the run order, so interrupted runs resume onto identical lists.

    >>> shuffle_of(5, "q/0") == shuffle_of(5, "q/0"), sorted(shuffle_of(5, "q/0"))
    (True, [0, 1, 2, 3, 4])
    """
    return random.Random(key).sample(range(n), n)


def position_histogram(positions: Iterable[int], n: int) -> list[int]:
    """Counts of 1-based positions ``1..n``.

    >>> position_histogram([1, 1, 3], 4)
    [2, 0, 1, 0]
    """
    counts = [0] * n
    for p in positions:
        if not 1 <= p <= n:
            raise ValueError(f"position {p} outside 1..{n}")
        counts[p - 1] += 1
    return counts


def kl_from_uniform(counts: Sequence[float]) -> float:
    """``KL(P || U)`` in nats for the empirical distribution ``P`` of ``counts`` over ``len(counts)`` slots;
    0 for a uniform histogram, ``log n`` when every count falls in one slot.

    >>> kl_from_uniform([5, 5, 5, 5])
    0.0
    >>> round(kl_from_uniform([4, 0, 0, 0]), 4)  # log 4
    1.3863
    >>> round(kl_from_uniform([3, 1]), 4)  # .75 log 1.5 + .25 log .5
    0.1308
    """
    total = math.fsum(counts)
    if total <= 0:
        raise ValueError("empty histogram")
    n = len(counts)
    return max(0.0, math.fsum(c / total * math.log(c / total * n) for c in counts if c > 0))


def expected_kl_uniform(samples: int, n: int, *, draws: int = 2000, seed: int = 0) -> float:
    """The KL from uniform that a perfectly position-free ranker would still show with only ``samples``
    top-1 observations over ``n`` slots (sampling noise; about ``(n - 1) / (2 samples)``), by simulation.

    >>> 0.15 < expected_kl_uniform(50, 20) < 0.23
    True
    """
    rng = random.Random(seed)
    total = 0.0
    for _ in range(draws):
        total += kl_from_uniform(position_histogram((rng.randrange(n) + 1 for _ in range(samples)), n))
    return total / draws


def pick_needle(candidates: Sequence[str], grades: Mapping[str, int], n: int,
                min_grade: int = 2) -> tuple[str, list[str]] | None:
    """A needle and ``n - 1`` distractors from one candidate list (first-stage order): the needle is the
    highest-graded candidate (``>= min_grade``; ties to the better first-stage rank), the distractors the
    first ``n - 1`` candidates judged non-relevant (grade 0; unjudged ones are not trusted). ``None`` when
    the list has no such needle or too few distractors.

    >>> pick_needle(["a", "b", "c", "d", "e"], {"a": 0, "b": 2, "c": 3, "d": 0, "e": 0}, 3)
    ('c', ['a', 'd'])
    >>> pick_needle(["a", "b"], {"a": 1, "b": 0}, 2) is None
    True
    """
    best = max((grades.get(d, 0), -r, d) for r, d in enumerate(candidates))
    if best[0] < min_grade:
        return None
    distractors = [d for d in candidates if d in grades and grades[d] == 0][: n - 1]
    return (best[2], distractors) if len(distractors) == n - 1 else None


def needle_list(needle: str, distractors: Sequence[str], position: int) -> list[str]:
    """The distractors with the needle inserted at 1-based ``position``.

    >>> needle_list("N", ["a", "b", "c"], 1), needle_list("N", ["a", "b", "c"], 4)
    (['N', 'a', 'b', 'c'], ['a', 'b', 'c', 'N'])
    """
    if not 1 <= position <= len(distractors) + 1:
        raise ValueError(f"position {position} outside 1..{len(distractors) + 1}")
    return [*distractors[: position - 1], needle, *distractors[position - 1:]]


def rank_of(order: Sequence[Hashable], item: Hashable) -> int:
    """1-based rank of ``item`` in ``order``.

    >>> rank_of(["x", "N", "y"], "N")
    2
    """
    return list(order).index(item) + 1


def mean_by_position(rows: Iterable[Sequence[float]]) -> list[float]:
    """Element-wise mean of equal-length rows (e.g. first-step probabilities by input slot).

    >>> mean_by_position([[0.5, 0.5], [1.0, 0.0]])
    [0.75, 0.25]
    """
    rows = [list(r) for r in rows]
    if not rows:
        return []
    if len({len(r) for r in rows}) != 1:
        raise ValueError("rows differ in length")
    return [math.fsum(col) / len(rows) for col in zip(*rows, strict=True)]
