"""Does the model read the passages? One decision per model, prompt and placeholder, from a few lists.

CapCal subtracts the empty prompt's slot prior from the real prompt's identifier distribution. On a
model that ranks by slot alone that leaves noise (and slot effects the empty prompt does not show), so
the calibrated ranking is worse than the first-stage order; on a model that reads, it is better. Which
one a model is, is a property of the model, the prompt and the placeholder, not of one list: it is
decided once, from the first :data:`LISTS` lists ranked, and cached on the endpoint state.

**The statistic: a slot-paired contrast.** Each deciding list is read a second time with its two halves
swapped (:func:`halves_swapped`: the passages of slots ``j`` and ``j + n/2`` trade places). For a pair
of slots, ``dA`` is the log-probability difference of the two slots in the given reading and ``dB`` in
the swapped one. Whatever the slots do (the prior, a real-vs-empty mismatch, a last-digit effect) is the
same in both readings, so it cancels in ``dA - dB``, which is twice the difference of the two passages'
content (plus noise). Without content, ``dA`` and ``dB`` are two exchangeable draws of the same slot
contrast in every list; with content, they move apart (``dA`` up where ``dB`` is down). The statistic
``T = -sum (dA - m)(dB - m)`` (``m`` the mean of the slot pair's values over the lists) is referred to
its exact permutation distribution: the values of each slot pair permuted across lists and readings.
Nothing is assumed about the slot effects' shape, the noise's distribution or ties (labels at one
floor value are exchangeable too). Measured on the testbed (:mod:`capcal_integrations.testbed`):
about 1 % false passes in every slot scenario, power >= 0.97 at a content slope of 0.5 logits per grade.

**What it cannot see**: it is label-free, so any preference that follows the passages passes it, whether
it is relevance or not (length, style, a keyword). It says "the model ranks by the passages", not "by
their relevance".

**While deciding** (the first :data:`LISTS` lists), each list's swapped reading costs one more prompt
at its first step, and the list is ranked calibrated when the lists pooled so far pass at the looser
:data:`INTERIM` level (the first list always: nothing to pool yet). Once decided, a list costs the real
and the empty prompts only (nothing at all when the model does not read: the given order is kept).

**The calibration strength** (``alpha="auto"``) is chosen on the same lists, label-free: the ``alpha``
whose calibrated rankings of the given and the swapped reading agree most (mean Kendall tau), each
ranking the decoding the first-step distributions imply (every later step the same distributions
restricted to the labels left: :func:`implied_order`).

Pure functions and one small class; no I/O.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import pathlib
import random
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .calibration import calibrated
from .errors import InputError
from .orders import kendall_tau, order_of_scores

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
#: The strengths tried by ``alpha="auto"``.
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
PERMUTATIONS, INTERIM_PERMUTATIONS = 999, 199


def halves_swapped(n: int) -> list[int]:
    """The second reading's order: slot ``j`` shows passage ``perm[j]``, the halves traded (for odd ``n``
    the last passage stays).

    >>> halves_swapped(4), halves_swapped(5)
    ([2, 3, 0, 1], [2, 3, 0, 1, 4])
    """
    h = n // 2
    return [*range(h, 2 * h), *range(h), *range(2 * h, n)]


@dataclass(frozen=True)
class Reading:
    """One list's first-step log-probabilities by slot: the given reading, the halves-swapped one and the
    empty prompt's (for choosing ``alpha``). Any additive constant per reading is irrelevant."""

    real: tuple[float, ...]
    swapped: tuple[float, ...]
    empty: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Contrast:
    """The slot-paired contrast of some readings: ``T``, the content-to-noise ratio (mean square of the
    within-list half-differences over that of the slot-pair sums about their means; about 1 without
    content), the permutation p-value, and the lists and slot pairs it pooled."""

    statistic: float
    ratio: float
    p_value: float
    lists: int
    pairs: int


def paired_contrast(readings: Sequence[Reading], permutations: int = PERMUTATIONS, seed: int = 0) -> Contrast:
    """The slot-paired contrast test (module docstring). Lists of different lengths are separate strata.

    Two lists of four passages; the model adds ``c`` to each passage (content) and ``b`` to each slot:

    >>> b, c1, c2 = [1.0, 0.0, 0.5, -1.0], [2.0, 0.0, 0.0, 1.0], [0.0, 1.0, 2.0, 0.0]
    >>> def reading(c):
    ...     swapped = [c[i] for i in halves_swapped(4)]
    ...     return Reading(tuple(x + y for x, y in zip(b, c)), tuple(x + y for x, y in zip(b, swapped)))
    >>> t = paired_contrast([reading(c1), reading(c2)])
    >>> t.statistic, t.lists, t.pairs  # pair 1: dA, dB = 2.5, -1.5 and -1.5, 2.5 (m = .5); pair 2: 0, 2 and 2, 0
    (10.0, 2, 2)
    >>> flat = paired_contrast([reading([0.0] * 4), reading([0.0] * 4)])  # slots only: nothing left
    >>> abs(flat.statistic), flat.p_value
    (0.0, 1.0)
    """
    strata: dict[int, list[tuple[list[float], list[float]]]] = {}
    for r in readings:
        n = len(r.real)
        if n < 4 or len(r.swapped) != n:
            continue
        h = n // 2
        da = [r.real[j] - r.real[j + h] for j in range(h)]
        db = [r.swapped[j] - r.swapped[j + h] for j in range(h)]  # slot j shows passage j + h, and the reverse
        strata.setdefault(n, []).append((da, db))
    cells = []  # per (stratum, slot pair): the values (dA_k, dB_k) of its lists, centred
    for group in strata.values():
        if len(group) < 2:
            continue
        for j in range(len(group[0][0])):
            values = [v for da, db in group for v in (da[j], db[j])]
            m = math.fsum(values) / len(values)
            cells.append([v - m for v in values])
    lists = sum(len(g) for g in strata.values() if len(g) >= 2)
    if not cells:
        return Contrast(0.0, 1.0, 1.0, lists, 0)

    def statistic(cell_values: list[list[float]]) -> float:
        return -math.fsum(c[2 * k] * c[2 * k + 1] for c in cell_values for k in range(len(c) // 2)) + 0.0

    observed = statistic(cells)
    # the ratio, for the reader: within-list half-differences against slot-pair half-sums (centred: the
    # cell's values sum to zero, so the half-sums' mean is zero too)
    n_lists = sum(len(c) // 2 for c in cells)
    half_diff = math.fsum(((c[2 * k] - c[2 * k + 1]) / 2) ** 2 for c in cells for k in range(len(c) // 2)) / n_lists
    half_sum = math.fsum(((c[2 * k] + c[2 * k + 1]) / 2) ** 2 for c in cells for k in range(len(c) // 2)) / (
        n_lists - len(cells))
    ratio = half_diff / half_sum if half_sum > 0 else (math.inf if half_diff > 0 else 1.0)
    rng = random.Random(seed)
    beyond = 0
    shuffled = [list(c) for c in cells]
    for _ in range(permutations):
        for c in shuffled:
            rng.shuffle(c)
        beyond += statistic(shuffled) >= observed - 1e-12 * (1 + abs(observed))
    return Contrast(observed, ratio, (beyond + 1) / (permutations + 1), lists, len(cells))


def implied_order(real: Sequence[float], empty: Sequence[float] | None, alpha: float, form: str = "additive",
                  first_only: bool = False) -> list[int]:
    """The ranking (slots, best first) that calibrated decoding gives when every later step's distributions
    are the first step's restricted to the labels left (renormalised); ``first_only``: the first step's order.

    >>> import math
    >>> p, q = [math.log(x) for x in (0.5, 0.3, 0.2)], [math.log(x) for x in (0.6, 0.2, 0.2)]
    >>> implied_order(p, q, 0.0), implied_order(p, q, 1.0)
    ([0, 1, 2], [1, 2, 0])
    """
    remaining, order = list(range(len(real))), []
    while len(remaining) > 1:
        p = _softmax([real[i] for i in remaining])
        scores = p if empty is None else calibrated(p, _softmax([empty[i] for i in remaining]), alpha, form)
        ranked = order_of_scores(scores)
        if first_only:
            return order + [remaining[j] for j in ranked]
        order.append(remaining.pop(ranked[0]))
    return order + remaining


def choose_alpha(readings: Sequence[Reading], alphas: Sequence[float] = ALPHAS, form: str = "additive",
                 first_only: bool = False) -> tuple[float, dict[float, float]]:
    """The strength whose implied rankings of the given and the swapped reading agree most (mean Kendall
    tau over the lists, passage by passage), and that agreement per strength; ties go to the one nearest 1."""
    usable = [r for r in readings if r.empty is not None and len(r.real) >= 2]
    if not usable:
        return 1.0, {}
    curve = {}
    for alpha in alphas:
        taus = []
        for r in usable:
            perm = halves_swapped(len(r.real))
            given = implied_order(r.real, r.empty, alpha, form, first_only)
            swapped = [perm[j] for j in implied_order(r.swapped, r.empty, alpha, form, first_only)]
            taus.append(kendall_tau(given, swapped))
        curve[float(alpha)] = math.fsum(taus) / len(taus)
    best = max(curve.values())
    return min((a for a, t in curve.items() if t >= best - 1e-12), key=lambda a: (abs(a - 1.0), a)), curve


def _softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]


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


def check_for(checks: dict[Key, ContentCheck], key: Key, saved: str | None = None) -> ContentCheck:
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
        check = checks.setdefault(key, ContentCheck(key, decision))
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
    return check_for(state.content, key, getattr(opts, "decision", None))


def decision_of(state: Any, opts: Any) -> ContentDecision | None:
    """The decision taken (or loaded) for these options on this endpoint state, ``None`` before it is."""
    if state.caps is None:
        return None
    key = decision_key(state.caps.model, opts.template, opts.placeholder, opts.prompt, opts.labels, opts.calibration)
    check = state.content.get(key)
    if check is None and getattr(opts, "decision", None):
        check = check_for(state.content, key, opts.decision)
    return check.decision if check is not None else None
