"""Does the model read the passages? One decision per model and reading options, taken over the queries.

CapCal subtracts the empty prompt's slot prior from the real prompt's identifier distribution. On a
model that ranks by slot alone that leaves noise, so the calibrated ranking is worse than the
first-stage order; on a model that reads, it is better. Which one a model is, is a property of the
model and of how it is read (prompt, identifiers, placeholder, probabilities), not of one list: it is
decided once, over the queries ranked, and cached on the endpoint state (:func:`decision_key`).

**The rule** is the one ``guard`` names (:mod:`.rules`: where a content rule plugs in); this module keeps its
state per key. **The default rule** (:mod:`.query_contrast`): each query's list (its top window, 4 passages or
more) is read at the first step in four orders, with the query and without it; the agreement of two slot-free
estimates of what the query adds to the same passage pairs is the query's score, and a sequential test over the
queries (:class:`~.contrast.Evidence`) says "reads" or "does not read" as soon as the evidence is strong either
way (false "reads" at most 1 %, at any number of looks), or "does not read (undecided)" after ``check_lists``
queries.

**While undecided** every list keeps its given order (with a note): a model that does not read never
pays in quality. The readings are taken off the request path: the reranker hands a :class:`Pending`
reading to a background runner (at most one in flight per check; see :mod:`.reranker`), or, with
``check_wait=True`` (batch jobs), the ranking takes them itself before it is ranked.

**What it cannot see**: it is label-free, so any preference the query creates passes it, whether it is
relevance or not (matching the query's words, as BM25 does). It says "the query moves the model's ranking",
not "toward relevance".

The decision, its cache on the endpoint state and the verdict per list; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .contrast import CAP, EFFECT, LEVEL, MIN_PASSAGES, MISS, Reading
from .errors import InputError
from .files import option_text
from .rules import DEFAULT_RULE, RULES, ContentRule

__all__ = ["LEVEL", "MISS", "EFFECT", "CAP", "MIN_PASSAGES", "KEY_OPTIONS", "ContentDecision", "Verdict",
           "ContentCheck", "Pending", "decision_key", "load_decision", "check_for", "check_of", "decision_of"]

log = logging.getLogger("capcal_integrations")

#: The options that change the readings, and so a decision: each is part of its key.
KEY_OPTIONS = ("template", "placeholder", "prompt", "labels", "calibration", "probability", "decoding", "normalise",
               "window", "max_passage_words", "top_logprobs")

Key = tuple[tuple[str, str], ...]


def _name(template: Any) -> str:
    """A template by name; a custom one with a digest of its text."""
    if isinstance(template, str):
        return template
    text = repr(tuple(getattr(template, f, "") for f in ("system", "head", "passage", "tail")))
    return f"{getattr(template, 'name', 'custom')}:{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def decision_key(model: str, weights: str, opts: Any) -> Key:
    """What a decision is about: the served model (its name and a fingerprint of its weights, as the server
    reports them) and every option that changes the readings (:data:`KEY_OPTIONS`).

    >>> from capcal_integrations.options import Options
    >>> key = dict(decision_key("m", "sha:1", Options(template="rank_zephyr")))
    >>> key["model"], key["weights"], key["template"].split(":")[0], key["window"]
    ('m', 'sha:1', 'rank_zephyr', '20')
    """
    values = {k: _name(opts.template) if k == "template" else str(getattr(opts, k)) for k in KEY_OPTIONS}
    # the content rule's keys stay as they were before there were rules (its saved decisions still apply)
    rule = (("rule", RULES[opts.guard].key),) if opts.guard is not None and RULES[opts.guard].key else ()
    return (("model", str(model)), ("weights", str(weights)), *values.items(), *rule)


@dataclass(frozen=True)
class ContentDecision:
    """The content check's decision for one key. Inspect it, print it (one line), save it (:meth:`to_json`)
    and hand it to another process (the ``decision`` option: the JSON or a file holding it), which then
    ranks without deciding again. ``verdict``: ``"reads"``, ``"does not read"`` or ``"undecided"`` (no
    decision within the cap: treated as not reading); ``e_value``: the evidence against "no content"
    (``p_value`` = its anytime-valid p-value, ``1 / e``); ``score``: the queries' mean agreement."""

    reads: bool
    verdict: str
    p_value: float
    e_value: float
    score: float
    lists: int  # queries pooled
    alpha: float  # chosen for calibrated decoding (alpha="auto")
    alpha_first_token: float  # chosen for first-token-capcal
    curve: tuple[tuple[float, float], ...]  # (alpha, mean tau between the readings' implied rankings)
    key: Key
    level: float = LEVEL
    aligned: float = 1.0  # the queries' mean alignment with the first stage's order (contrast.alignment)
    e_aligned: float = 1.0  # the evidence that it goes the first stage's way ("reads" needs contrast.ALIGN_E)
    saved: bool = field(default=False, compare=False)  # loaded from a saved decision

    def __str__(self) -> str:
        about = ", ".join(f"{k} {v!r}" for k, v in self.key if k in ("model", "weights", "template", "prompt"))
        evidence = (f"e = {self.e_value:.3g}, p <= {self.p_value:.3g}, mean agreement {self.score:.2f}, "
                    f"alignment {self.aligned:+.2f} (e = {self.e_aligned:.3g})")
        if self.reads:
            verdict = (f"the model reads the passages ({evidence}); alpha {self.alpha:g} (first-token "
                       f"{self.alpha_first_token:g}) chosen label-free")
        else:
            verdict = (f"{'undecided, so treated as ' if self.verdict == 'undecided' else ''}no content signal "
                       f"that follows the first stage ({evidence}): lists keep their given order")
        return f"content check on {self.lists} queries{' (saved)' if self.saved else ''} for {about}: {verdict}"

    def to_json(self) -> str:
        values = asdict(self)
        values.pop("saved")
        values["key"], values["curve"] = dict(self.key), [list(x) for x in self.curve]
        return json.dumps({"capcal_content_decision": 2, **values})

    @classmethod
    def from_json(cls, text: str) -> ContentDecision:
        try:
            values = json.loads(text)
            version = values.pop("capcal_content_decision", None)
            if version != 2:
                raise ValueError("not a capcal content decision of this version ('capcal_content_decision': 2"
                                 f"{'; version 1 decisions came from the older check: decide again' if version == 1 else ''})")
            values["key"] = tuple((str(k), str(v)) for k, v in values["key"].items())
            values["curve"] = tuple((float(a), float(t)) for a, t in values["curve"])
            return cls(**values, saved=True)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise InputError(f"cannot read the saved content decision: {err}; pass the JSON of "
                             "ContentDecision.to_json() or a file holding it") from None


def load_decision(raw: str) -> ContentDecision:
    """A saved decision from its JSON text or from a file holding it (read afresh at every call)."""
    return ContentDecision.from_json(option_text(raw, "the saved content decision"))


@dataclass(frozen=True)
class Verdict:
    """What the check says for the list being ranked: whether to calibrate it and with which ``alpha``, and
    the note for the ranking."""

    reads: bool
    alpha: float
    note: str


class ContentCheck:
    """The check of one key (:func:`decision_key`): the evidence pooled while deciding, then the decision.
    Shared by every ranking on the endpoint state (threads included)."""

    def __init__(self, key: Key, decision: ContentDecision | None = None, cap: int = CAP,
                 rule: ContentRule = RULES[DEFAULT_RULE]) -> None:
        self.key, self.decision, self.cap, self.rule = key, decision, cap, rule
        self.evidence = rule.evidence(cap)
        self.readings: list[Reading] = []
        self._seen: set[str] = set()
        self._busy = 0  # readings in flight
        self._lock = threading.Lock()

    def verdict(self, first_only: bool = False) -> Verdict | None:
        """The decision's verdict, or ``None`` while deciding."""
        d = self.decision
        if d is None:
            return None
        alpha = d.alpha_first_token if first_only else d.alpha
        about = f"content check ({d.lists} queries, e = {d.e_value:.3g}{', saved' if d.saved else ''})"
        note = (f"{about}: the model reads the passages; calibrated at alpha {alpha:g}" if d.reads else
                f"{about}: {'undecided after the cap, so ' if d.verdict == 'undecided' else ''}no content signal "
                "beyond the slot effects; kept in its given order (guard=None calibrates anyway)")
        return Verdict(d.reads, alpha, note)

    def pending_note(self, n: int) -> str:
        """The note of a list ranked while deciding."""
        e = self.evidence
        why = (f"shorter than {self.rule.min_passages} passages, not read for it" if n < self.rule.min_passages else
               f"{e.queries} of at most {self.cap} queries read, e = {e.for_reads:.3g}")
        return f"content check deciding ({why}): kept in its given order until it decides"

    def want(self, query: str, texts: Sequence[str], exclusive: bool = True) -> bool:
        """Whether to read this list for the check now: undecided, long enough, a list not read before and
        (``exclusive``: background readings) no other reading in flight; then one more is in flight until
        :meth:`release`."""
        if len(texts) < self.rule.min_passages:
            return False
        ident = hashlib.sha256(json.dumps([query, *texts]).encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            if self.decision is not None or (exclusive and self._busy) or ident in self._seen:
                return False
            self._seen.add(ident)
            self._busy += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._busy = max(0, self._busy - 1)

    def add(self, reading: Reading, form: str = "additive") -> ContentDecision | None:
        """Pool one query's readings; the decision once there is one (computed here: call it off an event loop)."""
        facts = self.rule.summary(reading)
        with self._lock:
            if self.decision is not None:
                return self.decision
            self.readings.append(reading)
            verdict = self.evidence.add(*facts)
            if verdict is None:
                return None
            readings = list(self.readings)
        decision = self._decide(verdict, readings, form)
        with self._lock:
            if self.decision is None:
                self.decision = decision
                announce(decision)
            return self.decision

    def _decide(self, verdict: str, readings: list[Reading], form: str) -> ContentDecision:
        e = self.evidence
        reads = verdict == "reads"
        alpha, curve = self.rule.strength(readings, form=form) if reads else (1.0, {})
        first = self.rule.strength(readings, form=form, first_only=True)[0] if reads else 1.0
        return ContentDecision(reads, verdict, min(1.0, 1.0 / max(e.for_reads, 1e-300)), e.for_reads,
                               sum(e.scores) / max(1, e.queries), e.queries, alpha, first, tuple(curve.items()), self.key,
                               aligned=e.aligned, e_aligned=min(e.for_aligned, 1e300))


def announce(decision: ContentDecision) -> None:
    """One log line per decision: a WARNING when the reranker becomes a pass-through for this model."""
    if decision.reads:
        log.info("capcal: %s", decision)
    else:
        log.warning("capcal: %s. The reranker keeps the given order of every list for this model and these options; "
                    "pass guard=None to calibrate anyway.", decision)


@dataclass
class Pending:
    """A list to read for the check: ``flow(state)`` is the :data:`~.protocol.Flow` of its readings; the runner
    (background or the ranking itself) then calls :meth:`deliver` with its result, and :meth:`done` always."""

    check: ContentCheck
    flow: Callable[[Any], Any]
    form: str = "additive"

    def deliver(self, reading: Reading) -> ContentDecision | None:
        return self.check.add(reading, self.form)

    def done(self) -> None:
        self.check.release()


_CHECKS_LOCK = threading.Lock()


def check_for(checks: dict[Key, ContentCheck], key: Key, saved: str | None = None, cap: int = CAP,
              rule: ContentRule = RULES[DEFAULT_RULE]) -> ContentCheck:
    """The check for ``key`` in an endpoint state's ``checks``, made on first use (by ``rule``); seeded with the
    ``saved`` decision (JSON or a file) when that decision is about the same key (else a warning, and decided
    afresh)."""
    check = checks.get(key)
    if check is not None:
        return check
    decision = load_decision(saved) if saved else None
    if decision is not None and decision.key != key:
        theirs, ours = dict(decision.key), dict(key)
        differ = {k: (theirs.get(k), ours.get(k)) for k in {*theirs, *ours} if theirs.get(k) != ours.get(k)}
        log.warning("capcal: the saved content decision is about another model or other options (saved vs now: %s): "
                    "deciding afresh", differ)
        decision = None
    with _CHECKS_LOCK:
        check = checks.setdefault(key, ContentCheck(key, decision, cap, rule))
    if decision is not None and check.decision is decision:
        announce(decision)
    return check


def _key(state: Any, opts: Any) -> Key:
    return decision_key(state.caps.model, getattr(state.caps, "weights", ""), opts)


def check_of(state: Any, opts: Any) -> ContentCheck | None:
    """The content check an endpoint state keeps for these options (``state.content``), or ``None`` where
    none runs: methods without the empty prompt, or ``guard=None``. ``opts.guard`` names the rule
    (:data:`~.rules.RULES`)."""
    if not opts.calibrated or opts.guard is None:
        return None
    return check_for(state.content, _key(state, opts), opts.decision, opts.check_lists, RULES[opts.guard])


def decision_of(state: Any, opts: Any) -> ContentDecision | None:
    """The decision taken (or loaded) for these options on this endpoint state, ``None`` before it is."""
    if state.caps is None:
        return None
    key = _key(state, opts)
    check = state.content.get(key)
    if check is None and opts.decision:
        check = check_for(state.content, key, opts.decision)
    return check.decision if check is not None else None
