"""A label-free choice of the calibration strength ``alpha``, from your own unlabeled queries.

A reranker without position bias ranks a list the same way whatever order it is given in. So for a
few ``(query, passages)`` samples, rank several random shuffles of each list with one decoding step of
both streams (the ``first-token-capcal`` method: one real and one content-free prompt per shuffle),
then pick the ``alpha`` whose calibrated first-step rankings agree most across the shuffles (mean
pairwise Kendall tau). No relevance labels are needed, and the whole alpha curve comes from the same
model calls: the calibrated scores are a pure function of the stored distributions ``p`` and ``q``.
"""

from __future__ import annotations

import logging
import math
import numbers
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .calibration.formulas import calibrated, order_of_scores
from .calibration.strength import ALPHAS, agreement_of, choose
from .errors import InputError
from .reranker import pairs_of
from .types import Ranking, Usage

if TYPE_CHECKING:
    from .reranker import CapCalReranker

__all__ = ["AlphaChoice", "DEFAULT_ALPHAS", "calibrated_order", "consistency",
           "choose_alpha", "achoose_alpha"]

log = logging.getLogger(__name__)

#: The strengths tried by default (0 = no calibration): the one grid of :mod:`.strength`.
DEFAULT_ALPHAS = ALPHAS

#: Below this best consistency the choice is noise: the model ranks shuffles of a list almost
#: independently at every strength (no content signal that calibration could reveal).
WEAK_CONSISTENCY = 0.2


def calibrated_order(p: Sequence[float], q: Sequence[float], alpha: float, form: str = "additive") -> list[int]:
    """The first-token-capcal ranking (indices into ``p``, as the engine orders it) for one strength, by the additive
    (``p - alpha (q - 1/n)``) or the log (``log p - alpha log q``) form.

    >>> calibrated_order([0.5, 0.3, 0.2], [0.8, 0.1, 0.1], 0.0), calibrated_order([0.5, 0.3, 0.2], [0.8, 0.1, 0.1], 1.0)
    ([0, 1, 2], [1, 2, 0])
    """
    return order_of_scores(calibrated(p, q, alpha, form))


def consistency(shuffles: Sequence[tuple[Sequence[int], Sequence[float], Sequence[float]]], alpha: float,
                form: str = "additive") -> float:
    """Mean pairwise Kendall tau between the calibrated first-step rankings of one query's shuffles.

    Each shuffle is ``(perm, p, q)``: ``perm[slot]`` is the passage shown in that slot, ``p`` and ``q``
    the real and content-free first-step distributions by slot. 1.0 = the ranking ignores the order.

    Passage 0 is the best, but slot 1 is favoured (``q``), which lifts passage 1 above it in the second
    shuffle; alpha 0.5 cancels that, alpha 1 overshoots:

    >>> q = [0.6, 0.2, 0.2]
    >>> two = [([0, 1, 2], [0.6, 0.25, 0.15], q), ([1, 2, 0], [0.5, 0.1, 0.4], q)]
    >>> [round(consistency(two, a), 3) for a in (0.0, 0.5, 1.0)]
    [0.333, 1.0, 0.333]
    """
    if len(shuffles) < 2:
        raise InputError("consistency needs at least two shuffles")
    return agreement_of([(perm, (p, q)) for perm, p, q in shuffles], lambda pq, a: calibrated_order(*pq, a, form), alpha)


@dataclass(frozen=True)
class AlphaChoice:
    """The outcome of :func:`choose_alpha`: the chosen ``alpha`` (to pass as ``CapCalReranker(alpha=...)``),
    the ``form`` it is for, the mean shuffle consistency of every strength tried, and the cost."""

    alpha: float
    form: str
    curve: dict[float, float]
    queries: int
    shuffles: int
    usage: Usage

    @property
    def weak(self) -> bool:
        """True when even the best strength leaves the rankings of a list's shuffles nearly unrelated
        (best mean tau < :data:`WEAK_CONSISTENCY`): the model shows too little content signal on these
        lists for any alpha to matter, and the choice is noise."""
        return max(self.curve.values()) < WEAK_CONSISTENCY

    def __str__(self) -> str:
        curve = ", ".join(f"{a:g}: {t:.3f}" for a, t in self.curve.items())
        warning = "; WEAK: the model barely ranks by content here, the choice is noise" if self.weak else ""
        return (f"alpha={self.alpha:g} ({self.form}; mean tau between shuffles by alpha: {curve}; "
                f"{self.queries} queries x {self.shuffles} shuffles, {self.usage.requests} requests{warning})")


def _jobs(items: Iterable[tuple[str, Sequence[Any]]], shuffles: int, seed: int, size: int,
          ) -> list[tuple[int, list[int], str, list[Any]]]:
    if not (isinstance(shuffles, int) and not isinstance(shuffles, bool) and shuffles >= 2):
        raise InputError(f"shuffles must be an integer >= 2, got {shuffles!r}")
    jobs = []
    for i, (query, passages) in enumerate(pairs_of(items)):
        if isinstance(passages, (str, bytes, Mapping)) or not isinstance(passages, Iterable):
            raise InputError(f"items[{i}]: passages must be a list of passages, got {type(passages).__name__}")
        passages = list(passages)[:size]
        if len(passages) < 2:
            raise InputError(f"sample {i} has {len(passages)} passage(s); tuning needs lists of at least 2")
        rng = random.Random(f"{seed}/{i}")
        for _ in range(shuffles):
            perm = rng.sample(range(len(passages)), len(passages))
            jobs.append((i, perm, query, [passages[j] for j in perm]))
    if not jobs:
        raise InputError("choose_alpha needs at least one (query, passages) sample")
    return jobs


def _choose(jobs: Sequence[tuple[int, list[int], str, list[Any]]], rankings: Sequence[Ranking],
            alphas: Sequence[float], form: str, shuffles: int) -> AlphaChoice:
    by_query: dict[int, list[tuple[list[int], tuple[tuple[float, ...], tuple[float, ...]]]]] = {}
    usage = Usage()
    for (i, perm, _, _), ranking in zip(jobs, rankings, strict=True):
        step = ranking.steps[0]
        if step.q is None or list(step.candidates) != list(range(len(perm))):
            raise InputError("tuning needs the first step over the whole list; use lists no longer than the window")
        by_query.setdefault(i, []).append((perm, (step.p, step.q)))
        usage = usage + ranking.usage
    alpha, curve = choose(list(by_query.values()), lambda pq, a: calibrated_order(*pq, a, form), alphas)
    best = max(curve.values())
    choice = AlphaChoice(alpha, form, curve, len(by_query), shuffles, usage)
    if choice.weak:
        log.warning("choose_alpha: the best mean tau between shuffles is %.3f (< %.1f): the model ranks these lists "
                    "almost independently of their content, so no alpha helps; consider a larger model", best,
                    WEAK_CONSISTENCY)
    return choice


def _prepare(reranker: CapCalReranker, items: Iterable[tuple[str, Sequence[Any]]], alphas: Sequence[float],
             shuffles: int, seed: int, form: str | None):
    if isinstance(alphas, (str, bytes)) or not isinstance(alphas, Sequence) or not alphas or not all(
            isinstance(a, numbers.Real) and not isinstance(a, bool) and math.isfinite(a) and a >= 0 for a in alphas):
        raise InputError(f"alphas must be a non-empty sequence of finite numbers >= 0, got {alphas!r}")
    form = form or reranker.options.calibration
    probe = reranker.with_options(method="first-token-capcal", calibration=form, alpha=1.0, guard=None)
    return probe, _jobs(items, shuffles, seed, reranker.options.window), form


def choose_alpha(reranker: CapCalReranker, items: Iterable[tuple[str, Sequence[Any]]], *,
                 alphas: Sequence[float] = DEFAULT_ALPHAS, shuffles: int = 4, seed: int = 0,
                 form: str | None = None) -> AlphaChoice:
    """Choose ``alpha`` for ``reranker``'s endpoint and prompt from unlabeled ``(query, passages)`` samples.

    Costs one first decoding step of both streams per shuffle (``len(items) * shuffles`` real prompts;
    the content-free prompt is the same for every shuffle of a list, so the server's cache serves it).
    Lists longer than the reranker's window are cut to it. Among equally consistent strengths the one
    nearest 1.0 wins. Use the result as ``reranker.with_options(alpha=choice.alpha)``.
    """
    probe, jobs, form = _prepare(reranker, items, alphas, shuffles, seed, form)
    rankings = probe.rerank_many([(query, docs) for _, _, query, docs in jobs])
    return _choose(jobs, rankings, alphas, form, shuffles)


async def achoose_alpha(reranker: CapCalReranker, items: Iterable[tuple[str, Sequence[Any]]], *,
                        alphas: Sequence[float] = DEFAULT_ALPHAS, shuffles: int = 4, seed: int = 0,
                        form: str | None = None) -> AlphaChoice:
    """Async :func:`choose_alpha`."""
    probe, jobs, form = _prepare(reranker, items, alphas, shuffles, seed, form)
    rankings = await probe.arerank_many([(query, docs) for _, _, query, docs in jobs])
    return _choose(jobs, rankings, alphas, form, shuffles)

