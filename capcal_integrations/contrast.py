"""Does a model read the passages? The slot-paired contrast of two readings of the same lists.

Each deciding list is read a second time with its two halves
swapped (:func:`halves_swapped`: the passages of slots ``j`` and ``j + n/2`` trade places). For a pair
of slots, ``dA`` is the log-probability difference of the two slots in the given reading and ``dB`` in
the swapped one. Whatever the slots do (the prior, a real-vs-empty mismatch, a last-digit effect) is the
same in both readings, so it cancels in ``dA - dB``, which is twice the difference of the two passages'
content (plus noise). Without content, ``dA`` and ``dB`` are two exchangeable draws of the same slot
contrast in every list; with content, they move apart (``dA`` up where ``dB`` is down). The statistic
``T = -sum (dA - m)(dB - m)`` (``m`` the mean of the slot pair's values over the lists) is referred to
its exact permutation distribution: the values of each slot pair permuted across lists and readings.
Nothing is assumed about the slot effects' shape, the noise's distribution or ties (labels at one
floor value are exchangeable too). Measured on the testbed (:mod:`capcal_integrations.testbed`):
about 1 % false passes in every slot scenario, power >= 0.97 at a content slope of 0.5 logits per grade.

**The calibration strength** (``alpha="auto"``) is chosen on the same lists, label-free: the ``alpha``
whose calibrated rankings of the given and the swapped reading agree most (mean Kendall tau), each
ranking the decoding the first-step distributions imply (every later step the same distributions
restricted to the labels left: :func:`implied_order`).

Pure functions; no I/O. :mod:`.content_check` decides with them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .calibration import calibrated
from .orders import kendall_tau, order_of_scores

__all__ = ["ALPHAS", "PERMUTATIONS", "halves_swapped", "Reading", "Contrast", "paired_contrast", "implied_order",
           "choose_alpha"]

#: The strengths tried by ``alpha="auto"``.
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
#: Permutations of the test's reference distribution.
PERMUTATIONS = 999


def halves_swapped(n: int) -> list[int]:
    """The second reading's order: slot ``j`` shows passage ``perm[j]``, the halves traded (for odd ``n``
    the last passage stays).

    >>> halves_swapped(4), halves_swapped(5)
    ([2, 3, 0, 1], [2, 3, 0, 1, 4])
    """
    h = n // 2
    return [*range(h, 2 * h), *range(h), *range(2 * h, n)]


@dataclass(frozen=True)
class Reading:
    """One list's first-step log-probabilities by slot: the given reading, the halves-swapped one and the
    empty prompt's (for choosing ``alpha``). Any additive constant per reading is irrelevant."""

    real: tuple[float, ...]
    swapped: tuple[float, ...]
    empty: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Contrast:
    """The slot-paired contrast of some readings: ``T``, the content-to-noise ratio (mean square of the
    within-list half-differences over that of the slot-pair sums about their means; about 1 without
    content), the permutation p-value, and the lists and slot pairs it pooled."""

    statistic: float
    ratio: float
    p_value: float
    lists: int
    pairs: int


def paired_contrast(readings: Sequence[Reading], permutations: int = PERMUTATIONS, seed: int = 0) -> Contrast:
    """The slot-paired contrast test (module docstring). Lists of different lengths are separate strata.

    Two lists of four passages; the model adds ``c`` to each passage (content) and ``b`` to each slot:

    >>> b, c1, c2 = [1.0, 0.0, 0.5, -1.0], [2.0, 0.0, 0.0, 1.0], [0.0, 1.0, 2.0, 0.0]
    >>> def reading(c):
    ...     swapped = [c[i] for i in halves_swapped(4)]
    ...     return Reading(tuple(x + y for x, y in zip(b, c)), tuple(x + y for x, y in zip(b, swapped)))
    >>> t = paired_contrast([reading(c1), reading(c2)])
    >>> t.statistic, t.lists, t.pairs  # pair 1: dA, dB = 2.5, -1.5 and -1.5, 2.5 (m = .5); pair 2: 0, 2 and 2, 0
    (10.0, 2, 2)
    >>> flat = paired_contrast([reading([0.0] * 4), reading([0.0] * 4)])  # slots only: nothing left
    >>> abs(flat.statistic), flat.p_value
    (0.0, 1.0)
    """
    strata: dict[int, list[tuple[list[float], list[float]]]] = {}
    for r in readings:
        n = len(r.real)
        if n < 4 or len(r.swapped) != n:
            continue
        h = n // 2
        da = [r.real[j] - r.real[j + h] for j in range(h)]
        db = [r.swapped[j] - r.swapped[j + h] for j in range(h)]  # slot j shows passage j + h, and the reverse
        strata.setdefault(n, []).append((da, db))
    cells = []  # per (stratum, slot pair): the values (dA_k, dB_k) of its lists, centred
    for group in strata.values():
        if len(group) < 2:
            continue
        for j in range(len(group[0][0])):
            values = [v for da, db in group for v in (da[j], db[j])]
            m = math.fsum(values) / len(values)
            cells.append([v - m for v in values])
    lists = sum(len(g) for g in strata.values() if len(g) >= 2)
    if not cells:
        return Contrast(0.0, 1.0, 1.0, lists, 0)

    def statistic(cell_values: list[list[float]]) -> float:
        return -math.fsum(c[2 * k] * c[2 * k + 1] for c in cell_values for k in range(len(c) // 2)) + 0.0

    observed = statistic(cells)
    # the ratio, for the reader: within-list half-differences against slot-pair half-sums (centred: the
    # cell's values sum to zero, so the half-sums' mean is zero too)
    n_lists = sum(len(c) // 2 for c in cells)
    half_diff = math.fsum(((c[2 * k] - c[2 * k + 1]) / 2) ** 2 for c in cells for k in range(len(c) // 2)) / n_lists
    half_sum = math.fsum(((c[2 * k] + c[2 * k + 1]) / 2) ** 2 for c in cells for k in range(len(c) // 2)) / (
        n_lists - len(cells))
    ratio = half_diff / half_sum if half_sum > 0 else (math.inf if half_diff > 0 else 1.0)
    rng = random.Random(seed)
    beyond = 0
    shuffled = [list(c) for c in cells]
    for _ in range(permutations):
        for c in shuffled:
            rng.shuffle(c)
        beyond += statistic(shuffled) >= observed - 1e-12 * (1 + abs(observed))
    return Contrast(observed, ratio, (beyond + 1) / (permutations + 1), lists, len(cells))


def implied_order(real: Sequence[float], empty: Sequence[float] | None, alpha: float, form: str = "additive",
                  first_only: bool = False) -> list[int]:
    """The ranking (slots, best first) that calibrated decoding gives when every later step's distributions
    are the first step's restricted to the labels left (renormalised); ``first_only``: the first step's order.

    >>> import math
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


def choose_alpha(readings: Sequence[Reading], alphas: Sequence[float] = ALPHAS, form: str = "additive",
                 first_only: bool = False) -> tuple[float, dict[float, float]]:
    """The strength whose implied rankings of the given and the swapped reading agree most (mean Kendall
    tau over the lists, passage by passage), and that agreement per strength; ties go to the one nearest 1."""
    usable = [r for r in readings if r.empty is not None and len(r.real) >= 2]
    if not usable:
        return 1.0, {}
    curve = {}
    for alpha in alphas:
        taus = []
        for r in usable:
            perm = halves_swapped(len(r.real))
            given = implied_order(r.real, r.empty, alpha, form, first_only)
            swapped = [perm[j] for j in implied_order(r.swapped, r.empty, alpha, form, first_only)]
            taus.append(kendall_tau(given, swapped))
        curve[float(alpha)] = math.fsum(taus) / len(taus)
    best = max(curve.values())
    return min((a for a, t in curve.items() if t >= best - 1e-12), key=lambda a: (abs(a - 1.0), a)), curve


def _softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]
