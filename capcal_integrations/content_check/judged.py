"""Decide from judged queries: calibrate only where the labels show that calibrating beats the given order.

The label-free check (:mod:`.check`) asks whether the query moves the model's preferences; it cannot tell a
query-dependent taste (or a copy of the retriever's order) from relevance. Judged queries can. A user with a few
dozen judged queries (a RAG team's evaluation set) decides from them: each list is ranked by the calibrated method,
kept in its given order and ranked by the uncalibrated method (``vanilla``, or ``first-token`` beside
``first-token-capcal``); the per-query differences of nDCG@10 (trec_eval's: linear gains) between the calibrated
ranking and the given order, each in ``[-1, 1]``, are bet on in turn (:mod:`.betting`), and the decision is
**calibrate** once the bettor's wealth against "calibrating gains nothing on average" reaches 40.

**The guarantee** (Ville's inequality): where each judged query's difference has a mean of at most 0 given the
queries before it (queries judged independently of how earlier ones came out; the differences are bounded in
``[-1, 1]`` by construction), "calibrate" is said with probability at most 2.5 %, **at any number of looks**:
re-running :meth:`~.CapCalReranker.decide` after every new judged query and stopping at the first "calibrate"
does not raise it, nor does a skewed distribution of the differences (many small gains, a few large losses). The
gain's interval is the matching confidence sequence (95 %, valid at every count at once). Neither depends on
:data:`MIN_JUDGED`, an input check (fewer queries cannot reach 40 anyway). The price of that validity is queries:
on the testbed, a reader of strength s = 1 (a mean gain of .32 nDCG@10) needs a median of 18 judged queries, s = .5
(.26) 22 and s = .25 (.14) 39 (the ``judged`` run of ``benchmarks/results/decisions/decisions.md``; docs/content-check.md has
the table).

**Pooled, not replaced.** The decision keeps its judged queries (:func:`judged_identity`: a salted hash of the
query's words) and their nDCG@10 calibrated, given and uncalibrated, in order; a later ``decide()`` on the same
key (model, weights, reading options) ranks only the queries not judged before (a query judged again counts
once: its new result is ignored, so re-asking a query cannot redraw its noise) and pools them into the same
test (:func:`pooled`, :func:`~.registry.adopt`). A decision that said "calibrate" stays so: the e-process
crossed, and a stopped e-process is valid. A decision without a record (label-free, or saved before records
were kept) is replaced.

Pure, but for :func:`rank_judged` and :func:`arank_judged`, which rank the judged lists through a reranker
(:meth:`.CapCalReranker.decide` and ``adecide``: the decision is then set like the check's own and kept).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from . import betting
from .check import ContentDecision, Key, decision_key, query_identity
from .decision import key_id

__all__ = ["LEVEL", "MIN_JUDGED", "Judged", "LabelEvidence", "ndcg10", "judged_identity", "label_verdict",
           "judged_triples", "fresh_judged", "uncalibrated", "rank_judged", "arank_judged", "label_decision", "pooled"]

#: One side's error: "calibrate" at a true mean gain of 0 or less is said with at most this probability.
LEVEL = betting.LEVEL
#: The fewest judged queries (with at least one graded passage and two passages) pooled before a decision: an input
#: check, not part of the guarantee.
MIN_JUDGED = 5

Judged = tuple[str, Sequence[Any], Sequence[int]]


def ndcg10(order: Sequence[int], grades: Sequence[int]) -> float:
    """trec_eval's nDCG@10 of ``order`` (input indices, best first) under ``grades`` (one per input passage):
    linear gains, ``log2(rank + 1)`` discounts, the ideal from the list's own grades.

    >>> round(ndcg10([1, 0, 2], [1, 3, 1]), 4), ndcg10([0, 1], [0, 0])
    (1.0, 0.0)
    >>> round(ndcg10([0, 1, 2], [1, 3, 1]), 4)  # (1 + 3 / log2 3 + 1 / 2) / (3 + 1 / log2 3 + 1 / 2)
    0.8213
    """
    def dcg(gains: Sequence[float]) -> float:
        return math.fsum(g / math.log2(r + 2) for r, g in enumerate(gains[:10]) if g > 0)

    best = dcg(sorted(grades, reverse=True))
    return dcg([grades[i] for i in order]) / best if best > 0 else 0.0


def judged_identity(key: Key, query: str) -> str:
    """A judged query's identity in a decision's record: 16 hex digits of a SHA-256 of the key's id and the query's
    words (:func:`~.check.query_identity`: case, spacing and punctuation folded), so the same query under another
    key has another hash and a record does not show which queries another key's record holds.

    >>> key = (("model", "m"), ("weights", "sha:1"))
    >>> judged_identity(key, "What is a  Flea?") == judged_identity(key, "what is a flea"), len(judged_identity(key, "q"))
    (True, 16)
    >>> judged_identity(key, "q") == judged_identity((("model", "n"), ("weights", "sha:1")), "q")
    False
    """
    return hashlib.sha256(f"{key_id(key)}:{query_identity(query)}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LabelEvidence:
    """What the judged queries show, in the order they were judged: per query, nDCG@10 of the calibrated ranking,
    the given order and the uncalibrated method; the calibrated-minus-given differences' mean (``gain``) and its
    95 % confidence sequence (``low``, ``high``: :func:`.betting.interval`); the e-process against "the mean gain
    is at most 0" now (``e_value``) and at its highest (``e_max``); ``crossed``: the count at which it reached
    :data:`.betting.THRESHOLD` (0: not yet)."""

    calibrated: tuple[float, ...]
    given: tuple[float, ...]
    uncalibrated: tuple[float, ...]
    gain: float
    low: float
    high: float
    e_value: float = 1.0
    e_max: float = 1.0
    crossed: int = 0

    @classmethod
    def of(cls, calibrated: Sequence[float], given: Sequence[float], uncalibrated: Sequence[float]) -> LabelEvidence:
        """The evidence of these nDCG@10s (one of each per query, in order).

        >>> ev = LabelEvidence.of([0.9, 1.0, 0.8, 1.0, 0.9], [0.5, 0.4, 0.6, 0.5, 0.4], [0.6] * 5)
        >>> round(ev.gain, 2), ev.crossed, ev.calibrate, round(ev.e_value, 2)  # d = .4 .6 .2 .5 .5
        (0.44, 0, False, 4.13)

        (the mean of the three bettors' wealth: 1.2 * 1.3 * 1.1 * 1.25 ** 2 = 2.68 at fraction .5, 4.10 at .75,
        5.61 at .95: far from 40 after five queries, however large their gains.)
        """
        diffs = [min(1.0, max(-1.0, c - g)) for c, g in zip(calibrated, given, strict=True)]
        if not diffs:
            raise InputError("judged evidence needs at least one judged query")
        path = betting.e_process(diffs)
        low, high = betting.interval(diffs)
        return cls(tuple(calibrated), tuple(given), tuple(uncalibrated), math.fsum(diffs) / len(diffs), low, high,
                   path[-1], max(path), betting.crossing(diffs))

    @property
    def calibrate(self) -> bool:
        """Calibrate: the e-process has crossed (:func:`label_verdict`)."""
        return label_verdict(self.crossed)

    @property
    def uncalibrated_gain(self) -> float:
        return math.fsum(u - g for u, g in zip(self.uncalibrated, self.given)) / max(1, len(self.given))

    def p_value(self) -> float:
        """The anytime-valid p-value of "calibrating does not beat the given order": ``1 / e_max``, at most 1."""
        return min(1.0, 1.0 / self.e_max)


def label_verdict(crossed: int) -> bool:
    """Calibrate only once the e-process has crossed (``crossed``: the count at which it did, 0 if not)."""
    return crossed > 0


def judged_triples(judged: Any) -> list[tuple[str, list[Any], list[int]]]:
    """``judged`` as ``(query, passages, grades)`` triples, checked: one grade (an integer >= 0) per passage; lists
    with fewer than two passages or no graded passage say nothing about an order and are left out."""
    if isinstance(judged, (str, bytes)) or not hasattr(judged, "__iter__"):
        raise InputError("judged must be a sequence of (query, passages, grades) triples")
    out = []
    for i, item in enumerate(judged):
        try:
            query, passages, grades = item
        except (TypeError, ValueError):
            raise InputError(f"judged item {i}: expected a (query, passages, grades) triple, got {type(item).__name__}") \
                from None
        if not isinstance(query, str):
            raise InputError(f"judged item {i}: the query must be a string, got {type(query).__name__}")
        passages, grades = list(passages), list(grades)
        if len(passages) != len(grades):
            raise InputError(f"judged item {i} ({query[:40]!r}): {len(passages)} passages but {len(grades)} grades")
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in grades):
            raise InputError(f"judged item {i} ({query[:40]!r}): grades must be integers >= 0, got {grades[:5]}...")
        if len(passages) >= 2 and any(grades):
            out.append((query, passages, grades))
    return out


def fresh_judged(judged: Any, key: Key, current: ContentDecision | None) -> tuple[list[Judged], list[str]]:
    """The usable judged queries (:func:`judged_triples`) that ``current`` (the key's decision in force) has not
    judged yet, with their identities (:func:`judged_identity`): a query already in its record, or twice in
    ``judged``, counts once (its first result). At least :data:`MIN_JUDGED` queries pooled with the record, else
    an :class:`~.errors.InputError`."""
    triples = judged_triples(judged)
    seen = set(current.judged_ids) if current is not None and current.key == key else set()
    fresh, ids = [], []
    for triple in triples:
        ident = judged_identity(key, triple[0])
        if ident not in seen:
            seen.add(ident)
            fresh.append(triple)
            ids.append(ident)
    pooled_before = len(seen) - len(ids)
    if pooled_before + len(ids) < MIN_JUDGED:
        raise InputError(f"judged: {len(triples)} usable judged queries (two passages or more, one graded above 0), "
                         f"{len(ids)} not judged before{f' ({pooled_before} pooled already)' if pooled_before else ''}; "
                         f"a decision from labels needs at least {MIN_JUDGED} (20 or more are typical)")
    return fresh, ids


def uncalibrated(method: str) -> str:
    """The uncalibrated counterpart of a calibrated method: what calibration is measured against besides the
    given order."""
    return "first-token" if method.startswith("first-token") else "vanilla"


Scores = tuple[list[float], list[float], list[float]]


def _rankers(reranker: Any) -> Any:
    opts = reranker.options
    if not opts.calibrated:
        raise InputError(f"decide() decides whether to calibrate; method {opts.method!r} does not calibrate: use "
                         "method='auto', 'capcal' or 'first-token-capcal'")
    if opts.guard is None:
        raise InputError("decide() sets the decision the content check uses, and guard=None has no check (it always "
                         "calibrates): decide with the reranker you rank with, guard='query' (the default)")
    return reranker.with_options(guard=None)


def _add(scores: Scores, order: Sequence[int], plain: Sequence[int], grades: Sequence[int]) -> None:
    for column, ranked in zip(scores, (order, range(len(grades)), plain)):
        column.append(ndcg10(ranked, grades))


def rank_judged(reranker: Any, judged: Sequence[Judged]) -> Scores:
    """nDCG@10 per judged list (checked triples: :func:`judged_triples`) of the calibrated ranking, the given order
    and the uncalibrated method, each ranked by ``reranker`` with its options (``guard=None``: no check)."""
    calibrated, scores, plain = _rankers(reranker), ([], [], []), None
    for query, passages, grades in judged:
        ranking = calibrated.rerank(query, passages)
        plain = plain or reranker.with_options(guard=None, method=uncalibrated(ranking.method))
        _add(scores, ranking.order, plain.rerank(query, passages).order, grades)
    return scores


async def arank_judged(reranker: Any, judged: Sequence[Judged]) -> Scores:
    """:func:`rank_judged` over the async API."""
    calibrated, scores, plain = _rankers(reranker), ([], [], []), None
    for query, passages, grades in judged:
        ranking = await calibrated.arerank(query, passages)
        plain = plain or reranker.with_options(guard=None, method=uncalibrated(ranking.method))
        _add(scores, ranking.order, (await plain.arerank(query, passages)).order, grades)
    return scores


def _decision(key: Key, alpha: float, ids: Sequence[str], scores: Sequence[tuple[float, float, float]],
              crossed: int = 0) -> ContentDecision:
    """The decision of a judged record (``crossed``: an earlier decision's crossing, which stands)."""
    evidence = LabelEvidence.of(*zip(*scores))
    crossed = crossed or evidence.crossed
    reads, n = label_verdict(crossed), len(scores)
    return ContentDecision(reads, "reads" if reads else "does not read", evidence.p_value(), evidence.e_value,
                           evidence.gain, n, alpha, alpha, (), key, level=LEVEL, judged=n, gain=evidence.gain,
                           gain_low=evidence.low, gain_high=evidence.high,
                           uncalibrated_gain=evidence.uncalibrated_gain, judged_ids=tuple(ids),
                           judged_scores=tuple(tuple(x) for x in scores), crossed=crossed)


def label_decision(caps: Any, opts: Any, scores: Scores, ids: Sequence[str]) -> ContentDecision:
    """The decision of these options' key on a probed endpoint (``caps``) from the judged lists' ``scores``
    (:func:`rank_judged`) and their identities (:func:`fresh_judged`): "reads" (calibrate) once the e-process
    crosses (:func:`label_verdict`), at the alpha the calibrated rankings used (``"auto"`` without the check is
    1). Pool it with the key's earlier record with :func:`pooled` (:func:`~.registry.adopt` does)."""
    alpha = float(opts.alpha) if isinstance(opts.alpha, (int, float)) else 1.0
    rows = list(zip(*scores))
    if len(rows) != len(ids):
        raise InputError(f"label_decision: {len(rows)} judged queries scored but {len(ids)} identities")
    return _decision(decision_key(caps.model, caps.weights, opts), alpha, ids, rows)


def pooled(current: ContentDecision | None, new: ContentDecision) -> ContentDecision:
    """``new`` (a decision from judged queries) pooled into ``current``, the key's decision in force: ``current``'s
    record, then ``new``'s queries it does not hold, in one sequential test (a query already pooled keeps its
    first result). ``new`` as it is where ``current`` has no record (none, label-free, saved before records were
    kept) or is about another key; ``current`` where ``new`` adds nothing. A "calibrate" stays one."""
    if current is None or not current.judged_ids or current.key != new.key or not new.judged_ids:
        return new
    seen = set(current.judged_ids)
    extra = [(i, s) for i, s in zip(new.judged_ids, new.judged_scores) if i not in seen]
    if not extra:
        return current
    ids = current.judged_ids + tuple(i for i, _ in extra)
    scores = current.judged_scores + tuple(s for _, s in extra)
    return _decision(new.key, new.alpha, ids, scores, current.crossed if current.reads else 0)
