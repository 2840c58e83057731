"""The content checks an endpoint state keeps: one :class:`~.check.ContentCheck` per key (model, weights,
reading options), in ``EndpointState.content``, made on first use and bounded (:data:`MAX_CHECKS`); the
decision store the reranker set on the state (``EndpointState.decisions``) handed to each.

:func:`check_of` is what a ranking asks (the check for its options, or none), :func:`decision_of` what a
reranker shows (``content_decision``), :func:`adopt` how a decision taken elsewhere (judged queries) is
installed. No I/O.
"""

from __future__ import annotations

import threading
from typing import Any

from ..endpoints.calls import EndpointState
from ..errors import InputError
from .check import ContentCheck
from .decision import ContentDecision, Key, decision_key
from .evidence import CAP
from .judged import pooled
from .rules import DEFAULT_RULE, RULES, ContentRule

__all__ = ["MAX_CHECKS", "check_for", "check_of", "decision_of", "adopt"]


#: The most checks an endpoint state keeps (one per key: option variants); what goes first: :func:`_cost`.
MAX_CHECKS = 16
_CHECKS_LOCK = threading.Lock()
_ADOPT_LOCK = threading.Lock()  # a decision pooled and installed as one step (two decide() calls at once)


def check_for(checks: dict[Key, ContentCheck], key: Key, saved: str | None = None, cap: int = CAP,
              rule: ContentRule = RULES[DEFAULT_RULE], store: Any = None) -> ContentCheck:
    """The check for ``key`` in an endpoint state's ``checks``, made on first use (by ``rule``; at most
    :data:`MAX_CHECKS`, the cheapest to lose dropped first: :func:`_cost`); what the options ask of it applied
    (:meth:`ContentCheck.use`: the ``saved`` decision, JSON or a file, wins where it is about the same key, else a
    warning; a new ``cap``; the ``store``'s decision for the key)."""
    check = checks.get(key)
    if check is None:
        with _CHECKS_LOCK:
            check = checks.get(key)
            if check is None:
                while len(checks) >= MAX_CHECKS:
                    old = min(checks, key=lambda k: _cost(checks[k]))
                    del checks[old]  # insertion order breaks ties: the oldest of the cheapest to lose
                check = checks[key] = ContentCheck(key, None, cap, rule, store)
    check.use(saved, cap)
    return check


def _cost(check: ContentCheck) -> int:
    """What losing ``check`` costs, lowest dropped first: an idle undecided check (0: its readings are kept in the
    store, or a few queries to read again), one reading now (1), a label-free decision (2: reloaded from the store
    where weights are reported, else minutes of readings again), a decision from judged queries (3: the labels are
    gone, and where the endpoint reports no weights nothing brings it back)."""
    d = check.decision
    if d is None:
        return 1 if check._busy > 0 else 0
    return 3 if d.judged > 0 else 2


def _key(state: EndpointState, opts: Any) -> Key:
    return decision_key(state.caps.model, state.caps.weights, opts)


def check_of(state: EndpointState, opts: Any) -> ContentCheck | None:
    """The content check an endpoint state keeps for these options (``state.content``), or ``None`` where
    none runs: methods without the empty prompt, or ``guard=None``. ``opts.guard`` names the rule
    (:data:`~.rules.RULES`)."""
    if not opts.calibrated or opts.guard is None:
        return None
    return check_for(state.content, _key(state, opts), opts.decision, opts.check_lists, RULES[opts.guard], state.decisions)


def decision_of(state: EndpointState, opts: Any) -> ContentDecision | None:
    """The decision taken (or loaded: the ``decision`` option, the store) for these options on this endpoint
    state, ``None`` before it is."""
    if state.caps is None:
        return None
    key = _key(state, opts)
    if opts.guard is None:
        check = state.content.get(key)
    else:
        check = check_for(state.content, key, opts.decision, opts.check_lists, RULES[opts.guard], state.decisions)
    return check.decision if check is not None else None


def adopt(state: EndpointState, opts: Any, decision: ContentDecision, source: str = "adopted") -> ContentDecision:
    """Install ``decision`` (taken elsewhere, e.g. from judged queries) on the check of these options' key on this
    probed endpoint state, announced and saved like the check's own (:meth:`ContentCheck.settle`); an
    :class:`~.errors.InputError` if it is about another key. A decision from judged queries is pooled with the
    key's judged record in force (:func:`~.judged.pooled`: the queries judged before and the new ones in one
    sequential test), not put in its place; without a record in force it replaces what is there. Returns the
    decision in force."""
    key = _key(state, opts)
    if decision.key != key:
        raise InputError(f"the decision is about another model or other options than these ({dict(decision.key)} "
                         f"vs {dict(key)})")
    check = check_for(state.content, key, None, opts.check_lists, RULES[opts.guard or DEFAULT_RULE], state.decisions)
    with _ADOPT_LOCK:
        if decision.judged:
            decision = pooled(check.decision, decision)
            if decision is check.decision:
                return decision  # nothing new: as it was
        return check.settle(decision, source)
