"""Does the model read the passages? One decision per model, prompt and placeholder, from a few lists.

CapCal subtracts the empty prompt's slot prior from the real prompt's identifier distribution. On a
model that ranks by slot alone that leaves noise (and slot effects the empty prompt does not show), so
the calibrated ranking is worse than the first-stage order; on a model that reads, it is better. Which
one a model is, is a property of the model, the prompt and the placeholder, not of one list: it is
decided once, from the first :data:`LISTS` lists ranked, and cached on the endpoint state.

**The statistic** (:mod:`.contrast`): each deciding list is read a second time with its halves swapped, and a
slot-paired contrast of the two readings, referred to its exact permutation distribution, says whether the
passages move the model (whatever the slots do cancels).

**What it cannot see**: it is label-free, so any preference that follows the passages passes it, whether
it is relevance or not (length, style, a keyword). It says "the model ranks by the passages", not "by
their relevance".

**While deciding** (the first :data:`LISTS` lists), each list's swapped reading costs one more prompt
at its first step, and the list is ranked calibrated when the lists pooled so far pass at the looser
:data:`INTERIM` level (the first list always: nothing to pool yet). Once decided, a list costs the real
and the empty prompts only (nothing at all when the model does not read: the given order is kept).

**The calibration strength** (``alpha="auto"``) is chosen on the same lists, label-free
(:func:`~.contrast.choose_alpha`).

The decision, its cache on the endpoint state, and the verdict per list; no I/O.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import pathlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from .contrast import ALPHAS, Contrast, Reading, choose_alpha, halves_swapped, implied_order, paired_contrast
from .errors import InputError

__all__ = ["LISTS", "LEVEL", "INTERIM", "ALPHAS", "halves_swapped", "Reading", "Contrast", "paired_contrast",
           "implied_order", "choose_alpha", "ContentDecision", "Verdict", "ContentCheck", "decision_key",
           "load_decision", "check_for", "check_of", "decision_of"]

log = logging.getLogger("capcal_integrations")

#: Lists pooled for the decision.
LISTS = 8
#: The decision's level: the model reads when the permutation p-value is at most this.
LEVEL = 0.01
#: The provisional level for the lists ranked while deciding (a miss costs a reading model more than a
#: false pass costs one that does not read, and the final decision is taken at :data:`LEVEL`).
INTERIM = 0.2
INTERIM_PERMUTATIONS = 199


Key = tuple[tuple[str, str], ...]


def decision_key(model: str, template: Any, placeholder: str, prompt: str, labels: str, calibration: str) -> Key:
    """What a decision is about: the model, the prompt (template, format, identifiers), the placeholder,
    and the calibration form (for ``alpha``). A template is named with a digest of its text.

    >>> dict(decision_key("m", "rank_zephyr", "x", "chat", "numeric", "additive"))["template"]
    'rank_zephyr'
    """
    name = template if isinstance(template, str) else getattr(template, "name", "custom")
    if not isinstance(template, str):
        text = repr(tuple(getattr(template, f, "") for f in ("system", "head", "passage", "tail")))
        name = f"{name}:{hashlib.sha256(text.encode()).hexdigest()[:10]}"
    return (("model", str(model)), ("template", name), ("placeholder", placeholder), ("prompt", prompt),
            ("labels", labels), ("calibration", calibration))


@dataclass(frozen=True)
class ContentDecision:
    """The content check's decision for one model, prompt and placeholder. Inspect it, print it (one line),
    save it (:meth:`to_json`) and hand it to another process (the ``decision`` option: the JSON or a file
    holding it), which then ranks without deciding again."""

    reads: bool
    p_value: float
    ratio: float  # content-to-noise ratio of the contrast (about 1 without content)
    lists: int
    alpha: float  # chosen for calibrated decoding (alpha="auto")
    alpha_first_token: float  # chosen for first-token-capcal
    curve: tuple[tuple[float, float], ...]  # (alpha, mean tau between the two readings' implied rankings)
    key: Key
    level: float = LEVEL
    saved: bool = field(default=False, compare=False)  # loaded from a saved decision

    def __str__(self) -> str:
        about = ", ".join(f"{k} {v!r}" for k, v in self.key if k != "calibration")
        if self.reads:
            verdict = (f"the model reads the passages (p = {self.p_value:.3g} <= {self.level:g}; content/noise "
                       f"{self.ratio:.1f}); alpha {self.alpha:g} (first-token {self.alpha_first_token:g}) chosen label-free")
        else:
            verdict = (f"no content signal beyond the slot effects (p = {self.p_value:.3g} > {self.level:g}; content/"
                       f"noise {self.ratio:.2f}): lists keep their given order")
        return f"content check on {self.lists} lists{' (saved)' if self.saved else ''} for {about}: {verdict}"

    def to_json(self) -> str:
        values = asdict(self)
        values.pop("saved")
        values["key"], values["curve"] = dict(self.key), [list(x) for x in self.curve]
        return json.dumps({"capcal_content_decision": 1, **values})

    @classmethod
    def from_json(cls, text: str) -> ContentDecision:
        try:
            values = json.loads(text)
            if values.pop("capcal_content_decision", None) != 1:
                raise ValueError("not a capcal content decision (no 'capcal_content_decision': 1)")
            values["key"] = tuple((str(k), str(v)) for k, v in values["key"].items())
            values["curve"] = tuple((float(a), float(t)) for a, t in values["curve"])
            return cls(**values, saved=True)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise InputError(f"cannot read the saved content decision: {err}; pass the JSON of "
                             "ContentDecision.to_json() or a file holding it") from None


@functools.lru_cache(maxsize=16)
def load_decision(raw: str) -> ContentDecision:
    """A saved decision from its JSON text or from a file holding it."""
    text = raw
    if not raw.lstrip().startswith("{"):
        try:
            text = pathlib.Path(raw).read_text(encoding="utf-8")
        except OSError as err:
            raise InputError(f"cannot read the saved content decision from {raw!r}: {err}") from None
    return ContentDecision.from_json(text)


@dataclass(frozen=True)
class Verdict:
    """What the check says for the list being ranked: whether to calibrate it, with which ``alpha``
    (``None``: not chosen yet), whether this is the final decision, and the note for the ranking."""

    reads: bool
    alpha: float | None
    final: bool
    note: str


class ContentCheck:
    """The check of one model, prompt and placeholder (:func:`decision_key`): the readings pooled while
    deciding, then the decision. Shared by every ranking on the endpoint state (threads included)."""

    def __init__(self, key: Key, decision: ContentDecision | None = None, lists: int = LISTS) -> None:
        self.key, self.decision, self.lists = key, decision, lists
        self.readings: list[Reading] = []
        self._lock = threading.Lock()

    def verdict(self, first_only: bool = False) -> Verdict | None:
        """The final verdict, or ``None`` while deciding."""
        d = self.decision
        if d is None:
            return None
        alpha = d.alpha_first_token if first_only else d.alpha
        about = f"content check ({d.lists} lists, p = {d.p_value:.3g}{', saved' if d.saved else ''})"
        note = (f"{about}: the model reads the passages; calibrated at alpha {alpha:g}" if d.reads else
                f"{about}: no content signal beyond the slot effects; kept in its given order")
        return Verdict(d.reads, alpha, True, note)

    def add(self, reading: Reading, form: str = "additive", first_only: bool = False) -> Verdict:
        """Pool one more list's readings; the decision once :attr:`lists` are pooled, else a provisional verdict."""
        with self._lock:
            if self.decision is None:
                self.readings.append(reading)
                k = len(self.readings)
                if k >= self.lists:
                    self.decision = self._decide(form)
                    log.info("capcal: %s", self.decision)
                else:
                    contrast = paired_contrast(self.readings, INTERIM_PERMUTATIONS) if k >= 2 else None
                    reads = contrast is None or contrast.p_value <= INTERIM
                    evidence = "nothing to pool yet" if contrast is None else f"p = {contrast.p_value:.3g} vs {INTERIM:g}"
                    return Verdict(reads, None, False, f"content check pending ({k} of {self.lists} lists): provisionally "
                                   f"{'calibrated' if reads else 'kept in its given order'} ({evidence})")
        verdict = self.verdict(first_only)
        assert verdict is not None
        return verdict

    def _decide(self, form: str) -> ContentDecision:
        contrast = paired_contrast(self.readings)
        alpha, curve = choose_alpha(self.readings, form=form)
        first, _ = choose_alpha(self.readings, form=form, first_only=True)
        return ContentDecision(contrast.p_value <= LEVEL, contrast.p_value, contrast.ratio, contrast.lists, alpha, first,
                               tuple(curve.items()), self.key)


_CHECKS_LOCK = threading.Lock()


def check_for(checks: dict[Key, ContentCheck], key: Key, saved: str | None = None, lists: int = LISTS) -> ContentCheck:
    """The check for ``key`` in an endpoint state's ``checks``, made on first use; seeded with the ``saved``
    decision (JSON or a file) when that decision is about the same key (else logged, and decided afresh)."""
    check = checks.get(key)
    if check is not None:
        return check
    decision = load_decision(saved) if saved else None
    if decision is not None and decision.key != key:
        log.warning("capcal: the saved content decision is for %s, not %s: deciding afresh", dict(decision.key), dict(key))
        decision = None
    with _CHECKS_LOCK:
        check = checks.setdefault(key, ContentCheck(key, decision, lists))
    if decision is not None and check.decision is decision:
        log.info("capcal: %s", decision)
    return check


def check_of(state: Any, opts: Any) -> ContentCheck | None:
    """The content check an endpoint state keeps for these options (``state.content``), or ``None`` where
    none runs: methods without the empty prompt, or another ``guard`` than ``"content"`` (then no list
    costs a second reading, and ``alpha="auto"`` is 1)."""
    if not opts.calibrated or opts.guard != "content":
        return None
    key = decision_key(state.caps.model, opts.template, opts.placeholder, opts.prompt, opts.labels, opts.calibration)
    return check_for(state.content, key, getattr(opts, "decision", None), getattr(opts, "check_lists", LISTS))


def decision_of(state: Any, opts: Any) -> ContentDecision | None:
    """The decision taken (or loaded) for these options on this endpoint state, ``None`` before it is."""
    if state.caps is None:
        return None
    key = decision_key(state.caps.model, opts.template, opts.placeholder, opts.prompt, opts.labels, opts.calibration)
    check = state.content.get(key)
    if check is None and getattr(opts, "decision", None):
        check = check_for(state.content, key, opts.decision)
    return check.decision if check is not None else None
