"""One window's constrained listwise decoding, free of I/O.

:func:`rank_window` decodes a window step by step: at each step the allowed identifiers' probabilities
are read for the real prompt (and, calibrated, for the empty prompt: every passage a placeholder), the
calibrated scores pick the next place, and the prefix grows by it. The rules it applies each live in
their own module: how deep to decode (:mod:`.depth`) and what a deadline leaves (:mod:`.deadline`); the
content rule (:mod:`.rules`) decides before any window is decoded, on the first-step readings of
:func:`check_readings`. Where the endpoint cannot
continue a prefix, ``vanilla`` is the model's own answer parsed (:func:`generated_window`).
``decoding="release"`` builds the prefixes and the identifiers as the CapCal authors' code does
(:func:`_prefix_spellings`, :func:`_label_spellings`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..calibration.formulas import adaptive_alpha, calibrated, entropy, normalise_logprobs, shares
from ..content_check.contrast import Reading
from ..content_check.rules import DEFAULT_RULE, RULES, ContentRule
from ..endpoints import generate, kind_of, tokenize
from ..endpoints.calls import EndpointState, Flow, Token
from ..options import Options
from ..prompts.render import QUERY_PLACEHOLDER, labels, render_prompt
from ..reading.certified import CertifiedScores, certified_labels
from ..reading.labels import LabelScores, label_logprobs
from ..reading.readers import Reader, reader_of
from ..reading.textlabels import generated_label_logprobs, parse_ranking, text_label_logprobs
from ..types import Step
from .deadline import DeadlinePassed
from .depth import below_depth
from .orders import order_of_scores

__all__ = ["Window", "rank_window", "generated_window", "check_readings", "SEPARATOR"]

#: What follows each chosen identifier in the assistant's ranking: ``[3] > [5] > [``.
SEPARATOR = " >"
#: The single tokens the release's decoding is made of.
_RELEASE_SPELLINGS = ("[", "]", ">", *"0123456789")


def _spellings(opts: Options, ids: Sequence[str]) -> list[str]:
    """The strings whose tokens build the prefixes and the identifiers."""
    if opts.decoding == "release":
        return list(_RELEASE_SPELLINGS)
    return [SEPARATOR, *ids, *(" " + i for i in ids)]


def _tokens(state: EndpointState, spellings: Sequence[str]) -> tuple[Token, ...]:
    return tuple(t for s in spellings for t in state.label_tokens[s])


def _prefix_spellings(opts: Options, chosen: Sequence[str]) -> list[str]:
    """The assistant prefix after ``chosen`` identifiers, as spellings whose tokens build it.

    ``exact``: ``[3] > [5] >`` is ``[3]``, `` >``, `` [5]``, `` >`` (the spellings a ranking is generated
    in). ``release``: the release feeds ``[``, then per pick the digits, ``]``, ``>``, ``[``, and scores
    after one more ``[`` (``[3]>[5]>[[``)."""
    if opts.decoding == "release":
        return ["[", *(x for label in chosen for x in (*label[1:-1], "]", ">", "[")), "["]
    return [x for k, label in enumerate(chosen) for x in ((" " if k else "") + label, SEPARATOR)]


def _label_spellings(opts: Options, label: str, first: bool) -> list[str]:
    """What is scored for ``label`` after the prefix: `` [12]`` (``[12]`` first); for the release, its
    digits, and ``]`` only below 10 (``3]``, ``12``)."""
    if opts.decoding == "release":
        digits = label[1:-1]
        return [*digits, *("]" if len(digits) == 1 else ())]
    return [("" if first else " ") + label]


def _by_token_ids(state: EndpointState, opts: Options, streams: Sequence[Any], allowed: Sequence[str],
                  chosen: Sequence[str], best_only: bool = False) -> Flow[list[LabelScores]]:
    first = not chosen
    prefix = _tokens(state, _prefix_spellings(opts, chosen))
    paths = [_tokens(state, _label_spellings(opts, label, first)) for label in allowed]
    return label_logprobs(state, [(m, prefix) for m in streams], paths, form=opts.probability, top=opts.top_logprobs,
                          shared=not opts.normalise, render=opts.prompt, best_only=best_only)


def _certified(state: EndpointState, opts: Options, streams: Sequence[Any], allowed: Sequence[str],
               chosen: Sequence[str]) -> Flow[CertifiedScores]:
    """CapCal's middle step from the nodes its choice needs (:mod:`..reading.certified`), the additive form."""
    prefix = _tokens(state, _prefix_spellings(opts, chosen))
    paths = [_tokens(state, _label_spellings(opts, label, not chosen)) for label in allowed]
    alpha = None if opts.alpha == "adaptive" else 1.0 if opts.alpha == "auto" else float(opts.alpha)
    return certified_labels(state, (streams[0], streams[1]), prefix, paths, alpha=alpha, normalise_shares=opts.normalise,
                            top=opts.top_logprobs, shared=not opts.normalise, render=opts.prompt)


def _by_token_texts(state: EndpointState, opts: Options, streams: Sequence[Any], allowed: Sequence[str],
                    chosen: Sequence[str]) -> Flow[list[LabelScores]]:
    """What each stream's reads continue, as the endpoint kind renders it; then the prefix."""
    first = not chosen
    texts = ["".join(_label_spellings(opts, label, first)) for label in allowed]
    contexts = [kind_of(state.caps).text_context(state, m, opts.prompt) for m in streams]
    return text_label_logprobs(state, contexts, texts, prefix="".join(_prefix_spellings(opts, chosen)),
                               form=opts.probability, top=opts.top_logprobs, shared=not opts.normalise)


def _from_answer(state: EndpointState, opts: Options, streams: Sequence[Any], allowed: Sequence[str],
                 chosen: Sequence[str]) -> Flow[list[LabelScores]]:
    return generated_label_logprobs(state, streams, allowed, top=opts.top_logprobs)


#: How each route's reader reads each allowed label's log-probability after the ``chosen`` ones, for each stream's
#: messages (the one table; readers.READERS says what each can do): by the served model's tokens after the prefix,
#: by token strings after a text prompt, or from the model's answer (first step only). Each returns the reading
#: module's flow itself (a plain function, not a generator: no frame of its own between the decoding and the reading).
_READ = {"prefix": _by_token_ids, "text": _by_token_texts, "generation": _from_answer}


@dataclass(frozen=True)
class Window:
    order: list[int]  # positions within the window, best first
    confidence: list[float]  # per position: calibrated share when chosen (0..1)
    steps: list[Step]
    prior: tuple[float, ...] | None
    upper_bounds: int
    notes: tuple[str, ...] = ()
    decoded: int | None = None  # leading places decided (None: all); below: .depth's order, or the deadline's
    partial: bool = False  # the deadline passed: places from `decoded` on are as given


def _learn_label_tokens(state: EndpointState, opts: Options, reader: Reader, ids: Sequence[str]) -> Flow[None]:
    """The served model's tokens of every spelling the prefixes and identifiers are built from (once)."""
    spellings = [s for s in _spellings(opts, ids) if s not in state.label_tokens] if reader.token_ids else []
    if spellings:
        text = kind_of(state.caps).prefix_as_text  # its tokens' pieces as text, where the prefix goes as text
        for spelling, tokens in zip(spellings, (yield from tokenize(state.caps, spellings, text=text))):
            state.label_tokens[spelling] = tuple(tokens)


def check_readings(state: EndpointState, opts: Options, query: str, texts: list[str],
                   rule: ContentRule = RULES[DEFAULT_RULE]) -> Flow[Reading]:
    """A content rule's readings of one list (:mod:`.rules`): the first step's label log-probabilities in each
    of the rule's ``orders`` (the four of :func:`~.contrast.reading_orders`; the query rule's six for short lists), with
    ``query_free`` each read again with the query replaced by :data:`~.prompts.QUERY_PLACEHOLDER`, and the empty
    prompt's, in one round of requests."""
    n = len(texts)
    ids = labels(n, opts.labels)
    reader = reader_of(state.caps, opts.prompt)
    yield from _learn_label_tokens(state, opts, reader, ids)
    asked = (query, QUERY_PLACEHOLDER) if rule.query_free else (query,)
    streams = [render_prompt(opts.template, q, [texts[i] for i in order], ids) for q in asked for order in rule.orders(n)]
    streams.append(render_prompt(opts.template, query, [opts.placeholder] * n, ids))
    scored = yield from _READ[reader.route](state, opts, streams, ids, [])
    return Reading(tuple(tuple(x.logprobs) for x in scored[:-1]), tuple(scored[-1].logprobs))


def rank_window(state: EndpointState, opts: Options, query: str, texts: list[str], first_only: bool,
                 depth: int | None = None) -> Flow[Window]:
    """Decode one window. ``opts.alpha`` is resolved by the caller (``"auto"``: 1, where no decision gave one)."""
    n = len(texts)
    ids = labels(n, opts.labels)
    real = render_prompt(opts.template, query, texts, ids)
    empty = render_prompt(opts.template, query, [opts.placeholder] * n, ids) if opts.calibrated else None
    reader = reader_of(state.caps, opts.prompt)
    if not reader.steps and not first_only:
        return (yield from generated_window(state, real, ids, depth))
    yield from _learn_label_tokens(state, opts, reader, ids)
    remaining, chosen_labels = list(range(n)), []
    order, confidence, steps, prior, bounds = [], [0.0] * n, [], None, 0
    while len(remaining) > 1 and (depth is None or len(order) < depth):
        streams = [real] + ([empty] if empty else [])
        # a middle step needs only the choice certain (vanilla: the best label exact, labels.label_logprobs'
        # best_only; capcal's additive form: the choice certified by bounds, reading.certified), where each node
        # prompt costs compute of its own (Kind.costly_prompts): not the first step (read whole for the records:
        # the eval's first step, the prior), nor the last before the depth (the order below it) or of the list
        # (then every passage's p in details() is exact)
        lazy = (reader.route == "prefix" and opts.probability == "joint" and bool(order)
                and (empty is None or opts.calibration == "additive")
                and kind_of(state.caps).costly_prompts and len(remaining) > 2 and (depth is None or len(order) + 1 < depth))
        certain = None  # the certified choice of a lazy capcal step
        try:
            allowed = [ids[i] for i in remaining]
            if lazy and empty is not None:
                read = yield from _certified(state, opts, streams, allowed, chosen_labels)
                scored, certain = [read.real, read.empty], read.chosen
            else:
                scored = yield from (_by_token_ids(state, opts, streams, allowed, chosen_labels, best_only=True) if lazy
                                     else _READ[reader.route](state, opts, streams, allowed, chosen_labels))
        except DeadlinePassed:  # what is decided so far (.deadline)
            return Window(order + remaining, confidence, steps, prior, bounds, decoded=len(order), partial=True)
        # renormalised over the labels: entropy, the adaptive rate and the prior always use these
        shares_of = [normalise_logprobs(x.logprobs) for x in scored]
        calibrate_on = shares_of if opts.normalise else [_raw(x.logprobs) for x in scored]
        shares_p, p = shares_of[0], calibrate_on[0]
        q = calibrate_on[1] if empty else None
        alpha, s = 0.0, p
        if q is not None:
            alpha = adaptive_alpha(shares_p) if opts.alpha == "adaptive" else 1.0 if opts.alpha == "auto" else float(opts.alpha)
            s = calibrated(p, q, alpha, opts.calibration)
            prior = prior or tuple(shares_of[1])
        bounds += sum(x.upper_bounds for x in scored)
        share = shares(s)
        ranked = order_of_scores(s)
        best = ranked[0] if certain is None else certain  # certified: the same at every point of the bounds' box
        steps.append(Step(tuple(remaining), tuple(p), q and tuple(q), tuple(s), alpha, entropy(shares_p), remaining[best],
                          upper_bounds=bounds, pruned=scored[0].pruned))
        if first_only:
            return Window([remaining[j] for j in ranked], share, steps, prior, bounds)
        confidence[remaining[best]] = share[best]
        order.append(remaining[best])
        below = below_depth(remaining, s, remaining[best])  # the order below the depth, if decoding stops here
        chosen_labels.append(ids[remaining.pop(best)])
    if len(remaining) == 1:
        confidence[remaining[0]] = 1.0
    order += below if len(remaining) > 1 else remaining
    return Window(order, confidence, steps, prior, bounds)


def generated_window(state: EndpointState, messages: Any, ids: Sequence[str], depth: int | None = None
                      ) -> Flow[Window]:
    """``vanilla`` where no prefix can be continued: the model's own answer, parsed; with a ``depth``, an
    answer long enough for that many identifiers. Identifiers it does not name are not decided places."""
    wanted = len(ids) if depth is None else min(depth, len(ids))
    [answer] = yield from generate(state, [messages], max_tokens=6 * wanted + 16, top=1)
    order, missing = parse_ranking("".join(token for token, _ in answer), ids)
    named = len(ids) - missing
    notes = (f"the model's answer left out {missing} of {len(ids)} identifiers; they follow in their given order",
             ) if named < wanted else ()
    return Window(order, [0.0] * len(ids), [], None, 0, notes=notes, decoded=named if missing else None)


def _raw(logprobs: Sequence[float]) -> list[float]:
    """Raw joint label probabilities (``normalise=False``), not renormalised over the labels."""
    return [math.exp(x) for x in logprobs]
