"""An anytime-valid test of "the mean is at most ``m``" for bounded differences, by betting, and the confidence
sequence it gives (Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by betting", JRSS B:
the capital process of a bettor against the mean, here a mixture over a fixed grid of betting fractions).

**The test.** Differences ``d_1, d_2, ...`` in ``[-1, 1]`` arrive one at a time (a judged query each: calibrated
minus given nDCG@10). A bettor who stakes the fraction ``f`` of her wealth on "the mean is above ``m``" multiplies
it by ``1 + f (d - m) / (1 + m)`` per difference (``(d - m) / (1 + m) >= -1``: never below ``1 - f >= 0``). Where
each difference's mean, given the ones before it, is at most ``m``, each factor's is at most 1, so the wealth is a
nonnegative supermartingale, and so is the average of several bettors' (:data:`FRACTIONS`, equal shares). Ville's
inequality: the probability that it *ever* reaches ``1 / level`` is at most ``level``, at any number of looks,
with any stopping rule, for any distribution of the differences in ``[-1, 1]`` (skewed ones included). No normal
approximation and no minimum number of differences is involved.

**The interval.** The ``m`` whose wealth has not reached ``1 / level`` form the one-sided confidence sequence;
the same bet on "below ``m``" gives the upper end (:func:`interval`: each side at ``level``, so ``1 - 2 level``
together, valid at every number of differences at once). Its lower end is above 0 exactly when the test at
``m = 0`` has crossed.

**The fractions.** A single fraction ``f`` grows the wealth fastest where the mean gain is about ``f`` times the
mean square of the differences; a mixture pays at most ``log(len(FRACTIONS))`` for not knowing which. The testbed's
readers have large gains (.14 to .32 nDCG@10, SD about .23), for which the best fraction is above 1, so the power is
in the largest fractions; .5 keeps gains that are small against their spread (or a few large losses) within reach.
Measured on the testbed's judged pools (``python -m benchmarks.decisions judged``; 2,000 random orders of the 97 queries a reader;
the share calibrated by 30 judged queries for s = 1 / .5, the median count for s = .25):

================================  ==============  ===============
fractions                         by 30: s=1, .5  median, s = .25
================================  ==============  ===============
.1, .2, ..., .9                   100, 85.1 %     47
.25, .5, .75, .95                 100, 96.9 %     42
**.5, .75, .95** (these)          100, 98.8 %     39
.95 alone                         100, 99.9 %     34
================================  ==============  ===============

``.95`` alone is the most powerful on these readers but loses 95 % of its wealth on a difference of -1 and never
finds a gain of .05 with an SD of .3; the three together cost ``log 3`` against it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError

__all__ = ["FRACTIONS", "LEVEL", "THRESHOLD", "e_process", "crossing", "lower_bound", "interval"]

#: The betting fractions, each bettor holding an equal share of the starting wealth (the choice: module docstring).
FRACTIONS = (0.5, 0.75, 0.95)
#: One side's error: the wealth must reach ``1 / LEVEL`` (40) for "the mean is above ``m``".
LEVEL = 0.025
THRESHOLD = 1 / LEVEL


def _checked(diffs: Sequence[float]) -> list[float]:
    out = [float(d) for d in diffs]
    if not all(-1.0 <= d <= 1.0 for d in out):
        raise InputError(f"betting needs differences in [-1, 1], got {min(out):.3g} to {max(out):.3g}")
    return out


def e_process(diffs: Sequence[float], m: float = 0.0, fractions: Sequence[float] = FRACTIONS) -> list[float]:
    """The mixture's wealth against "the mean is at most ``m``" after each difference in turn (the e-process;
    ``m = 0``: against "calibrating gains nothing").

    >>> e_process([0.5, -0.5], fractions=(0.5,))  # 1.25, then 1.25 * .75
    [1.25, 0.9375]
    >>> e_process([0.5, 0.5], fractions=(0.5, 1.0))[-1]  # (1.25 ** 2 + 1.5 ** 2) / 2: order does not change it
    1.90625
    >>> round(e_process([0.5, -0.25], m=0.5, fractions=(0.5,))[-1], 4)  # (1 + .5 * 0 / 1.5) (1 + .5 * -.75 / 1.5)
    0.75
    """
    if not -1.0 < m < 1.0:
        raise InputError(f"betting on a mean above m needs -1 < m < 1, got {m}")
    own = [1.0] * len(fractions)
    out = []
    for d in _checked(diffs):
        own = [w * (1.0 + f * (d - m) / (1.0 + m)) for w, f in zip(own, fractions)]
        out.append(sum(own) / len(own))
    return out


def crossing(diffs: Sequence[float], threshold: float = THRESHOLD, fractions: Sequence[float] = FRACTIONS) -> int:
    """How many differences it took the e-process to reach ``threshold`` (then the test rejects "the mean is at
    most 0", for good: a stopped e-process is still valid), or 0 if it has not.

    >>> crossing([0.9] * 10, fractions=(0.95,))  # 1.855 ** 5 = 21.9, ** 6 = 40.7
    6
    >>> crossing([0.9] * 5, fractions=(0.95,)), crossing([0.9] * 6 + [-1.0], fractions=(0.95,))
    (0, 6)
    """
    for t, w in enumerate(e_process(diffs, 0.0, fractions), 1):
        if w >= threshold:
            return t
    return 0


def lower_bound(diffs: Sequence[float], threshold: float = THRESHOLD, fractions: Sequence[float] = FRACTIONS) -> float:
    """The lower end of the one-sided confidence sequence after ``diffs``, intersected over the running counts
    (each count's bound holds at once, so the largest does): the largest ``m`` whose bet reached ``threshold`` at
    some count (``-1`` with none). Each count's wealth falls as ``m`` grows, so does their maximum: bisection.

    >>> round(lower_bound([0.9] * 6, fractions=(0.95,)), 4)  # (1 + .95 (.9 - m) / (1 + m)) ** 6 = 40: m = .0059 / 1.8941
    0.0032
    >>> lower_bound([0.9] * 6 + [-1.0] * 3, fractions=(0.95,)) == lower_bound([0.9] * 6, fractions=(0.95,))
    True
    >>> lower_bound([])
    -1.0
    """
    diffs = _checked(diffs)
    lo, hi = -1.0, 1.0
    if not diffs:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid <= -1.0 or max(e_process(diffs, mid, fractions)) >= threshold:
            lo = mid
        else:
            hi = mid
    return lo


def interval(diffs: Sequence[float], threshold: float = THRESHOLD,
             fractions: Sequence[float] = FRACTIONS) -> tuple[float, float]:
    """The confidence sequence for the mean of ``diffs``: ``(low, high)``, each side at ``1 / threshold``
    (:func:`lower_bound`, and the same for the negated differences), valid at every count at once. Its lower end
    is above 0 exactly when the e-process has crossed (:func:`crossing`). Both ends are intersections over the
    counts, so the interval may come out empty (``low > high``): a chance of at most ``2 / threshold``.

    >>> low, high = interval([0.9] * 6, fractions=(0.95,))
    >>> round(low, 4), round(high, 4)  # high: (1 + .95 (m - .9) / (1 - m)) ** 6 = 40, m = 1.7941 / 1.8941
    (0.0032, 0.9472)
    """
    return lower_bound(diffs, threshold, fractions), -lower_bound([-d for d in diffs], threshold, fractions)
