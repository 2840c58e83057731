"""Whether a label is certainly CapCal's choice at a step, from intervals of the joint probabilities.

A lazy step asks only some identifier-trie nodes. A label's joint probability is a product of node factors,
and a factor not asked lies in [0, 1], so on the real stream each label's probability ``a_i`` lies in
``[lo_i, hi_i]`` (``hi_i`` the product of the asked factors; ``lo_i = hi_i`` once every node of the label is
asked, else 0), and on the empty stream ``b_i`` in ``[lo'_i, hi'_i]``. These functions decide from such a box
alone whether label ``c`` is the whole reading's choice, whatever the unread factors are.

The additive form (normalised, the default) scores ``S_i = a_i/A - alpha (b_i/B - 1/n)``, ``A = sum a``, ``B = sum
b``; the raw form (``normalise=False``, the release's) ``S_i = a_i - alpha (b_i - 1/n)``. The whole reading takes
the largest ``S``, the earlier label on a tie. ``S_c - S_j = X - alpha Y`` with ``X = (a_c - a_j)/A`` and ``Y =
(b_c - b_j)/B``. Over the box, ``X`` is smallest at ``a_c = lo_c``, ``a_j = hi_j`` and, the other labels' mass
``R`` being in ``[R-, R+]``, at ``R+`` when ``lo_c >= hi_j`` (a non-negative numerator shrinks as ``A`` grows),
else at ``R-``; ``Y``'s extremes are the same corners on the empty stream. ``X`` and ``Y`` read disjoint
variables, and ``alpha`` (a point when fixed; adaptive, ``min(5 H / log n, 2)``, an interval from the entropy's
bounds, :func:`entropy_bounds`) enters linearly, so ``min X - max(alpha Y)`` over the corners of ``alpha``'s and
``Y``'s intervals is a lower bound of ``S_c - S_j`` over the whole box. ``c`` is certified when that bound
exceeds a rounding margin for every rival ``j`` (which also settles the earlier-index tie-break: a tie is never
certified). The normalisers are where laziness costs: ``A`` and ``B`` need lower bounds, and an unread label
gives none.

The log form (``calibration="log"``) is not certified here: its steps are read whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .formulas import ADAPTIVE_BETA, ADAPTIVE_CAP, entropy, normalise

__all__ = ["MARGIN", "Box", "entropy_bounds", "alpha_bounds", "rival_slacks", "certified"]

#: The smallest lower bound of ``S_c - S_j`` that certifies ``c``, relative to the scores' scale: far above the
#: rounding of either reading's arithmetic (about 1e-16), far below any difference that decides a real step.
MARGIN = 1e-9

#: A stream's intervals: per label, ``(lo, hi)`` of its joint probability.
Box = Sequence[tuple[float, float]]


def entropy_bounds(box: Box) -> tuple[float, float]:
    """Bounds of the entropy (nats) of ``a / sum(a)`` over ``a`` in ``box``, by the grouping rule: with ``K`` the
    labels known exactly (``lo == hi``), ``U`` the rest and ``w`` the share of ``U``,
    ``H = h(w) + (1 - w) H_K + w H_U``, ``0 <= H_U <= log |U|``; ``w`` lies between its values at ``U``'s least
    and largest mass. Concave in ``w``: the least at an end of ``w``'s interval, the largest at
    ``1 / (1 + exp(H_K - log |U|))`` clipped to it.

    >>> entropy_bounds([(.5, .5), (.5, .5)])  # all known: log 2 at both ends
    (0.6931471805599453, 0.6931471805599453)
    >>> lo, hi = entropy_bounds([(.5, .5), (0.0, .5)])  # w in [0, 1/2]: H in [0, log 2] (|U| = 1, H_U = 0)
    >>> round(lo, 4), round(hi, 4)
    (0.0, 0.6931)
    >>> lo, hi = entropy_bounds([(.6, .6), (.2, .2), (0.0, .1), (0.0, .1)])  # H_K = h(.25) = .5623; w in [0, .2]
    >>> round(lo, 4), round(hi, 4)  # w = .2 (w* = .53 clipped): h(.2) + .8 H_K + .2 log 2 = .5004 + .4499 + .1386
    (0.5623, 1.0889)
    """
    known = [hi for lo, hi in box if lo == hi]
    unknown = [(lo, hi) for lo, hi in box if lo != hi]
    k = math.fsum(known)
    if not unknown:
        h = entropy(normalise(known)) if k > 0 else 0.0
        return h, h
    top = math.log(len(unknown))
    if k <= 0:
        return 0.0, top
    h_known = entropy(normalise(known))
    u_lo, u_hi = math.fsum(lo for lo, _ in unknown), math.fsum(hi for _, hi in unknown)
    w_lo, w_hi = u_lo / (k + u_lo), u_hi / (k + u_hi)

    def grouped(w: float, h_unknown: float) -> float:
        return _h(w) + (1 - w) * h_known + w * h_unknown

    w_star = min(max(1 / (1 + math.exp(h_known - top)), w_lo), w_hi)
    return min(grouped(w_lo, 0.0), grouped(w_hi, 0.0)), grouped(w_star, top)


def alpha_bounds(box: Box, *, beta: float = ADAPTIVE_BETA, cap: float = ADAPTIVE_CAP) -> tuple[float, float]:
    """The adaptive strength ``min(beta H / log n, cap)`` at both ends of the real stream's entropy bounds.

    >>> alpha_bounds([(.25, .25)] * 4)
    (2.0, 2.0)
    >>> lo, hi = alpha_bounds([(.97, .97), (.01, .01), (0.0, .01), (0.0, .01)])
    >>> round(lo, 3), round(hi, 3)  # the unread at their bounds give the largest: adaptive_alpha's .605
    (0.205, 0.605)
    """
    n = len(box)
    if n < 2:
        return 0.0, 0.0
    lo, hi = entropy_bounds(box)
    return min(beta * lo / math.log(n), cap), min(beta * hi / math.log(n), cap)


def rival_slacks(c: int, real: Box, empty: Box, alpha: tuple[float, float], *, normalise: bool = True) -> list[float]:
    """Per label ``j``, a lower bound of ``S_c - S_j`` over the box and ``alpha``'s interval (``inf`` at ``c``).

    >>> real = [(.5, .5), (.3, .3), (.2, .2)]; empty = [(.6, .6), (.2, .2), (.2, .2)]
    >>> [round(x, 4) for x in rival_slacks(1, real, empty, (1.0, 1.0))]  # calibrate(): .2333, .4333, .3333
    [0.2, inf, 0.1]
    >>> real[2] = (0.0, .2)  # label 2's real probability unread: A's least is .8, its S_2 at most .2/1 + .1333
    >>> [round(x, 4) for x in rival_slacks(1, real, empty, (1.0, 1.0))]  # X_0 = (.3 - .5)/(.8 + 0): its R-
    [0.15, inf, 0.1]
    >>> [round(x, 4) for x in rival_slacks(1, real, empty, (0.5, 1.0))]  # Y_0 = -.4 < 0: its worst is alpha's low end
    [-0.05, inf, 0.1]
    >>> [round(x, 4) for x in rival_slacks(1, [(.5, .5), (.3, .3)], [(.6, .6), (.2, .2)], (1.0, 1.0), normalise=False)]
    [0.2, inf]
    """
    lo_a, hi_a = [lo for lo, _ in real], [hi for _, hi in real]
    lo_b, hi_b = [lo for lo, _ in empty], [hi for _, hi in empty]
    sums = (math.fsum(lo_a), math.fsum(hi_a), math.fsum(lo_b), math.fsum(hi_b))
    out = []
    for j in range(len(real)):
        if j == c:
            out.append(math.inf)
            continue
        if normalise:
            rest_a = (sums[0] - lo_a[c] - lo_a[j], sums[1] - hi_a[c] - hi_a[j])
            rest_b = (sums[2] - lo_b[c] - lo_b[j], sums[3] - hi_b[c] - hi_b[j])
            x = _least_share(lo_a[c], hi_a[j], rest_a)
            y_hi = -_least_share(lo_b[j], hi_b[c], rest_b)
            y_lo = _least_share(lo_b[c], hi_b[j], rest_b)
        else:
            x, y_hi, y_lo = lo_a[c] - hi_a[j], hi_b[c] - lo_b[j], lo_b[c] - hi_b[j]
        out.append(x - max(a * y for a in alpha for y in (y_lo, y_hi)))
    return out


def certified(c: int, real: Box, empty: Box, alpha: tuple[float, float], *, normalise: bool = True,
              margin: float = MARGIN) -> bool:
    """Whether ``c`` is the whole reading's choice at every point of the box and every ``alpha`` in its interval
    (``S_c - S_j`` above ``margin`` times the scores' scale for every rival ``j``).

    >>> real = [(.5, .5), (.3, .3), (0.0, .2)]; empty = [(.6, .6), (.2, .2), (.2, .2)]
    >>> certified(1, real, empty, (1.0, 1.0)), certified(0, real, empty, (1.0, 1.0))
    (True, False)
    >>> certified(1, real, empty, (0.5, 1.0))  # at alpha .5 label 0 may win (rival_slacks: -.05)
    False
    >>> certified(0, [(.5, .5), (.5, .5)], [(.5, .5), (.5, .5)], (1.0, 1.0))  # a tie: the earlier wins, not certified
    False
    """
    scale = 1.0 if normalise else max(1e-300, math.fsum(hi for _, hi in real), math.fsum(hi for _, hi in empty))
    bar = margin * scale * (1.0 + max(abs(a) for a in alpha))
    return min(rival_slacks(c, real, empty, alpha, normalise=normalise)) > bar


def _least_share(top: float, rival: float, rest: tuple[float, float]) -> float:
    """The least ``(t - r) / (t + r + R)`` for ``t >= top``, ``r <= rival``, ``R`` in ``rest``: at ``t = top``,
    ``r = rival`` and the largest ``R`` when the difference is >= 0, the least otherwise; -1 when nothing bounds
    the normaliser from below (every value 0)."""
    diff = top - rival
    total = top + rival + (rest[1] if diff >= 0 else rest[0])
    return diff / total if total > 0 else -1.0


def _h(w: float) -> float:
    """The binary entropy (nats)."""
    return -math.fsum(x * math.log(x) for x in (w, 1 - w) if x > 0)
