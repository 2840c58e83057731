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
queries (:class:`~.evidence.Evidence`) says "reads", "does not read" or "cannot tell" as soon as the evidence is
strong enough (docs/content-check.md: what each outcome guarantees, and under which conditions), or "undecided"
(treated as not reading) after ``check_lists`` queries. "cannot tell": the model prefers some passages consistently
with the query, but what the query adds copies what it prefers without the query, or does not go the first stage's
way; only judged queries tell such a model from a reader.

**While undecided** every list keeps its given order (with a note): a model that does not read never
pays in quality. The readings are taken off the request path: the reranker hands a :class:`~.attempts.Pending`
reading to a background runner (at most one in flight per check; see :mod:`.reranker`), or, with
``check_wait=True`` (batch jobs), the ranking takes them itself before it is ranked; a reading that fails is
tried again later (:mod:`.attempts`).

**What it cannot see**: it is label-free, so any preference the query creates passes it, whether it is
relevance or not (matching the query's words, as BM25 does). It says "the query moves the model's ranking",
not "toward relevance".

The decision, its cache on the endpoint state and the verdict per list; no I/O: a decision is set in one place,
:meth:`ContentCheck.settle`, which hands it to the store the reranker set on the endpoint state
(:mod:`.saved_decisions`: kept across processes), where the next process's check finds it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .attempts import Attempts, Pending
from .contrast import MIN_PASSAGES, Reading
from .decision import KEY_OPTIONS, ContentDecision, Key, decision_key, key_id, load_decision
from .evidence import CAP, EFFECT, LEVEL, MISS
from .rules import DEFAULT_RULE, RULES, ContentRule

# KEY_OPTIONS, Key, ContentDecision, decision_key, load_decision: .content_decision's, re-exported here
__all__ = ["LEVEL", "MISS", "EFFECT", "CAP", "MIN_PASSAGES", "KEY_OPTIONS", "Key", "ContentDecision", "Verdict",
           "ContentCheck", "Pending", "decision_key", "load_decision", "announce"]

log = logging.getLogger("capcal_integrations")
_announced: set[str] = set()  # key_id + verdict of the decisions said at WARNING (once per process: announce)
_announced_lock = threading.Lock()
_deciding: set[str] = set()  # key_id of the keys whose first kept list said so at WARNING (once per process)


def query_identity(query: str) -> str:
    """A query's identity for the check: its words, case and compatibility forms folded, punctuation and spacing
    dropped. The check's e-values assume each query is a new draw; the same query asked again (with another
    passage, another capitalisation) would be the same evidence counted twice (the null suite's repeated-query cells).

    >>> query_identity("What is a  Flea?") == query_identity("what is a flea") != query_identity("what is a tick")
    True
    """
    words = re.findall(r"\w+", unicodedata.normalize("NFKC", query).casefold())
    return hashlib.sha256(" ".join(words).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Verdict:
    """What the check says for the list being ranked: whether to calibrate it and with which ``alpha``, and
    the note for the ranking."""

    reads: bool
    alpha: float
    note: str


class ContentCheck:
    """The check of one key (:func:`decision_key`): the evidence pooled while deciding, then the decision.
    Shared by every ranking on the endpoint state (threads included). Its decision is set in one place,
    :meth:`settle` (the rule's, the store's, the ``decision`` option's, :func:`adopt`'s), which announces it and
    saves it in ``store`` (an object with ``load(key)`` and ``save(decision, source)``: :mod:`.saved_decisions`)."""

    def __init__(self, key: Key, decision: ContentDecision | None = None, cap: int = CAP,
                 rule: ContentRule = RULES[DEFAULT_RULE], store: Any = None) -> None:
        self.key, self.decision, self.cap, self.rule, self.store = key, decision, cap, rule, store
        self.source = "saved" if decision is not None and decision.saved else "given"
        self.evidence = rule.evidence(cap)
        self.readings: list[Reading] = []
        self.read: list[str] = []  # the identities of the queries of ``readings`` (kept with them: the store)
        self.attempts = Attempts()  # lists read and being read, failures and retries
        self._option: str | None = None  # the decision option last installed
        self._looked = False  # the store looked up
        self._warned = False  # the first list kept while deciding said so at WARNING
        self._lock = threading.Lock()

    @property
    def _busy(self) -> int:
        return len(self.attempts.flying)

    def verdict(self, first_only: bool = False) -> Verdict | None:
        """The decision's verdict, or ``None`` while deciding."""
        d = self.decision
        if d is None:
            return None
        alpha = d.alpha_first_token if first_only else d.alpha
        if d.judged:
            return Verdict(d.reads, alpha, f"decided from {d.judged} judged queries{' (saved)' if d.saved else ''}: "
                                           f"{d.labels_note()}")
        about = f"content check ({d.lists} queries, e = {d.e_value:.3g}{', saved' if d.saved else ''})"
        if d.reads:
            note = f"{about}: the model reads the passages; calibrated at alpha {alpha:g}"
        elif d.verdict == "cannot tell":
            note = (f"{about}: cannot tell whether the model reads the passages (its preferences with the query copy "
                    "its preferences without it, or do not go the first stage's way); kept in its given order until "
                    "judged queries decide (reranker.decide(judged), capcal decide; guard=None calibrates anyway)")
        elif d.verdict == "undecided":
            note = (f"{about}: undecided at the cap, treated as not reading; kept in its given order (a larger "
                    "check_lists reads on; judged queries decide: reranker.decide(judged); guard=None calibrates "
                    "anyway)")
        else:
            note = (f"{about}: no content signal beyond the slot effects; kept in its given order (guard=None "
                    "calibrates anyway)")
        return Verdict(d.reads, alpha, note)

    def pending_note(self, n: int) -> str:
        """The note of a list ranked while deciding; the first such list of this check also says so once at
        WARNING (the model, the check's state, how to decide now)."""
        e = self.evidence
        why = (f"shorter than {self.rule.min_passages} passages, not read for it" if n < self.rule.min_passages else
               f"{e.queries} of at most {self.cap} queries read, e = {e.for_reads:.3g}")
        with self._lock:
            fresh, self._warned = not self._warned and self.decision is None, True
        warn = False
        if fresh:  # once per key and process: a check made again (evicted, another reranker) says it at no level
            with _announced_lock:
                warn = key_id(self.key) not in _deciding
                _deciding.add(key_id(self.key))
        if warn:
            log.warning("capcal: model %r: lists keep their given order (the retriever's, with its scores) while the "
                        "content check decides whether the model reads the passages (%d of at most %d queries read; "
                        "readings run off the request path unless check_wait=True, minutes a query on a CPU server, and are "
                        "kept across runs: capcal status). "
                        "To decide now: reranker.decide(judged) or `capcal decide --data DIR` with judged queries; guard=None "
                        "calibrates anyway (docs/content-check.md).", dict(self.key).get("model"), e.queries, self.cap)
        return f"content check deciding ({why}{self.attempts.note()}): kept in its given order until it decides"

    def want(self, query: str, texts: Sequence[str], exclusive: bool = True) -> str | None:
        """Whether to read this list for the check now: undecided, long enough, a query not read before (by its
        words: :func:`query_identity`, whatever its passages), not waiting after failed readings and (``exclusive``:
        background readings) no other reading in flight; then the query's identity (truthy), in flight until
        :meth:`release`."""
        if len(texts) < self.rule.min_passages:
            return None
        ident = query_identity(query)
        if self.store is not None:  # as the store keeps it (hashed under its folder's key): compared with its readings
            ident = self.store.keyed(ident)
        return ident if self.decision is None and self.attempts.want(ident, exclusive) else None

    def release(self, ident: str = "") -> None:
        """A reading ended (read, failed or dropped): a list not read may be read later."""
        self.attempts.release(ident)

    def failed(self, err: BaseException) -> None:
        """A reading failed: the next waits (:class:`~.attempts.Attempts`)."""
        self.attempts.failed(err)

    def add(self, reading: Reading, form: str = "additive", ident: str = "") -> ContentDecision | None:
        """Pool one query's readings; the decision once there is one (computed here: call it off an event loop)."""
        facts = self.rule.summary(reading)
        self.attempts.read(ident)
        with self._lock:
            if self.decision is not None:
                return self.decision
            verdict = self._pool(reading, ident, facts)
            readings, read = list(self.readings), list(self.read)
        if verdict is None:
            if self.store is not None:  # the next process goes on from here (.saved_readings)
                self.store.save_readings(self.key, readings, read, self.evidence.for_reads)
            return None
        return self.settle(self._decide(verdict, readings, form), f"rule {self.rule.name!r}", first=True)

    def _pool(self, reading: Reading, ident: str, facts: Any) -> str | None:
        """One query's reading pooled (under ``_lock``): the rule's verdict, or ``None`` while deciding."""
        self.readings.append(reading)
        self.read.append(ident)
        return self.evidence.add(*facts)

    def _resume(self) -> None:
        """Go on from the readings another process kept for this key (the store's), as if read here in turn."""
        form = dict(self.key).get("calibration", "additive")  # the readings' form is part of the key
        progress = self.store.load_readings(self.key)
        if progress is None:
            return
        try:  # every kept reading checked before any is pooled
            facts = [self.rule.summary(reading) for reading in progress.readings]
        except ValueError as err:  # a reading of another shape than this rule's (a file edited by hand)
            log.warning("capcal: a kept reading does not fit the %r rule (%s); the check reads afresh", self.rule.name,
                        err)
            return
        verdict = None
        with self._lock:
            for ident, reading, fact in zip(progress.read, progress.readings, facts):
                if verdict is not None or ident in self.read:
                    continue
                self.attempts.read(ident)
                verdict = self._pool(reading, ident, fact)
            readings = list(self.readings)
        log.info("capcal: the content check goes on from %d queries read before (%s)", len(readings), progress.path)
        if verdict is not None:
            self.settle(self._decide(verdict, readings, form), f"rule {self.rule.name!r}", first=True)

    def settle(self, decision: ContentDecision, source: str, first: bool = False) -> ContentDecision:
        """The one place a decision is set: installed (``first``: only if none is), announced in one log line and
        saved in the store (unless it came from there: ``source`` ``"saved"``). Returns the decision in force."""
        with self._lock:
            if self.decision is decision or (first and self.decision is not None):
                return self.decision  # type: ignore[return-value]
            self.decision, self.source = decision, source
        announce(decision, loud=self._warned)
        if self.store is not None and source != "saved":
            self.store.save(decision, source)
        return decision

    def use(self, saved: str | None, cap: int) -> None:
        """What a ranking's options ask of the check: a ``decision`` option not installed yet (it wins: installed
        if about this key, else a warning), a new cap (``check_lists``), and once, the store's decision."""
        if saved and saved != self._option:
            decision = load_decision(saved)
            self._option = saved
            if decision.key != self.key:
                theirs, ours = dict(decision.key), dict(self.key)
                differ = {k: (theirs.get(k), ours.get(k)) for k in {*theirs, *ours} if theirs.get(k) != ours.get(k)}
                log.warning("capcal: the saved content decision is about another model or other options (saved vs now: "
                            "%s): not used, deciding afresh (or with this key's kept decision)", differ)
            else:
                self.settle(decision, "option")
        if cap != self.cap:
            self._recap(cap)
        if self.decision is None and self.store is not None and not self._looked:
            self._looked = True
            stored = self.store.load(self.key)
            if stored is not None and not (stored.verdict == "undecided" and stored.lists < self.cap):
                self.settle(stored, "saved", first=True)
            else:
                self._resume()

    def _recap(self, cap: int) -> None:
        """A new ``check_lists``: an "undecided" at a smaller cap reads on (the e-process may go on: it is valid at
        any stopping time); a check past a smaller one stops undecided now."""
        with self._lock:
            self.cap = self.evidence.cap = cap
            d, e = self.decision, self.evidence
            if d is not None and d.verdict == "undecided" and d.lists < cap and self.source != "option":
                self.decision, self._looked = None, True
                if e.verdict == "undecided":
                    e.verdict = None
                log.info("capcal: check_lists raised to %d: the content check reads on after %d queries", cap, e.queries)
                return
            if d is not None or e.verdict is not None or e.queries < cap:
                return
            e.verdict, readings = "undecided", list(self.readings)
        self.settle(self._decide("undecided", readings, "additive"), f"rule {self.rule.name!r}", first=True)

    def _decide(self, verdict: str, readings: list[Reading], form: str) -> ContentDecision:
        e = self.evidence
        reads = verdict == "reads"
        alpha, curve = self.rule.strength(readings, form=form) if reads else (1.0, {})
        first = self.rule.strength(readings, form=form, first_only=True)[0] if reads else 1.0
        return ContentDecision(reads, verdict, min(1.0, 1.0 / max(e.for_reads, 1e-300)), e.for_reads,
                               sum(e.scores) / max(1, e.queries), e.queries, alpha, first, tuple(curve.items()), self.key,
                               aligned=e.aligned, e_aligned=min(e.for_aligned, 1e300),
                               e_taste=min(e.for_taste, 1e300))


def announce(decision: ContentDecision, loud: bool = False) -> None:
    """One log line per decision: a WARNING when the reranker is a pass-through for this model, or when lists were
    kept while deciding and said so (``loud``: the user who saw that warning sees the decision too); else INFO. A
    WARNING once per decision (key and verdict) and process: a check made again (evicted, another reranker) that
    reloads it says it at INFO."""
    said = f"{key_id(decision.key)} {decision.verdict}"
    loud = loud or not decision.reads  # a pass-through is worth a WARNING: once per decision and process
    with _announced_lock:
        loud = loud and said not in _announced
        if loud:
            _announced.add(said)
    if decision.reads:
        log.log(logging.WARNING if loud else logging.INFO, "capcal: %s; lists are calibrated from now on", decision)
    else:
        then = ("only judged queries can tell: reranker.decide(judged) or `capcal decide` decides from them"
                if decision.verdict == "cannot tell" else
                "with judged queries reranker.decide(judged) decides from them")
        log.log(logging.WARNING if loud else logging.INFO, "capcal: %s. The reranker keeps the given order of every "
                "list for this model and these options (the retriever's, with its scores); %s, guard=None calibrates "
                "anyway.", decision, then)
