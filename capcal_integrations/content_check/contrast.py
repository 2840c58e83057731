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

**The sequential test** (:class:`Evidence`): two e-processes (test martingales, each a mixture over
betting fractions ``LAMBDAS`` of ``prod (1 + lambda * score)``) run over the queries in the order they
come:

* "reads" when ``mean_lambda prod (1 + lambda X_i)`` reaches ``1 / LEVEL``: without content (``E[X] = 0``)
  it ever does with probability at most ``LEVEL``, however many queries are looked at (Ville's inequality);
  and a third e-process, on the alignments against "they do not go the first stage's way" (mean alignment
  at most 0; betting fractions :data:`ALIGN_LAMBDAS`, scaled down for lists of fewer than :data:`FULL_PAIRS`
  slot pairs), has reached :data:`ALIGN_E` (a further condition: it can only lower the false-"reads" rate). A
  model with strong, consistent preferences of its own that do not follow relevance (the packaged 0.5B and
  1.5B: their alignments swing between -1 and +1 around a mean near .1) never builds this evidence;
* "does not read" when ``mean_lambda prod (1 + lambda (EFFECT - X_i))`` reaches ``1 / MISS``: a model whose
  queries score ``EFFECT`` or more on average is called a non-reader with probability at most ``MISS``; or
  when the same process on the alignments against :data:`ALIGN_EFFECT` does (a model whose preferences do not
  go the first stage's way);
* neither after ``CAP`` queries: "does not read (undecided)".

A rule that computes each query's own e-value (the query rule: :func:`.query_contrast.judge`) passes it to
:meth:`Evidence.add`, and the "reads" side multiplies those instead of betting on the scores.

One query moves either process by a bounded factor (at most ``1 + max(LAMBDAS)``), so one loud list
cannot decide alone. Measured on the testbed (``benchmarks/decisions.py``).

**The calibration strength** (``alpha="auto"``) is chosen on the same readings, label-free
(:func:`alpha_of_readings`): the ``alpha`` whose calibrated rankings of the four readings, mapped back to the
passages, agree most (mean Kendall tau over the pairs of readings).

Pure functions; no I/O. :mod:`.content_check` decides with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..calibration.strength import ALPHAS, MARGIN, choose, implied_order

__all__ = ["ALPHAS", "LAMBDAS", "LEVEL", "MISS", "EFFECT", "CAP", "ALIGN_E", "ALIGN_LAMBDAS", "FULL_PAIRS",
           "ALIGN_EFFECT", "MIN_PASSAGES", "halves_swapped", "rotated_pair", "reading_orders", "Reading", "estimates",
           "estimate", "agreement", "alignment", "summary", "share", "Evidence", "implied_order", "alpha_of_readings"]

#: The betting fractions mixed by both e-processes.
LAMBDAS = (0.2, 0.4, 0.6, 0.8, 0.95)
#: False "reads" (a model without content signal called a reader) at most this, at any number of looks.
LEVEL = 0.01
#: False "does not read" for a model whose queries score at least :data:`EFFECT`, at most this.
MISS = 0.05
#: The smallest mean query score (:func:`agreement`) worth calibrating for: on the testbed a content slope of
#: about 0.15 logits per relevance grade (0.2 scores about 0.5; ``benchmarks/decisions.py`` measures it).
EFFECT = 0.4
#: Queries after which an undecided check says "does not read (undecided)".
CAP = 40
#: "reads" also needs the e-process for "the content goes the first stage's way" at this: a model whose content
#: goes neither way reaches it with probability at most 1/20. Chosen on ``benchmarks/decisions.py`` (the testbed's
#: readers: within 24 queries at s = .5 in 92-96 % of top-20 runs) against ``benchmarks/real_decision.py`` (the
#: packaged 0.5B's 43 DL19 readings: "reads" in no query order tried but 1.6 % of 500 random ones; 5: 3.8 %).
ALIGN_E = 20.0
#: The betting fraction of the alignment e-process (a high one: a model whose alignments swing between -1 and
#: +1, as the packaged models' do, loses its evidence fast; a reader's, about .33 +- .34 a query on DL19, builds).
ALIGN_LAMBDAS = (0.95,)
#: Lists with fewer slot pairs than this bet proportionally less on their alignment (a short list's is noisier).
FULL_PAIRS = 10
#: The smallest mean alignment of a model worth calibrating (a content slope of about 0.1 per grade on the
#: testbed's DL19 lists scores about .2): the evidence against it decides "does not read" too.
ALIGN_EFFECT = 0.15
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


@dataclass
class Evidence:
    """The sequential test's state over the queries seen so far (module docstring); :meth:`add` one score at a
    time, then read :attr:`verdict`: ``"reads"``, ``"does not read"``, ``"undecided"`` (at :data:`CAP`) or
    ``None`` (not yet).

    >>> e = Evidence()
    >>> while e.verdict is None:
    ...     _ = e.add(0.9)
    >>> e.verdict, e.queries, round(e.for_reads)
    ('reads', 10, 162)
    >>> e = Evidence()
    >>> while e.verdict is None:
    ...     _ = e.add(0.0)
    >>> e.verdict, e.queries
    ('does not read', 17)
    """

    level: float = LEVEL
    miss: float = MISS
    effect: float = EFFECT
    cap: int = CAP
    align_e: float = ALIGN_E  # the alignment evidence "reads" needs (a field so that benchmarks can sweep it)
    lambdas: tuple[float, ...] = LAMBDAS  # the betting fractions of the agreement e-processes (each in (0, 1))
    bet_pairs: int = 0  # lists of fewer slot pairs bet pairs / bet_pairs of the agreement bets (0: all bet the same)
    scores: list[float] = field(default_factory=list)
    alignments: list[float] = field(default_factory=list)
    _reads: list[float] = field(default_factory=list, repr=False)
    _not: list[float] = field(default_factory=list, repr=False)
    _against: list[float] = field(default_factory=list, repr=False)
    _along: list[float] = field(default_factory=lambda: [1.0] * len(ALIGN_LAMBDAS), repr=False)
    verdict: str | None = None

    def __post_init__(self) -> None:
        if not self.lambdas or not all(0.0 < lam < 1.0 for lam in self.lambdas):
            raise ValueError(f"betting fractions must be in (0, 1), got {self.lambdas}")
        for name in ("_reads", "_not", "_against"):
            if not getattr(self, name):
                setattr(self, name, [1.0] * len(self.lambdas))

    @property
    def queries(self) -> int:
        return len(self.scores)

    @property
    def for_reads(self) -> float:
        """The e-value against "no content signal" (``1 / level`` decides "reads")."""
        return math.fsum(self._reads) / len(self._reads)

    @property
    def for_not(self) -> float:
        """The e-value against "reads with at least :attr:`effect`" (``1 / miss`` decides "does not read")."""
        return math.fsum(self._not) / len(self._not)

    @property
    def aligned(self) -> float:
        """The queries' mean :func:`alignment` with the first stage's order (1 before any is known)."""
        return math.fsum(self.alignments) / len(self.alignments) if self.alignments else 1.0

    @property
    def for_aligned(self) -> float:
        """The e-value against "the content does not go the first stage's way" (:data:`ALIGN_E` is needed for
        "reads"; infinite when no alignment was given)."""
        return math.fsum(self._along) / len(self._along) if self.alignments else math.inf

    @property
    def against_alignment(self) -> float:
        """The e-value against "the mean alignment is at least :data:`ALIGN_EFFECT`"."""
        return math.fsum(self._against) / len(self._against)

    def add(self, score: float, aligned: float | None = None, pairs: int = FULL_PAIRS, e: float | None = None
            ) -> str | None:
        """Pool one query's score (and its :func:`alignment`, from a list of ``pairs`` slot pairs); the verdict
        once there is one (later scores are ignored). A rule that computes the query's own e-value against "no
        content signal" (mean at most 1 without it: :func:`.query_contrast.judge`) passes it as ``e``; the
        "reads" side then multiplies by it instead of betting on the score."""
        if self.verdict is not None:
            return self.verdict
        x = max(-1.0, min(1.0, float(score)))
        self.scores.append(x)
        if aligned is not None:
            a = max(-1.0, min(1.0, float(aligned)))
            self.alignments.append(a)
            self._against = [k * (1.0 + lam * (ALIGN_EFFECT - a) / (1.0 + ALIGN_EFFECT))
                             for k, lam in zip(self._against, self.lambdas)]
            size = min(1.0, max(1, pairs) / FULL_PAIRS)  # known before the score: a predictable bet
            self._along = [k * (1.0 + size * lam * a) for k, lam in zip(self._along, ALIGN_LAMBDAS)]
        bet = min(1.0, max(1, pairs) / self.bet_pairs) if self.bet_pairs else 1.0  # known before the score: predictable
        scale = bet / (1.0 + self.effect)  # keeps 1 + lambda * (effect - x) > 0
        self._reads = ([k * max(0.0, float(e)) for k in self._reads] if e is not None
                       else [k * (1.0 + bet * lam * x) for k, lam in zip(self._reads, self.lambdas)])
        self._not = [k * (1.0 + lam * scale * (self.effect - x)) for k, lam in zip(self._not, self.lambdas)]
        if self.for_reads >= 1.0 / self.level and self.for_aligned >= self.align_e:
            self.verdict = "reads"
        elif self.for_not >= 1.0 / self.miss or self.against_alignment >= 1.0 / self.miss:
            self.verdict = "does not read"
        elif self.queries >= self.cap:
            self.verdict = "undecided"
        return self.verdict


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
