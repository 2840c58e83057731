"""A content decision and what it is about: the decision's key (the served model, a fingerprint of its weights and
every option that changes the readings) and :class:`ContentDecision`, the record a check, judged queries or a
saved file produce (:mod:`.content_check` takes them; :mod:`.saved_decisions` keeps them, under the key's
:func:`key_id` and only where :func:`kept` says so). Pure: no I/O but reading a decision's JSON text or a file
holding it (:func:`load_decision`)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InputError
from ..prompts.files import option_text
from .evidence import LEVEL
from .rules import RULES
from .typed_json import fields_of

__all__ = ["KEY_OPTIONS", "Key", "decision_key", "key_id", "kept", "ContentDecision", "load_decision"]

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


def kept(key: Key) -> bool:
    """Whether decisions of ``key`` are kept: where the server reports its weights (a fingerprint in the key:
    llama.cpp, vLLM, SGLang). A served name alone (hosted APIs, Ollama) does not tell a restart that the model is
    the same one: pass ``decision=`` there.

    >>> kept((("model", "m"), ("weights", "sha256:1"))), kept((("model", "gpt"), ("weights", "")))
    (True, False)
    """
    return bool(dict(key).get("weights"))


def key_id(key: Key) -> str:
    """A key's file name (without ``.json``): 16 hex digits of its SHA-256.

    >>> len(key_id((("model", "m"), ("weights", "")))), key_id((("model", "m"),)) == key_id((("model", "n"),))
    (16, False)
    """
    return hashlib.sha256(json.dumps([list(p) for p in key]).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ContentDecision:
    """The content check's decision for one key. Inspect it, print it (one line), save it (:meth:`to_json`)
    and hand it to another process (the ``decision`` option: the JSON or a file holding it), which then
    ranks without deciding again. ``verdict``: ``"reads"``, ``"does not read"``, ``"cannot tell"`` (a consistent
    preference the label-free check cannot tell from reading: treated as not reading until judged queries decide) or
    ``"undecided"`` (no decision within the cap: treated as not reading); ``e_value``: the evidence against "no content"
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
    e_aligned: float = 1.0  # the evidence that it goes the first stage's way ("reads" needs evidence.ALIGN_E)
    e_taste: float = 1.0  # the evidence that its with-query preferences are consistent ("cannot tell" needs TASTE_E)
    judged: int = 0  # decided from this many judged queries (CapCalReranker.decide; :mod:`.judged`), 0: label-free
    gain: float = 0.0  # judged: the mean nDCG@10 gain of calibrating over the given order
    gain_low: float = 0.0  # judged: the lower end of its 95 % confidence sequence (> 0: calibrate)
    gain_high: float = 0.0  # judged: its upper end
    uncalibrated_gain: float = 0.0  # judged: the uncalibrated method's mean nDCG@10 gain over the given order
    # judged, the pooled record (absent from decisions saved before it was kept: then nothing is pooled with them)
    judged_ids: tuple[str, ...] = ()  # the judged queries' identities in the order pooled (judged.judged_identity)
    judged_scores: tuple[tuple[float, float, float], ...] = ()  # theirs: nDCG@10 calibrated, given, uncalibrated
    crossed: int = 0  # the e-process against "no gain" reached 40 after this many judged queries (0: not yet)
    saved: bool = field(default=False, compare=False)  # loaded from a saved decision

    def __str__(self) -> str:
        about = ", ".join(f"{k} {v!r}" for k, v in self.key if k in ("model", "weights", "template", "prompt"))
        if self.judged:
            return (f"decision from {self.judged} judged queries{' (saved)' if self.saved else ''} for {about}: "
                    f"{self.labels_note()}")
        evidence = (f"e = {self.e_value:.3g}, p <= {self.p_value:.3g}, mean agreement {self.score:.2f}, "
                    f"alignment {self.aligned:+.2f} (e = {self.e_aligned:.3g})")
        if self.reads:
            verdict = (f"the model reads the passages ({evidence}); alpha {self.alpha:g} (first-token "
                       f"{self.alpha_first_token:g}) chosen label-free")
        elif self.verdict == "cannot tell":  # a taste the label-free check cannot tell from reading
            verdict = (f"cannot tell whether the model reads the passages ({evidence}, with-query taste e = "
                       f"{self.e_taste:.3g}): it prefers some passages consistently with the query, but what the query "
                       "adds copies its preferences without the query (a taste of its own, or relevance that shows "
                       "without the query) or does not go the first stage's way; only judged queries can tell: lists "
                       "keep their given order until they decide")
        elif self.verdict == "undecided":  # stopped at the cap: neither side reached its threshold
            verdict = (f"undecided at the cap ({evidence}), so treated as not reading: lists keep their given order; "
                       "a larger check_lists reads on")
        else:
            verdict = f"no content signal that follows the first stage ({evidence}): lists keep their given order"
        return f"content check on {self.lists} queries{' (saved)' if self.saved else ''} for {about}: {verdict}"

    def labels_note(self) -> str:
        """What a decision from judged queries found, in one clause (the interval: :mod:`.judged`'s confidence
        sequence, valid at any number of judged queries)."""
        if self.reads:
            verdict = f"calibrated at alpha {self.alpha:g}"
        else:
            verdict = ("kept in its given order (calibrating has not beaten it yet; more judged queries pool into the "
                       "same test; guard=None calibrates anyway)")
        if self.judged_scores:
            test = (f"95 % anytime interval {self.gain_low:+.3f} to {self.gain_high:+.3f}, e = {self.e_value:.3g}"
                    + (f", crossed 40 at query {self.crossed}" if self.crossed else ""))
        else:  # saved before the record was kept: a fixed-n t interval
            test = f"95 % t interval {self.gain_low:+.3f} to {self.gain_high:+.3f}, saved without its queries"
        return (f"calibrating gains {self.gain:+.3f} nDCG@10 over the given order ({test}; uncalibrated "
                f"{self.uncalibrated_gain:+.3f}): {verdict}")

    def to_json(self) -> str:
        values = asdict(self)
        values.pop("saved")
        values["key"], values["curve"] = dict(self.key), [list(x) for x in self.curve]
        return json.dumps({"capcal_content_decision": 2, **values})

    @classmethod
    def from_json(cls, text: str) -> ContentDecision:
        """A decision from its JSON, every field checked against its type (:mod:`.typed_json`): data from disk."""
        what = "cannot read the saved content decision"
        try:
            values = json.loads(text)
        except RecursionError:
            raise InputError(f"{what}: nested too deeply to be a decision") from None
        except ValueError as err:
            raise InputError(f"{what}: not JSON ({err}); pass the JSON of ContentDecision.to_json() or a file "
                             "holding it") from None
        if not isinstance(values, dict):
            raise InputError(f"{what}: expected a JSON object, got {type(values).__name__}")
        version = values.pop("capcal_content_decision", None)
        if version != 2:
            raise InputError(f"{what}: not a capcal content decision of this version ('capcal_content_decision': 2"
                             f"{'; version 1 decisions came from the older check: decide again' if version == 1 else ''})"
                             "; pass the JSON of ContentDecision.to_json() or a file holding it")
        if isinstance(values.get("key"), dict):
            values["key"] = list(values["key"].items())
        fields = fields_of(cls, values, what, skip=("saved",))
        problem = out_of_range(fields)
        if problem:
            raise InputError(f"{what}: {problem}")
        return cls(**fields, saved=True)


#: The verdicts a decision may hold.
VERDICTS = ("reads", "does not read", "undecided")


def out_of_range(values: dict[str, Any]) -> str:
    """Why a decision's typed fields (:func:`~.typed_json.fields_of`'s) cannot be a decision this library took
    (``""`` if they can): ``alpha`` and ``alpha_first_token`` finite and >= 0 (the bounds of the ``alpha`` option,
    :class:`~.options.Options`), the curve's points finite, probabilities in [0, 1], evidence >= 0, a verdict this
    library says, agreeing with ``reads``. An ``"alpha": Infinity`` in a file would otherwise fail every ranking
    naming an option the user never set.

    >>> out_of_range({"alpha": float("inf")})
    "'alpha' must be a finite number >= 0 (the alpha option's bounds), got inf"
    >>> bool(out_of_range({"alpha": -50.0})), out_of_range({"alpha": 1.0, "reads": True, "verdict": "reads"})
    (True, '')
    """
    for name in ("alpha", "alpha_first_token"):
        x = values.get(name, 0.0)
        if not (math.isfinite(x) and x >= 0):
            return f"{name!r} must be a finite number >= 0 (the alpha option's bounds), got {x!r}"
    for a, tau in values.get("curve", ()):
        if not (math.isfinite(a) and a >= 0 and math.isfinite(tau)):
            return f"'curve' must hold finite (alpha >= 0, tau) pairs, got {(a, tau)!r}"
    for name in ("p_value", "level"):
        if not 0 <= values.get(name, 0.5) <= 1:
            return f"{name!r} must be within [0, 1], got {values[name]!r}"
    for name in ("e_value", "e_aligned"):
        if not values.get(name, 1.0) >= 0:
            return f"{name!r} must be >= 0, got {values[name]!r}"
    for name in ("score", "aligned", "gain", "gain_low", "gain_high", "uncalibrated_gain"):
        if not math.isfinite(values.get(name, 0.0)):
            return f"{name!r} must be finite, got {values[name]!r}"
    verdict = values.get("verdict", "reads" if values.get("reads", True) else "does not read")
    if verdict not in VERDICTS or (verdict == "reads") != values.get("reads", verdict == "reads"):
        return f"'verdict' must be one of {', '.join(VERDICTS)} and agree with 'reads', got {verdict!r}"
    return ""


def load_decision(raw: str) -> ContentDecision:
    """A saved decision from its JSON text or from a file holding it (read afresh at every call)."""
    return ContentDecision.from_json(option_text(raw, "the saved content decision"))
