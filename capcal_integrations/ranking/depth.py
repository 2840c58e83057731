"""How deep a ranking is decoded (``Options.depth``): pure functions, no I/O.

A RAG chat keeps the best 3-5 of 20 passages, yet a full listwise decoding takes 19 steps. With
``depth=d`` only the first ``d`` places are decoded; each step costs the same, so the saving is the
steps not taken (19 -> 5 for ``d=5`` over 20 passages, the real and the empty stream alike).

The rules, stated once here and called by :mod:`.strategies`:

* **One window.** Decoding stops once ``d`` places are chosen. The passages left follow the last
  decoded step's scores (calibrated for ``capcal``, the model's probabilities for ``vanilla``): that
  step has read all of them, so this costs nothing and is better than no order at all. They are
  *not* decoded places: :attr:`~.types.Ranking.decoded` says how many leading places are, and each
  passage's ``details()`` says which. Because decoding is greedy, the first ``d`` places are the
  first ``d`` places of the full decoding (same prompts, same steps).
* **Sliding windows** (back to front, :func:`~.orders.windows`). The top window decodes to the depth.
  A lower window only feeds the window above it: the places it passes up (its top ``size - stride``,
  the overlap) are re-ranked there, and its lower places are final. So a lower window decodes its
  overlap (which passages go up, in the order the window above will see them: the same as at full
  depth) plus any of its final places that lie within the depth (:func:`window_depths`).
* **PSC** decodes each shuffle to the depth and aggregates by Borda count over the decoded places
  only (:func:`borda_decoded`): a passage below a shuffle's depth gets the mean of the points left.
  At full depth this is plain Borda.
* ``first-token`` methods read one step whatever the depth.
"""

from __future__ import annotations

from collections.abc import Sequence

from .orders import windows

__all__ = ["window_depths", "below_depth", "borda_decoded", "decoded_places", "depth_note"]


def window_depths(n: int, size: int, stride: int, depth: int | None) -> list[int | None]:
    """For each window of ``windows(n, size, stride)`` (in the order they run, bottom first), how many
    places it decodes; ``None``: all of them (a window of ``m`` passages is whole after ``m - 1`` steps).

    >>> window_depths(20, 20, 10, 5)  # one window: decode 5 places
    [5]
    >>> window_depths(30, 20, 10, 5)  # (10, 30) passes 10 up to (0, 20), which decodes 5
    [10, 5]
    >>> window_depths(30, 20, 10, 25)  # places 20..24 are final in (10, 30): it decodes 15
    [15, None]
    >>> window_depths(25, 20, 10, 3), window_depths(30, 20, 10, None), window_depths(20, 20, 10, 19)
    ([15, 3], [None, None], [None])
    """
    spans = windows(n, size, stride)
    out: list[int | None] = []
    for k, (start, end) in enumerate(spans):
        m = min(end, n) - start
        if depth is None:
            out.append(None)
            continue
        carried = spans[k + 1][1] - start if k + 1 < len(spans) else 0  # places the window above re-ranks
        need = max(carried, depth - start)
        out.append(None if need >= m - 1 else need)
    return out


def below_depth(candidates: Sequence[int], scores: Sequence[float], chosen: int) -> list[int]:
    """The order of the passages left below the depth: ``candidates`` other than ``chosen`` by the last
    decoded step's ``scores``, highest first (ties: the earlier candidate first).

    >>> below_depth([4, 7, 9, 2], [0.1, 0.5, 0.2, 0.2], chosen=7)
    [9, 2, 4]
    """
    ranked = sorted(range(len(candidates)), key=lambda j: (-scores[j], j))
    return [candidates[j] for j in ranked if candidates[j] != chosen]


def borda_decoded(rankings: Sequence[Sequence[int]], decoded: Sequence[int | None], n: int) -> list[int]:
    """Borda aggregation over each ranking's decoded places only. A passage at decoded rank ``r``
    earns ``n - 1 - r`` points; one below a ranking's ``k`` decoded places earns the mean of the points
    left, ``(n - 1 - k) / 2`` (so undecoded places say nothing about their order). ``None``: all decoded
    (then this is :func:`~.orders.borda`). Ties are broken by the input index.

    >>> borda_decoded([[0, 1, 2, 3], [1, 0, 2, 3]], [1, 1], 4)  # 0: 3 + 1, 1: 1 + 3, 2 and 3: 1 + 1
    [0, 1, 2, 3]
    >>> borda_decoded([[2, 0, 1, 3], [2, 1, 0, 3]], [2, 2], 4)  # 2: 6, 0: 2 + .5, 1: .5 + 2, 3: 1
    [2, 0, 1, 3]
    """
    twice = [0] * n  # points doubled, so that the means stay integers
    for ranking, k in zip(rankings, decoded):
        k = len(ranking) if k is None else k
        for r, item in enumerate(ranking):
            twice[item] += 2 * (n - 1 - r) if r < k else n - 1 - k
    return sorted(range(n), key=lambda i: (-twice[i], i))


def decoded_places(n: int, depth: int | None) -> int | None:
    """How many leading places of a ranking of ``n`` are decoded at ``depth``; ``None``: all.

    >>> decoded_places(20, 5), decoded_places(20, 19), decoded_places(3, None)
    (5, None, None)
    """
    return None if depth is None or depth >= n - 1 else depth


def depth_note(n: int, decoded: int, how: str) -> str:
    """The note a ranking carries when places were left undecoded.

    >>> depth_note(20, 5, "the last decoded step's scores")
    "depth=5: places 6-20 were not decoded; they follow the last decoded step's scores"
    """
    return f"depth={decoded}: places {decoded + 1}-{n} were not decoded; they follow {how}"
