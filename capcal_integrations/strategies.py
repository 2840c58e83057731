"""Ranking strategies, written once and free of I/O.

:func:`rerank_flow` is the whole of one reranking as a :data:`~.protocol.Flow`: it checks the input,
answers a list of at most one passage without the endpoint, probes the endpoint on first use, fits
the passages to its context, and runs the method. :mod:`.drivers` runs it with a sync or an async
client. Methods:

* ``vanilla``: constrained listwise decoding, no calibration;
* ``capcal``: the same decoding, each step's distribution calibrated against the empty prompt's;
* ``first-token`` / ``first-token-capcal``: everything ranked from the first step's distribution;
* ``psc``: permutation self-consistency, ``m`` shuffled vanilla rankings aggregated by Borda count;
* ``auto``: ``capcal`` where the endpoint can continue an assistant prefix, else ``first-token-capcal``.

Where the endpoint cannot continue a prefix (:func:`~.probe.route` ``"generation"``: hosted chat APIs),
the first-token methods read the first identifier of the model's own answer (:mod:`.textlabels`),
``vanilla`` is the model's answer parsed (identifiers it left out appended in their given order) and
``psc`` aggregates ``m`` such answers; ``capcal`` needs the prefix.

Lists longer than ``window`` are ranked by a back-to-front sliding window (:func:`~.orders.windows`).

Whether the calibrated methods calibrate at all is the content check's (``Options.guard="content"``,
:mod:`.content_check`): decided once per model, prompt and placeholder from the first lists, each read a
second time at its first step with its halves swapped; a model that shows no content signal keeps every
list's given order. ``guard=<z>`` is the older per-list check (one more prompt per window, rotated by half,
:func:`~.calibration.content_agreement`). ``decoding="release"`` builds the prefixes and the
identifiers as the CapCal authors' code does (:func:`_prefix`, :func:`_label_path`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from .calibration import adaptive_alpha, calibrated, content_agreement, entropy, normalise_logprobs, shares
from .content_check import Reading, check_of, halves_swapped
from .deadline import DeadlinePassed, deadline_note, finish, partial_order, within
from .depth import below_depth, borda_decoded, decoded_places, depth_note, window_depths
from .errors import CapabilityError, InputError
from .fitting import cleaned, fit
from .labels import LabelScores, label_logprobs
from .options import Options
from .orders import order_of_scores, rank_scores, windows
from .probe import capabilities, route
from .prompts import labels, prompt_text, render_prompt
from .protocol import EndpointState, Flow, Token, generate, text_messages, tokenize
from .textlabels import generated_label_logprobs, parse_ranking, text_label_logprobs
from .types import Capabilities, Document, Ranking, Step, as_document

__all__ = ["rerank_flow", "parallel", "validated"]

log = logging.getLogger("capcal_integrations")


def validated(query: Any, passages: Any) -> tuple[str, list[Document]]:
    """The stripped query and the passages as :class:`~.types.Document` s, or an :class:`~.errors.InputError`
    naming the argument. ``passages`` is an ordered collection (a list, a tuple, a generator), not a
    string (it would be ranked letter by letter), bytes, a mapping or a set (no order for the ranking's
    indices to refer to)."""
    if not isinstance(query, str) or not query.strip():
        raise InputError(f"query must be a non-empty string, got {type(query).__name__ if query else repr(query)}")
    if isinstance(passages, (str, bytes, bytearray, Mapping, AbstractSet)) or not isinstance(passages, Iterable):
        hint = "; a string would be ranked letter by letter: pass [text]" if isinstance(passages, str) else ""
        raise InputError("passages must be a list of passages (str, Document, or dicts with 'text'), got "
                         f"{type(passages).__name__}{hint}")
    docs = []
    for i, passage in enumerate(passages):
        try:
            docs.append(as_document(passage))
        except TypeError as err:
            raise InputError(f"passages[{i}]: {err}") from err
    return query.strip(), docs


def rerank_flow(state: EndpointState, opts: Options, query: Any, passages: Sequence[Any]) -> Flow[Ranking]:
    """Rank ``passages`` for ``query``. The input is checked before any request is made."""
    query, docs = validated(query, passages)
    n = len(docs)
    if n <= 1:
        return Ranking(tuple(range(n)), (1.0,) * n, opts.method)
    return (yield from within(_ranked(state, opts, query, docs), n, opts.method, opts.deadline))


def _ranked(state: EndpointState, opts: Options, query: str, docs: list[Document]) -> Flow[Ranking]:
    n = len(docs)
    caps = yield from capabilities(state)
    opts = _resolve(state, caps, opts)
    query = cleaned(opts, query)  # untrusted too: no identifier look-alikes (and sent as text only where it must)
    texts, notes = yield from fit(state, opts, query, docs)
    if opts.method != "psc":
        ranking = yield from _sliding(state, opts, query, texts)
        how = "their given order" if route(caps, opts.prompt) == "generation" else "the last decoded step's scores"
        return dataclasses.replace(ranking, notes=(*notes, *ranking.notes, *_cut_note(ranking, opts, how)))
    rng = random.Random(opts.seed)
    shuffles = [rng.sample(range(n), n) for _ in range(opts.m)]
    vanilla = opts.replace(method="vanilla")
    runs = yield from parallel([_sliding(state, vanilla, query, [texts[i] for i in s]) for s in shuffles])
    order = borda_decoded([[s[i] for i in run.order] for s, run in zip(shuffles, runs)], [r.decoded for r in runs], n)
    notes += [f"shuffle {k}: {note}" for k, run in enumerate(runs) for note in run.notes]
    decoded, partial = decoded_places(n, opts.depth), any(run.partial for run in runs)
    if partial:  # the deadline: the places every shuffle had decided are aggregated, the rest in first-stage order
        decoded = min(n if run.decoded is None else run.decoded for run in runs)
        order = partial_order(n, order[:decoded])
    # steps are left out: each run's steps index its own shuffled list
    ranking = Ranking(tuple(order), rank_scores(order, [1.0] * n), "psc", upper_bounds=sum(run.upper_bounds for run in runs),
                      notes=tuple(notes), decoded=decoded, partial=partial)
    how = "their Borda points over the shuffles' decoded places"
    return dataclasses.replace(ranking, notes=(*ranking.notes, *_cut_note(ranking, opts, how)))


def _cut_note(ranking: Ranking, opts: Options, how: str) -> tuple[str, ...]:
    """The note of a ranking whose lower places were not decided: cut by the deadline, or below the depth."""
    n = len(ranking.order)
    if ranking.partial:
        return (deadline_note(opts.deadline, ranking.decoded or 0, n),)
    if ranking.decoded is not None and ranking.decoded == decoded_places(n, opts.depth):
        return (depth_note(n, ranking.decoded, how),)
    return ()


def _resolve(state: EndpointState, caps: Capabilities, opts: Options) -> Options:
    """The options with ``auto`` resolved for this endpoint. A method that cannot run there is a
    :class:`~.errors.CapabilityError` naming those that can: ``capcal`` without a prefix to continue
    (``first-token-capcal``), any probability-reading method without log-probabilities (``vanilla``,
    ``psc``: the answers alone)."""
    way = route(caps, opts.prompt)
    if way == "generation" and not caps.logprobs and opts.method not in ("vanilla", "psc"):
        raise CapabilityError(
            f"method={opts.method!r} reads identifier probabilities, and this endpoint's chat completions return no "
            "log-probabilities (logprobs/top_logprobs); method='vanilla' or 'psc' rank from its answers alone, "
            "without calibration", missing="logprobs", alternatives=("vanilla", "psc"))
    if opts.method == "auto":
        method = "capcal" if way != "generation" else "first-token-capcal"
        if ("auto", way) not in state.announced:
            state.announced.add(("auto", way))
            why = ("it continues an assistant prefix" if way == "prefix" else
                   f"its /v1/completions continues a prompt rendered here ({opts.prompt})" if way == "text" else
                   "it cannot continue an assistant prefix, so the first identifier of the model's answer is read")
            log.info("capcal: method auto runs %s on %s: %s", method, caps.model, why)
        return opts.replace(method=method)
    if opts.method == "capcal" and way == "generation":
        raise CapabilityError(
            "method='capcal' decodes step by step after an assistant prefix, which this endpoint cannot continue "
            "(no assistant prefill and no text /v1/completions); method='first-token-capcal' reads the calibrated "
            "first step from the model's answer instead (two requests per list), and method='auto' picks it",
            missing="assistant prefill", alternatives=("first-token-capcal", "auto"))
    return opts


def parallel(flows: Sequence[Flow]) -> Flow[list]:
    """Run several flows in lockstep, merging each round's calls into one batch (so the async
    driver sends them concurrently). Returns their results in order."""
    pending = {}
    results: list = [None] * len(flows)
    for i, flow in enumerate(flows):
        try:
            pending[i] = (flow, next(flow))
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        batch = [call for _, calls in pending.values() for call in calls]
        try:
            answers = yield batch
        except DeadlinePassed as passed:  # each flow returns what it has decided (.deadline)
            for i, (flow, _) in pending.items():
                results[i] = finish(flow, passed)
            return results
        except BaseException:
            for flow, _ in pending.values():
                flow.close()
            raise
        offset, advanced = 0, {}
        for i, (flow, calls) in pending.items():
            part = answers[offset:offset + len(calls)]
            offset += len(calls)
            try:
                advanced[i] = (flow, flow.send(part))
            except StopIteration as stop:
                results[i] = stop.value
        pending = advanced
    return results


def _sliding(state: EndpointState, opts: Options, query: str, texts: list[str]) -> Flow[Ranking]:
    n = len(texts)
    first_only = opts.method.startswith("first-token")
    order, confidence = list(range(n)), [0.0] * n
    steps: list[Step] = []
    prior, bounds, agreement, guarded, checked, notes = None, 0, [], [], [], []
    depths = window_depths(n, opts.window, opts.stride, None if first_only else opts.depth)  # see .depth
    decoded, partial = None if first_only else decoded_places(n, opts.depth), False
    for w, (start, end) in enumerate(windows(n, opts.window, opts.stride)):
        members = order[start:end]
        result = yield from _rank_window(state, opts, query, [texts[i] for i in members], first_only, depths[w])
        notes += [f"window {w}: {note}" for note in result.notes]
        if result.agreement is not None:
            agreement.append(result.agreement)
        if result.guarded:
            guarded.append(w)
        if result.checked:
            checked.append(w)
        if result.guarded and result.agreement is not None:  # the per-list guard (the content check notes its own)
            notes.append(f"window {w} kept in its given order: the calibrated first-step scores of the given and "
                         f"the rotated list agree at z = {result.agreement:.2f} < guard {opts.guard} (no content signal)")
            log.info("capcal: %s", notes[-1])
        order[start:end] = [members[j] for j in result.order]
        for j, c in enumerate(result.confidence):
            confidence[members[j]] = c
        steps += [Step(tuple(members[c] for c in s.candidates), s.p, s.q, s.scores, s.alpha, s.entropy,
                       members[s.chosen], w, s.upper_bounds) for s in result.steps]
        prior = prior or result.prior
        bounds += result.upper_bounds
        if result.partial:  # the deadline passed in this window: the top places it decided, the rest as given
            decided = order[:result.decoded] if start == 0 else []
            order, decoded, partial = partial_order(n, decided), len(decided), True
            break
        if start == 0 and result.decoded is not None:  # a generated answer that left identifiers out
            decoded = min(result.decoded, n if decoded is None else decoded)
        if start == 0 and result.guarded:  # the top window kept its given order (marked kept_given_order), not cut
            decoded = None
    for i in order[n if decoded is None else decoded:]:
        confidence[i] = 0.0  # not decided
    if bounds and route(state.caps, opts.prompt) == "generation":
        notes.append(f"{bounds} identifier probabilities are estimates (counted in upper_bounds): the model's answer "
                     "did not pass through a token they share, or they were outside its top log-probabilities (a "
                     "tokenizer that splits numbers into digits shares '1' among [1] and [10]..[19]); window=9 "
                     "reads every identifier exactly on this endpoint")
    scores = rank_scores(order, confidence)
    if first_only and n <= opts.window and not guarded and not partial:
        by_input = [0.0] * n
        for i, v in zip(steps[0].candidates, steps[0].scores):
            by_input[i] = v
        scores = tuple(by_input)
    return Ranking(tuple(order), scores, opts.method, prior, tuple(steps), upper_bounds=bounds, notes=tuple(notes),
                   agreement=tuple(agreement), guarded=tuple(guarded), decoded=decoded, partial=partial,
                   checked=tuple(checked))


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


def _label_scores(state: EndpointState, opts: Options, way: str, streams: Sequence[Any], allowed: Sequence[str],
                  chosen: Sequence[str]) -> Flow[list[LabelScores]]:
    """Each allowed label's log-probability after the ``chosen`` ones, for each stream's messages, read
    the endpoint's way (:func:`~.probe.route`): by the served model's tokens after the prefix, by token
    strings after a text prompt, or from the model's answer (first step only)."""
    first = not chosen
    if way == "prefix":
        prefix = _tokens(state, _prefix_spellings(opts, chosen))
        paths = [_tokens(state, _label_spellings(opts, label, first)) for label in allowed]
        return (yield from label_logprobs(state, [(m, prefix) for m in streams], paths, form=opts.probability,
                                          top=opts.top_logprobs, shared=not opts.normalise, render=opts.prompt))
    if way == "text":
        prefix = "".join(_prefix_spellings(opts, chosen))
        texts = ["".join(_label_spellings(opts, label, first)) for label in allowed]
        prompts = [prompt_text(text_messages(state, m, opts.prompt), opts.prompt) + prefix for m in streams]
        return (yield from text_label_logprobs(state, prompts, texts,
                                               form=opts.probability, top=opts.top_logprobs, shared=not opts.normalise))
    return (yield from generated_label_logprobs(state, streams, allowed, top=opts.top_logprobs))


@dataclass(frozen=True)
class _Window:
    order: list[int]  # positions within the window, best first
    confidence: list[float]  # per position: calibrated share when chosen (0..1)
    steps: list[Step]
    prior: tuple[float, ...] | None
    upper_bounds: int
    agreement: float | None = None  # the guard's z-score, when it ran
    guarded: bool = False  # kept in the given order: no content signal
    notes: tuple[str, ...] = ()
    decoded: int | None = None  # leading places decided (None: all); below: .depth's order, or the deadline's
    partial: bool = False  # the deadline passed: places from `decoded` on are as given
    checked: bool = False  # read a second time, halves swapped, for the content check (one more prompt)


def _rank_window(state: EndpointState, opts: Options, query: str, texts: list[str], first_only: bool,
                 depth: int | None = None) -> Flow[_Window]:
    n = len(texts)
    ids = labels(n, opts.labels)
    real = render_prompt(opts.template, query, texts, ids)
    empty = render_prompt(opts.template, query, [opts.placeholder] * n, ids) if opts.calibrated else None
    check = check_of(state, opts) if empty else None  # the content check (guard="content")
    verdict = check.verdict(first_only) if check else None  # final once decided
    if verdict is not None and not verdict.reads:
        return _Window(list(range(n)), [0.0] * n, [], None, 0, guarded=True, notes=(verdict.note,))
    per_list = bool(empty) and opts.guard not in (None, "content") and n >= 4  # the older per-list guard
    pool = bool(check) and not verdict and n >= 4  # a list that helps decide
    half = n // 2  # the second reading: rotated by half (per-list guard), or halves swapped (content check)
    second = texts[half:] + texts[:half] if per_list else [texts[i] for i in halves_swapped(n)] if pool else None
    rotated = render_prompt(opts.template, query, second, ids) if second else None
    notes = [verdict.note] if verdict else []
    way = route(state.caps, opts.prompt)
    if way == "generation" and not first_only:
        return (yield from _generated_window(state, real, ids, depth))
    spellings = [s for s in _spellings(opts, ids) if s not in state.label_tokens] if way == "prefix" else []
    if spellings:
        text = state.caps.transport == "chat"  # only the chat transport sends the prefix as text
        for spelling, tokens in zip(spellings, (yield from tokenize(state.caps, spellings, text=text))):
            state.label_tokens[spelling] = tuple(tokens)
    remaining, chosen_labels = list(range(n)), []
    order, confidence, steps, prior, bounds, agreement = [], [0.0] * n, [], None, 0, None
    while len(remaining) > 1 and (depth is None or len(order) < depth):
        streams = [real] + ([empty] if empty else []) + ([rotated] if rotated and not steps else [])
        try:
            scored = yield from _label_scores(state, opts, way, streams, [ids[i] for i in remaining], chosen_labels)
        except DeadlinePassed:  # what is decided so far (.deadline)
            return _Window(order + remaining, confidence, steps, prior, bounds, agreement, notes=tuple(notes),
                           decoded=len(order), partial=True, checked=pool and bool(steps))
        if pool and not steps:  # pool this list's two readings; provisional until enough lists
            verdict = check.add(Reading(scored[0].logprobs, scored[2].logprobs, scored[1].logprobs), opts.calibration,
                                first_only)
            notes.append(verdict.note)
        # renormalised over the labels: entropy, the adaptive rate, the prior and the guard always use these
        shares_of = [normalise_logprobs(x.logprobs) for x in scored]
        calibrate_on = shares_of if opts.normalise else [_raw(x.logprobs) for x in scored]
        shares_p, p = shares_of[0], calibrate_on[0]
        q = calibrate_on[1] if empty else None
        alpha, s = 0.0, p
        if q is not None:
            alpha = (adaptive_alpha(shares_p) if opts.alpha == "adaptive" else float(opts.alpha) if opts.alpha != "auto"
                     else verdict.alpha if verdict and verdict.alpha is not None else 1.0)
            s = calibrated(p, q, alpha, opts.calibration)
            prior = prior or tuple(shares_of[1])
        bounds += sum(x.upper_bounds for x in scored)
        share = shares(s)
        ranked = order_of_scores(s)
        best = ranked[0]
        steps.append(Step(tuple(remaining), tuple(p), q and tuple(q), tuple(s), alpha, entropy(shares_p), remaining[best],
                          upper_bounds=bounds))
        if per_list and len(steps) == 1:
            agreement = content_agreement(shares_p, shares_of[2], prior, half)
            if agreement < opts.guard:
                return _Window(list(range(n)), [0.0] * n, steps, prior, bounds, agreement, guarded=True)
        if verdict and not verdict.reads:
            return _Window(list(range(n)), [0.0] * n, steps, prior, bounds, guarded=True, notes=tuple(notes),
                           checked=pool)
        if first_only:
            return _Window([remaining[j] for j in ranked], share, steps, prior, bounds, agreement, notes=tuple(notes),
                           checked=pool)
        confidence[remaining[best]] = share[best]
        order.append(remaining[best])
        below = below_depth(remaining, s, remaining[best])  # the order below the depth, if decoding stops here
        chosen_labels.append(ids[remaining.pop(best)])
    if len(remaining) == 1:
        confidence[remaining[0]] = 1.0
    order += below if len(remaining) > 1 else remaining
    return _Window(order, confidence, steps, prior, bounds, agreement, notes=tuple(notes), checked=pool and bool(steps))


def _generated_window(state: EndpointState, messages: Any, ids: Sequence[str], depth: int | None = None
                      ) -> Flow[_Window]:
    """``vanilla`` where no prefix can be continued: the model's own answer, parsed; with a ``depth``, an
    answer long enough for that many identifiers. Identifiers it does not name are not decided places."""
    wanted = len(ids) if depth is None else min(depth, len(ids))
    [answer] = yield from generate(state, [messages], max_tokens=6 * wanted + 16, top=1)
    order, missing = parse_ranking("".join(token for token, _ in answer), ids)
    named = len(ids) - missing
    notes = (f"the model's answer left out {missing} of {len(ids)} identifiers; they follow in their given order",
             ) if named < wanted else ()
    return _Window(order, [0.0] * len(ids), [], None, 0, notes=notes, decoded=named if missing else None)


def _raw(logprobs: Sequence[float]) -> list[float]:
    """Raw joint label probabilities (``normalise=False``), not renormalised over the labels."""
    return [math.exp(x) for x in logprobs]
