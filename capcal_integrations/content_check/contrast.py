"""Does a model read the passages? Four readings of a query's list, and a sequential test over queries.

**The readings.** A query's list (its top window, ``n >= 4`` passages, ``h = n // 2`` slot pairs ``(k, k + h)``)
is read at the first decoding step in four orders (:func:`reading_orders`): ``A`` as given, ``B`` with its
halves swapped, ``C`` with the slot pairs rotated by one (passage pair ``m`` shown at slot pair ``m - 1``),
and ``D``: ``C`` with its halves swapped. For passage pair ``m`` (passages ``m`` and ``m + h``),

* ``e1 = dA - dB`` at the slot pair that shows it in ``A``/``B``, and
* ``e2 = dC - dD`` at the slot pair that shows it in ``C``/``D``,

where ``d`` is the log-probability difference of the pair's two slots in one reading. Whatever the slots do
(the prior, a real-vs-empty mismatch, a last-digit effect, slot effects of this one list shared by its
readings) is the same in the two readings of a difference and cancels; what is left is twice the content
difference of the two passages, plus noise. ``e1`` and ``e2`` are two estimates of the same content
difference from different slots. Without content their noises are independent and each is symmetric
about zero (the two readings of a difference are exchangeable), so ``sign(e1 * e2)`` is a fair coin for
every pair, whatever the noise's size, shape or ties.

**The score of a query** (:func:`agreement`) is the weighted share of pairs whose two estimates agree in
sign, ``X = sum w_m sign(e1_m e2_m) / sum w_m`` with ``w_m = |e1_m e2_m|`` (bounded in [-1, 1]; the weights
are sign-free, so ``E[X] = 0`` without content, in any list, at any noise scale). A model that reads
moves both estimates the same way: ``X > 0``.

**Which way the content goes** (:func:`alignment`): in the given order the first half holds the first stage's
better-ranked passages, so a model that reads for relevance prefers passage ``m`` to ``m + h`` more often than
not: ``sum (e1 + e2) / sum |e1 + e2|`` is positive on average. A model whose consistent preferences run against
the retriever's order (measured on the packaged 0.5B: it prefers the lower half) is not one to calibrate.

**The sequential test** over queries is :class:`~.evidence.Evidence` (:mod:`.evidence`).

**The calibration strength** (``alpha="auto"``) is chosen on the same readings, label-free
(:func:`alpha_of_readings`): the ``alpha`` whose calibrated rankings of the four readings, mapped back to the
passages, agree most (mean Kendall tau over the pairs of readings).

Pure functions; no I/O. :mod:`.content_check` decides with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..calibration.strength import ALPHAS, MARGIN, choose, implied_order

__all__ = ["ALPHAS", "MIN_PASSAGES", "halves_swapped", "rotated_pair", "reading_orders", "Reading", "estimates",
           "estimate", "agreement", "alignment", "summary", "share", "implied_order", "alpha_of_readings"]

#: The shortest list that can be read for the check (two slot pairs).
MIN_PASSAGES = 4


def halves_swapped(n: int) -> list[int]:
    """Reading ``B``: slot ``j`` shows passage ``perm[j]``, the halves traded (for odd ``n`` the last passage stays).

    >>> halves_swapped(4), halves_swapped(5)
    ([2, 3, 0, 1], [2, 3, 0, 1, 4])
    """
    return rotated_pair(n, 0)[1]


def rotated_pair(n: int, by: int) -> tuple[list[int], list[int]]:
    """A pair of orders that shows every passage pair ``m`` (passages ``m`` and ``m + h``) at slot pair ``m - by``,
    both ways: the slot pairs rotated by ``by``, and the same with its halves swapped (for odd ``n`` the last
    passage stays).

    >>> rotated_pair(4, 0), rotated_pair(5, 1)
    (([0, 1, 2, 3], [2, 3, 0, 1]), ([1, 0, 3, 2, 4], [3, 2, 1, 0, 4]))
    """
    h = n // 2
    rotated = [(k + by) % h for k in range(h)]
    tail = list(range(2 * h, n))
    return [*rotated, *(r + h for r in rotated), *tail], [*(r + h for r in rotated), *rotated, *tail]


def reading_orders(n: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """The four readings' orders (slot ``j`` shows passage ``order[j]``): as given, halves swapped, slot pairs
    rotated by one, and rotated with halves swapped (:func:`rotated_pair` by 0 and by 1).

    >>> reading_orders(4)
    ([0, 1, 2, 3], [2, 3, 0, 1], [1, 0, 3, 2], [3, 2, 1, 0])
    >>> reading_orders(7)[2]
    [1, 2, 0, 4, 5, 3, 6]
    """
    return (*rotated_pair(n, 0), *rotated_pair(n, 1))


@dataclass(frozen=True)
class Reading:
    """One query's first-step log-probabilities by slot in the four orders of :func:`reading_orders`, and the
    empty prompt's (for choosing ``alpha``). Any additive constant per reading is irrelevant."""

    slots: tuple[tuple[float, ...], ...]
    empty: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.slots[0]) if self.slots else 0
        if len(self.slots) not in (4, 6, 8, 12) or n < MIN_PASSAGES or any(len(s) != n for s in self.slots):
            raise ValueError(f"a reading is four vectors (eight or twelve for the query-free contrast, .query_contrast) "
                             f"of one length >= {MIN_PASSAGES}, got {[len(s) for s in self.slots]}")


def estimates(reading: Reading) -> tuple[list[float], list[float]]:
    """``(e1, e2)`` per passage pair ``m``: the two slot-free estimates of its content difference (module docstring).

    Slot effects ``b`` cancel; content ``c`` remains, twice:

    >>> b, c = [1.0, 0.0, 0.5, -1.0], [2.0, 0.0, 0.0, 1.0]
    >>> slots = tuple(tuple(b[j] + c[o[j]] for j in range(4)) for o in reading_orders(4))
    >>> estimates(Reading(slots))  # pair 0: 2 * (2 - 0); pair 1: 2 * (0 - 1)
    ([4.0, -2.0], [4.0, -2.0])
    """
    a, b, c, d = reading.slots[:4]  # the query-free contrast's eight: the four with the query come first
    first, second, third, fourth = reading_orders(len(a))
    return estimate(first, second, a, b), estimate(third, fourth, c, d)


def estimate(first: Sequence[int], second: Sequence[int], a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per passage pair ``m``, its content difference from two readings ``a``, ``b`` of a pair of orders that show
    passages ``m`` and ``m + h`` at the same two slots both ways: the slots' effects cancel.

    >>> estimate([0, 1, 2, 3], [2, 3, 0, 1], [2.0, 0.0, 0.0, 1.0], [0.0, 1.0, 2.0, 0.0])
    [4.0, -2.0]
    """
    h = len(first) // 2
    out = []
    for m in range(h):
        s, t = first.index(m), first.index(m + h)
        if second[s] != m + h or second[t] != m:
            raise ValueError(f"orders {first} and {second} do not show passages {m} and {m + h} both ways")
        out.append((a[s] - a[t]) - (b[s] - b[t]))
    return out


def agreement(reading: Reading) -> float:
    """The query's score: the share of passage pairs whose two content estimates agree in sign, weighted by
    ``|e1 e2|``, in [-1, 1]; 0 where no pair has information (a model that ignores the passages).

    >>> b, c = [1.0, 0.0, 0.5, -1.0], [2.0, 0.0, 0.0, 1.0]
    >>> agreement(Reading(tuple(tuple(b[j] + c[o[j]] for j in range(4)) for o in reading_orders(4))))
    1.0
    >>> agreement(Reading(((0.0,) * 4,) * 4))
    0.0
    """
    return share([x * y for x, y in zip(*estimates(reading))])


def summary(reading: Reading) -> tuple[float, float, int]:
    """``(agreement, alignment, pairs)`` of one query, as :meth:`Evidence.add` takes them (its estimates computed once)."""
    e1, e2 = estimates(reading)
    return share([x * y for x, y in zip(e1, e2)]), share([x + y for x, y in zip(e1, e2)]), len(e1)


def share(values: Sequence[float]) -> float:
    """``sum(values) / sum(|values|)`` in [-1, 1]: the signed share of the values' weight; 0 where there is none."""
    total = math.fsum(abs(v) for v in values)
    return max(-1.0, min(1.0, math.fsum(values) / total)) if total > 0 and math.isfinite(total) else 0.0


def alignment(reading: Reading) -> float:
    """Which way the query's content estimates go against the first stage's order, in [-1, 1]: positive where the
    model prefers the better-ranked passage of a pair (the given order's first half), weighted by the size of the
    preference; 0 where there is none.

    >>> b, c = [1.0, 0.0, 0.5, -1.0], [2.0, 1.0, 0.0, 1.0]  # the first half reads better: 2 > 0, 1 = 1
    >>> alignment(Reading(tuple(tuple(b[j] + c[o[j]] for j in range(4)) for o in reading_orders(4))))
    1.0
    """
    return share([x + y for x, y in zip(*estimates(reading))])


def alpha_of_readings(readings: Sequence[Reading], alphas: Sequence[float] = ALPHAS, form: str = "additive",
                 first_only: bool = False) -> tuple[float, dict[float, float]]:
    """The strength whose implied rankings of the four readings, passage by passage, agree most
    (:func:`.strength.choose`; another than 1 only by :data:`~.strength.MARGIN` standard errors), and that
    agreement per strength; 1 without an empty prompt's reading."""
    usable = [r for r in readings if r.empty is not None]
    if not usable:
        return 1.0, {}
    queries = [list(zip(reading_orders(len(r.empty)), ((x, r.empty) for x in r.slots))) for r in usable]
    return choose(queries, lambda view, alpha: implied_order(*view, alpha, form, first_only), alphas, MARGIN)
