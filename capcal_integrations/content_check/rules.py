"""Where a content rule plugs in: what decides whether the calibrated methods calibrate a model at all.

CapCal subtracts the empty prompt's slot prior; on a model that does not read the passages that leaves
noise, and the given order is better. A **content rule** decides, once per model and reading options
(:func:`~.content_check.decision_key`), whether the model reads. The ``guard`` option names the rule
(:data:`RULES`); ``None`` runs none (always calibrate).

A rule is four things (:class:`ContentRule`), and the engine asks nothing else of it:

* ``orders(n)``: the orders in which a query's top window of ``n`` passages is read at the first decoding
  step (:func:`~.decoding.check_readings` reads them, with the empty prompt's, into a
  :class:`~.contrast.Reading`); with ``query_free``, each order is read a second time with the query
  replaced by :data:`~.prompts.QUERY_PLACEHOLDER`;
* ``summary(reading)``: what one query contributes, ``(score, alignment, slot pairs)``, and optionally its own
  e-value against "no content signal" (the query rule's: :func:`~.query_contrast.judge`);
* ``evidence(cap)``: a fresh sequential test that pools the queries' summaries into a verdict
  (``"reads"``, ``"does not read"``, ``"cannot tell"``, ``"undecided"`` at the cap; :class:`~.evidence.Evidence`);
* ``strength(readings, form=..., first_only=...)``: the ``alpha`` to calibrate with once it reads (label-free:
  :mod:`.strength`, the one choice of alpha, which :func:`~.tuning.choose_alpha` uses too).

:class:`~.content_check.ContentCheck` keeps one rule's state per key and
:func:`~.strategies.rerank_flow` applies its verdict (the given order while it decides and for a model
that does not read). A new rule is one more entry in :data:`RULES`.

The per-list guard of earlier versions (``guard=<z-score>``: one more prompt per window, fooled by slot
effects on the testbed) is retired: a number is read as the default rule, with a ``FutureWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..option_values import is_finite
from . import query_contrast
from .contrast import MIN_PASSAGES, Reading, alpha_of_readings, reading_orders, summary
from .evidence import Evidence

__all__ = ["ContentRule", "RULES", "DEFAULT_RULE", "QUERY_ALIGN_E", "QUERY_LAMBDAS", "QUERY_BET_PAIRS", "rule_named",
           "guard_value"]

#: The alignment evidence the ``"query"`` rule's "reads" needs (the content rule's: :data:`~.evidence.ALIGN_E`):
#: none; a model's own taste cancels in what the query adds (the ``decisions-query`` run of
#: ``benchmarks/results/decisions/decisions.md``).
QUERY_ALIGN_E = 0.0
#: Its betting fraction on "does not read" (the "reads" side multiplies each query's own e-value:
#: :func:`~.query_contrast.judge`).
QUERY_LAMBDAS = (0.95,)
#: Lists of fewer slot pairs than this bet proportionally less on "does not read" (``Evidence.bet_pairs``): a
#: 4-passage list's score is one sign.
QUERY_BET_PAIRS = 5


@dataclass(frozen=True)
class ContentRule:
    """One content rule (module docstring)."""

    name: str
    orders: Callable[[int], Sequence[list[int]]]
    summary: Callable[[Reading], tuple[Any, ...]]  # what Evidence.add takes: (score, alignment, pairs[, e, ...])
    evidence: Callable[[int], Evidence]
    strength: Callable[..., tuple[float, dict[float, float]]]
    min_passages: int = MIN_PASSAGES
    query_free: bool = False  # each order read again without the query (.query_contrast)
    #: What a decision key records of the rule (``("rule", key)``; none for ``""``): a new one whenever the rule's
    #: test changes, so that decisions saved under the old test are refused (:func:`~.content_check.decision_key`).
    key: str = ""


#: The content rules ``guard`` can name. ``"query"`` (the default): each query's top window read in four orders (six
#: below ten slot pairs: :func:`~.query_contrast.reading_orders`) with the query and again with it replaced by a
#: placeholder, and a sequential test over queries on what the query adds, centred over the list's pairs, each
#: query's e-value from the signs of its estimates (:mod:`.query_contrast`): a model's preferences of its own, the
#: same whatever the query, cancel, and so does a query effect alike in every pair. Three outcomes: "reads", "does
#: not read", "cannot tell" (docs/content-check.md: each one's guarantee and its conditions); its key ``query-three-wide``
#: since "reads" also needs the taste gate over the scales 0.5-3 (:data:`~.evidence.WIDE_E`: a weak taste
#: sharpened 3x passed the gate before, key ``query-three``, whose saved decisions are refused). ``"content"``: the
#: four orders with the query only (:mod:`.contrast`), half the deciding prompts, and an alignment threshold against a
#: model's own preferences that also delays a reader (the ``tradeoff`` run of
#: ``benchmarks/results/decisions/decisions.md``).
RULES: dict[str, ContentRule] = {
    "query": ContentRule("query", query_contrast.reading_orders, query_contrast.summary,
                         lambda cap: Evidence(cap=cap, align_e=QUERY_ALIGN_E, lambdas=QUERY_LAMBDAS,
                                              bet_pairs=QUERY_BET_PAIRS),
                         alpha_of_readings, query_free=True, key="query-three-wide"),
    "content": ContentRule("content", reading_orders, summary, lambda cap: Evidence(cap=cap), alpha_of_readings),
}
#: The rule of ``guard``'s default (docs/content-check.md: why the query-free contrast).
DEFAULT_RULE = "query"


def rule_named(name: str) -> ContentRule:
    """The rule ``guard`` names.

    >>> rule_named("content").orders(4)[1]
    [2, 3, 0, 1]
    """
    try:
        return RULES[name]
    except KeyError:
        raise InputError(f"unknown content rule {name!r}; choose one of {', '.join(RULES)} or None") from None


def guard_value(value: Any) -> str | None:
    """``guard`` as the engine reads it: a rule's name or ``None``. A number (the retired per-list guard's
    z-score) is read as the default rule, with a ``FutureWarning``; anything else is an
    :class:`~.errors.InputError`.

    >>> guard_value(None), guard_value("content")
    (None, 'content')
    """
    if value is None or (isinstance(value, str) and value in RULES):
        return value
    if is_finite(value):
        warnings.warn(f"guard={value!r}: the per-list guard was retired (fooled by slot effects on the testbed: "
                      f"docs/content-check.md); read as guard={DEFAULT_RULE!r}, the default content check. Pass guard="
                      f"{DEFAULT_RULE!r} (the default) or None (always calibrate).", FutureWarning, stacklevel=5)
        return DEFAULT_RULE
    raise InputError(f"guard must be {' or '.join(repr(r) for r in RULES)} (a content rule) or None to calibrate "
                     f"always, got {value!r}")
