"""The sequential test over queries: does a model read the passages, decided as the queries come.

Each query contributes a score (:func:`~.contrast.agreement` of its four readings, or its own e-value from a
rule that computes one) and an alignment with the first stage's order (:func:`~.contrast.alignment`).

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

**Three outcomes.** A rule that also reports each query's **with-query taste** (the agreement of its with-query
estimates alone, and their own sign-flip e-value: :func:`.query_contrast.summary`) separates the two ways of not
saying "reads":

* "does not read" when ``mean_lambda prod (1 + lambda (EFFECT - T_i))`` on the taste scores reaches ``1 / MISS``:
  with the query, the model's preferences among the passages are no more than slot effects and noise;
* "cannot tell" when the "does not read" process above on what the query adds (or on its alignment) has reached
  ``1 / MISS`` **and** the product of the taste e-values has reached :data:`TASTE_E`: the model prefers some passages
  consistently with the query, but what the query adds is a copy of what it prefers without it (a taste of its own,
  or relevance that shows without the query) or does not go the first stage's way (a taste the query creates, a
  reader of a list given worst first). No label-free rule tells these from reading; judged queries do.

A rule that computes each query's own e-value (the query rule: :func:`.query_contrast.judge`) passes it to
:meth:`Evidence.add`, and the "reads" side multiplies those instead of betting on the scores.

**The taste gate on "reads"** (a rule that reports each query's relation and its e-value over a wider range of
scales: :func:`.query_contrast.summary`). The query rule's e-value is valid for a model whose with-query preference
is its query-free one scaled by 0.5-2 (:data:`.query_contrast.SCALES`); "reads" also needs

* an e-process against "the mean relation is at least :data:`RELATED`" at :data:`RELATED_E` (a copy of the model's
  own taste that no scale fits: sharpened non-linearly, per passage, past 2x, with a taste strong enough to show
  without the query), **and**
* either the product of the queries' e-values over the scales 0.5-3 (:data:`.query_contrast.WIDE_SCALES`) at
  :data:`WIDE_E`: for a copy scaled by any factor up to 3, however weak its taste, Ville's inequality bounds the chance
  that it ever does by ``1 / WIDE_E``; or an e-process against "the mean relation is at least :data:`PARTIAL`" at
  :data:`PARTIAL_E` (a reader without a taste of its own, whose relation is about 0, passes here: subtracting up to 3x
  its noisy query-free estimates slows the first).

A copy scaled by 2-3 thus says "reads" with probability at most ``1 / WIDE_E + 1 / PARTIAL_E`` (4 %) if its queries'
relations have mean at least :data:`PARTIAL`, however weak its taste. ``relation`` is an estimate from noisy readings:
for a taste below the readings' noise (SD .17 logits) sharpened 2-3x its mean is .75-.76 where the copy's true relation
is 1, so the first condition alone did not hold such a copy back (6.7 % false "reads" at 3x; raising
:data:`RELATED_E` to 1,000: 5.5 %). Measured: ``python -m benchmarks.decisions nulls``.

One query moves either process by a bounded factor (at most ``1 + max(LAMBDAS)``), so one loud list
cannot decide alone. Measured on the testbed (``python -m benchmarks.decisions nulls``).

Pure; no I/O. :mod:`.check` pools the queries' readings with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["LAMBDAS", "LEVEL", "MISS", "EFFECT", "CAP", "ALIGN_E", "ALIGN_LAMBDAS", "FULL_PAIRS", "ALIGN_EFFECT",
           "TASTE_E", "RELATED", "RELATED_E", "RELATED_BETS", "WIDE_E", "PARTIAL", "PARTIAL_E", "Evidence"]

#: The betting fractions mixed by both e-processes.
LAMBDAS = (0.2, 0.4, 0.6, 0.8, 0.95)
#: False "reads" at most this, at any number of looks, for a model whose per-query e-values have mean at most 1
#: without content (the query rule's: a with-query preference that is its query-free one scaled by 0.5-2, plus
#: symmetric noise; docs/content-check.md states each outcome's guarantee and its conditions).
LEVEL = 0.01
#: False "does not read" for a model whose queries score at least :data:`EFFECT`, at most this.
MISS = 0.05
#: The smallest mean query score (:func:`agreement`) worth calibrating for: on the testbed a content slope of
#: about 0.15 logits per relevance grade (0.2 scores about 0.5; the ``decisions-content-rule`` run measured it).
EFFECT = 0.4
#: Queries after which an undecided check says "does not read (undecided)".
CAP = 40
#: "reads" also needs the e-process for "the content goes the first stage's way" at this: a model whose content
#: goes neither way reaches it with probability at most 1/20. Chosen on the testbed (the ``decisions-content-rule`` run
#: of ``benchmarks/results/decisions/decisions.md``: readers within 24 queries at s = .5 in 92-96 % of top-20 runs)
#: against a real model (its ``real-decision-0.5b`` run: the packaged 0.5B's 43 DL19 readings: "reads" in no query
#: order tried but 1.6 % of 500 random ones; 5: 3.8 %).
ALIGN_E = 20.0
#: The betting fraction of the alignment e-process (a high one: a model whose alignments swing between -1 and
#: +1, as the packaged models' do, loses its evidence fast; a reader's, about .33 +- .34 a query on DL19, builds).
ALIGN_LAMBDAS = (0.95,)
#: Lists with fewer slot pairs than this bet proportionally less on their alignment (a short list's is noisier).
FULL_PAIRS = 10
#: The smallest mean alignment of a model worth calibrating (a content slope of about 0.1 per grade on the
#: testbed's DL19 lists scores about .2): the evidence against it decides "does not read" too.
ALIGN_EFFECT = 0.15
#: "reads" also needs the model's query-free preference to account for less than this of its with-query one, on
#: average over the queries (:func:`.query_contrast.relation`: near 1 for any copy of its own taste, scaled, sharpened
#: non-linearly or per passage; .82 for the testbed's reader at s = .5 with a taste of SD .5) ...
RELATED = 0.95
#: ... shown by an e-process against "the mean relation is at least :data:`RELATED`" that reaches this: a model whose
#: queries' relations have mean at least :data:`RELATED` reaches it with probability at most ``1 / RELATED_E``. That
#: holds for a copy of a taste strong enough to show without the query (.98-.99 for own SD .5 sharpened 2.5-3x), not
#: for a weaker one: ``relation`` is estimated from noisy readings, and a taste of SD .17 sharpened 3x averages .76
#: (raising this threshold to 1,000 took its false "reads" only from 6.7 % to 5.5 %): :data:`WIDE_E` is for those.
RELATED_E = 10.0
#: The betting fractions of that e-process (per unit of ``RELATED - relation``).
RELATED_BETS = (0.5, 1.0, 2.0, 4.0)
#: "reads" also needs the product of the queries' e-values over the wider range of scales 0.5-3
#: (:data:`.query_contrast.WIDE_SCALES`: its mean is at most 1 for a copy of the model's own taste scaled by any factor
#: in it, however weak the taste, so such a copy reaches this with probability at most ``1 / WIDE_E``) ...
WIDE_E = 50.0
#: ... or an e-process against "the mean relation is at least :data:`PARTIAL`" (the query-free preference accounts for
#: half the with-query one or more; the bets :data:`RELATED_BETS`, capped at ``.95 / (1 - PARTIAL)``) to reach
#: :data:`PARTIAL_E`: a reader without a taste of its own (relation about 0) passes here, where subtracting up to 3x its
#: noisy query-free estimates slows its e-values over the wider range. Chosen on the null suite's cells (``benchmarks/_nulls.py``)
#: (50 and 50: no false "reads" in 2,000 at 3x own SD .17, power at least 96 % in every shape; 20 and 10: 5 of 2,000;
#: 100 and 100: a plain reader at s = 1 on windows within 12 queries in 90 %).
PARTIAL = 0.5
PARTIAL_E = 50.0
#: "cannot tell" also needs this much evidence that the model's with-query preferences are consistent (the product of
#: the queries' taste e-values): a model whose preferences are slot effects and noise reaches it with probability at
#: most ``1 / TASTE_E``, and is called "does not read" instead.
TASTE_E = 20.0

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
    related_e: float = RELATED_E  # the taste gate's evidence "reads" needs (fields so that benchmarks can sweep them)
    wide_e: float = WIDE_E
    partial_e: float = PARTIAL_E
    scores: list[float] = field(default_factory=list)
    alignments: list[float] = field(default_factory=list)
    _reads: list[float] = field(default_factory=list, repr=False)
    _not: list[float] = field(default_factory=list, repr=False)
    _against: list[float] = field(default_factory=list, repr=False)
    _along: list[float] = field(default_factory=lambda: [1.0] * len(ALIGN_LAMBDAS), repr=False)
    _flat: list[float] = field(default_factory=list, repr=False)
    _taste: float = field(default=1.0, repr=False)
    _unrelated: list[float] = field(default_factory=lambda: [1.0] * len(RELATED_BETS), repr=False)
    _partial: list[float] = field(default_factory=lambda: [1.0] * len(RELATED_BETS), repr=False)
    _wide: float = field(default=1.0, repr=False)
    wides: int = 0  # how many queries gave an e-value over the wider range of scales
    relations: list[float] = field(default_factory=list)  # the queries' relations (the taste gate)
    tastes: list[float] = field(default_factory=list)  # the queries' with-query taste scores (three outcomes)
    verdict: str | None = None

    def __post_init__(self) -> None:
        if not self.lambdas or not all(0.0 < lam < 1.0 for lam in self.lambdas):
            raise ValueError(f"betting fractions must be in (0, 1), got {self.lambdas}")
        for name in ("_reads", "_not", "_against", "_flat"):
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
        """The queries' mean :func:`~.contrast.alignment` with the first stage's order (1 before any is known)."""
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

    @property
    def for_flat(self) -> float:
        """The e-value against "with the query, the model's preferences score at least :attr:`effect`" (``1 /
        miss`` decides "does not read" where the rule reports tastes)."""
        return math.fsum(self._flat) / len(self._flat)

    @property
    def for_taste(self) -> float:
        """The e-value against "with the query, the model's preferences are slot effects and noise" (:data:`TASTE_E`
        is needed for "cannot tell")."""
        return self._taste

    @property
    def for_unrelated(self) -> float:
        """The e-value against "the query-free preference accounts for :data:`RELATED` or more of the with-query one"
        (:data:`RELATED_E` is needed for "reads" where the rule reports relations; infinite where it does not)."""
        return math.fsum(self._unrelated) / len(self._unrelated) if self.relations else math.inf

    @property
    def for_wide(self) -> float:
        """The product of the queries' e-values over the wider range of scales (:data:`WIDE_E`, or :data:`PARTIAL_E`
        on :attr:`for_partial`, is needed for "reads" where the rule reports them; infinite where it does not)."""
        return self._wide if self.wides else math.inf

    @property
    def for_partial(self) -> float:
        """The e-value against "the query-free preference accounts for :data:`PARTIAL` or more of the with-query one"
        (infinite where the rule reports no relations)."""
        return math.fsum(self._partial) / len(self._partial) if self.relations else math.inf

    def add(self, score: float, aligned: float | None = None, pairs: int = FULL_PAIRS, e: float | None = None,
            taste: float | None = None, e_taste: float | None = None, related: float | None = None,
            e_wide: float | None = None) -> str | None:
        """Pool one query's score (and its :func:`~.contrast.alignment`, from a list of ``pairs`` slot pairs); the verdict
        once there is one (later scores are ignored). A rule that computes the query's own e-value against "no
        content signal" (mean at most 1 without it: :func:`.query_contrast.judge`) passes it as ``e``; the
        "reads" side then multiplies by it instead of betting on the score. A rule that also passes the with-query
        ``taste`` (score) and ``e_taste`` (its e-value) gets three outcomes, and one that passes ``related`` (how much of
        the with-query preference the query-free one accounts for) and ``e_wide`` (its e-value over the scales 0.5-3)
        the taste gate on "reads" (module docstring)."""
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
        if taste is not None:
            t = max(-1.0, min(1.0, float(taste)))
            self.tastes.append(t)
            self._flat = [k * (1.0 + lam * scale * (self.effect - t)) for k, lam in zip(self._flat, self.lambdas)]
            self._taste *= max(0.0, float(e_taste if e_taste is not None else 1.0))
        if related is not None:
            r = max(-1.0, min(1.0, float(related)))
            self.relations.append(r)
            cap = 0.95 / (1.0 - RELATED)  # keeps 1 + bet * (RELATED - r) > 0 for r <= 1
            self._unrelated = [k * (1.0 + min(b, cap) * (RELATED - r)) for k, b in zip(self._unrelated, RELATED_BETS)]
            cap = 0.95 / (1.0 - PARTIAL)
            self._partial = [k * (1.0 + min(b, cap) * (PARTIAL - r)) for k, b in zip(self._partial, RELATED_BETS)]
        if e_wide is not None:
            self.wides += 1
            self._wide *= max(0.0, float(e_wide))
        refused = self.for_not >= 1.0 / self.miss or self.against_alignment >= 1.0 / self.miss
        if (self.for_reads >= 1.0 / self.level and self.for_aligned >= self.align_e
                and self.for_unrelated >= self.related_e
                and (self.for_wide >= self.wide_e or self.for_partial >= self.partial_e)):
            self.verdict = "reads"
        elif self.tastes and self.for_flat >= 1.0 / self.miss:
            self.verdict = "does not read"
        elif self.tastes and refused:
            if self.for_taste >= TASTE_E:
                self.verdict = "cannot tell"
        elif refused:
            self.verdict = "does not read"
        if self.verdict is None and self.queries >= self.cap:
            self.verdict = "undecided"
        return self.verdict
