"""Ranking strategies, written once and free of I/O.

:func:`rerank_flow` is the whole of one reranking as a :data:`~capcal_integrations.endpoints.calls.Flow`: it checks the input,
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

Before a calibrated method decodes anything, the content rule (:mod:`.rules`, its state per model and
reading options in :mod:`.content_check`: does the model read? decided once over the queries) says whether to: while it decides,
and for a model that does not read, the list keeps its given order (:func:`_checked`). Lists longer than
``window`` are ranked by a back-to-front sliding window (:func:`~.orders.windows`); each window is
decoded by :func:`~.decoding.rank_window`, which applies the rules of their own modules: the depth
(:mod:`.depth`) and the deadline (:mod:`.deadline`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from ..content_check.check import Pending
from ..content_check.registry import check_of
from ..endpoints.calls import EndpointState, Flow
from ..endpoints.probe import capabilities
from ..errors import CapabilityError, InputError
from ..options import Options
from ..reading.readers import reader_of
from ..types import Capabilities, Document, Ranking, Step, as_document
from .deadline import Deadline, DeadlinePassed, deadline_note, deadline_skip_note, finish, first_stage, partial_order
from .decoding import check_readings, rank_window
from .depth import borda_decoded, decoded_places, depth_note, window_depths
from .fitting import cleaned, fit
from .orders import rank_scores, windows

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
    _encodable("query", query)
    for i, doc in enumerate(docs):
        _encodable(f"passages[{i}]", doc.text)
    return query.strip(), docs


def _encodable(what: str, text: str) -> None:
    """An :class:`~.errors.InputError` naming ``what`` if ``text`` cannot be sent (a lone surrogate, as a file
    decoded with ``errors="surrogateescape"`` leaves: no UTF-8 holds it, and it failed as the endpoint's fault)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(f"{what} holds {text[err.start:err.end]!r} at {err.start}, a lone surrogate that is not "
                         "Unicode text and cannot be sent: decode its bytes with errors='replace'") from None


def rerank_flow(state: EndpointState, opts: Options, query: Any, passages: Sequence[Any]) -> Flow[Ranking]:
    """Rank ``passages`` for ``query``. The input is checked before any request is made. A
    :class:`~.deadline.DeadlinePassed` that no decoding handled (thrown while probing or fitting the passages,
    before any place can be decided) returns the first-stage order, marked partial."""
    query, docs = validated(query, passages)
    n = len(docs)
    if n <= 1:  # nothing to rank, no request: no method ran
        return Ranking(tuple(range(n)), (1.0,) * n, "given-order", notes=(f"{n} passage{'s' * (n != 1)}: nothing to rank",))
    clock = Deadline(opts.deadline) if opts.deadline is not None else None  # started as the driver's (its first next)
    try:
        caps = yield from capabilities(state)
        run = _resolve(state, caps, opts)
        query = cleaned(run, query)  # untrusted too: no identifier look-alikes (and sent as text only where it must)
        texts, notes = yield from fit(state, run, query, docs)
        if run.how.shuffles:
            return (yield from _shuffled(state, run, query, texts, notes, clock))
        run, kept, check_notes = yield from _checked(state, run, query, texts)
        if kept is not None:
            return dataclasses.replace(kept, notes=(*notes, *kept.notes))
        notes = [*check_notes, *notes]
        ranking = yield from _sliding(state, run, query, texts, clock)
    except DeadlinePassed:
        return first_stage(n, opts.method, opts.deadline)
    how = reader_of(caps, run.prompt).below_depth
    return dataclasses.replace(ranking, notes=(*notes, *ranking.notes, *_cut_note(ranking, run, how)))


def _shuffled(state: EndpointState, opts: Options, query: str, texts: list[str], notes: list[str],
              clock: Deadline | None) -> Flow[Ranking]:
    """``psc``: ``opts.m`` shuffles of the list ranked by ``vanilla`` side by side, aggregated by Borda count."""
    n = len(texts)
    rng = random.Random(opts.seed)
    shuffles = [rng.sample(range(n), n) for _ in range(opts.m)]
    vanilla = opts.replace(method="vanilla")
    runs = yield from parallel([_sliding(state, vanilla, query, [texts[i] for i in s], clock) for s in shuffles])
    order = borda_decoded([[s[i] for i in run.order] for s, run in zip(shuffles, runs)], [r.decoded for r in runs], n)
    notes = [*notes, *(f"shuffle {k}: {note}" for k, run in enumerate(runs) for note in run.notes)]
    decoded, partial = decoded_places(n, opts.depth), any(run.partial for run in runs)
    if partial:  # the deadline: the places every shuffle had decided are aggregated, the rest in first-stage order
        decoded = min(n if run.decoded is None else run.decoded for run in runs)
        order = partial_order(n, order[:decoded])
    # steps are left out: each run's steps index its own shuffled list
    ranking = Ranking(tuple(order), rank_scores(order, [1.0] * n), "psc", upper_bounds=sum(run.upper_bounds for run in runs),
                      notes=tuple(notes), decoded=decoded, partial=partial)
    how = "their Borda points over the shuffles' decoded places"
    return dataclasses.replace(ranking, notes=(*ranking.notes, *_cut_note(ranking, opts, how)))


def _checked(state: EndpointState, opts: Options, query: str,
             texts: list[str]) -> Flow[tuple[Options, Ranking | None, tuple[str, ...]]]:
    """What the content check says for this list: the options to decode it with (``alpha="auto"`` resolved),
    or the list in its given order (while the check decides, or when the model does not read). A list read
    for the check is handed to ``state.background`` (the reranker's runner), or read here with
    ``check_wait`` (or where no runner is set), when the check wants it (:meth:`~.content_check.ContentCheck.want`)."""
    check = check_of(state, opts)
    first_only = opts.how.first_only
    if check is None:
        return opts, None, ()
    top = texts[:opts.window]
    checked: tuple[int, ...] = ()
    failed: tuple[str, ...] = ()
    runner = None if opts.check_wait else state.background
    if check.verdict() is None and (ident := check.want(query, top, exclusive=runner is not None)):
        pending = Pending(check, lambda view: check_readings(view, opts, query, top, check.rule), opts.calibration, ident)
        if runner is not None:
            runner(pending)
        else:  # a failed reading leaves the list in its given order, with a note (Pending.take)
            failure = yield from pending.take(state)
            checked, failed = ((), (failure,)) if failure else ((0,), ())
    verdict = check.verdict(first_only)
    if verdict is not None and verdict.reads:
        resolved = opts.replace(alpha=verdict.alpha) if opts.alpha == "auto" else opts
        return resolved, None, (verdict.note,)
    n = len(texts)
    note = verdict.note if verdict is not None else check.pending_note(len(top))
    return opts, Ranking(tuple(range(n)), rank_scores(list(range(n)), [0.0] * n), "given-order", notes=(note, *failed),
                         decoded=0, checked=checked, kept_given_order=True), ()


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
    reader = reader_of(caps, opts.prompt)
    if not reader.steps and not caps.logprobs and not opts.how.answers_suffice:
        raise CapabilityError(
            f"method={opts.method!r} reads identifier probabilities, and this endpoint's chat completions return no "
            "log-probabilities (logprobs/top_logprobs); method='vanilla' or 'psc' rank from its answers alone, "
            "without calibration", missing="logprobs", alternatives=("vanilla", "psc"))
    if opts.method == "auto":
        method = reader.auto_method
        if ("auto", reader.route) not in state.announced:
            state.announced.add(("auto", reader.route))
            log.info("capcal: method auto runs %s on %s: %s", method, caps.model, reader.why_auto.format(prompt=opts.prompt))
        return opts.replace(method=method)
    if opts.method == "capcal" and not reader.steps:
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


def _sliding(state: EndpointState, opts: Options, query: str, texts: list[str],
             clock: Deadline | None = None) -> Flow[Ranking]:
    n = len(texts)
    first_only = opts.how.first_only
    order, confidence = list(range(n)), [0.0] * n
    steps: list[Step] = []
    prior, bounds, notes = None, 0, []
    depths = window_depths(n, opts.window, opts.stride, None if first_only else opts.depth)  # see .depth
    decoded, partial = None if first_only else decoded_places(n, opts.depth), False
    spans, took, skipped = windows(n, opts.window, opts.stride), 0.0, 0  # bottom first; the slowest window's seconds
    for w, (start, end) in enumerate(spans):
        if start and clock is not None and (skipped or (took and clock.left() < 2 * took)):
            skipped += 1  # .deadline: a lower window would leave the top window less than its time
            if w == len(spans) - 2:
                notes.append(deadline_skip_note(opts.deadline, skipped, spans[-1][1]))
            continue
        began = clock.clock() if clock is not None else 0.0
        members = order[start:end]
        result = yield from rank_window(state, opts, query, [texts[i] for i in members], first_only, depths[w])
        notes += [f"window {w}: {note}" for note in result.notes]
        order[start:end] = [members[j] for j in result.order]
        for j, c in enumerate(result.confidence):
            confidence[members[j]] = c
        steps += [Step(tuple(members[c] for c in s.candidates), s.p, s.q, s.scores, s.alpha, s.entropy,
                       members[s.chosen], w, s.upper_bounds, s.pruned) for s in result.steps]
        prior = prior or result.prior
        bounds += result.upper_bounds
        took = max(took, clock.clock() - began) if clock is not None else 0.0
        if result.partial:  # the deadline passed in this window: the top places it decided, the rest as given
            decided = order[:result.decoded] if start == 0 else []
            order, decoded, partial = partial_order(n, decided), len(decided), True
            break
        if start == 0 and result.decoded is not None:  # a generated answer that left identifiers out
            decoded = min(result.decoded, n if decoded is None else decoded)
    for i in order[n if decoded is None else decoded:]:
        confidence[i] = 0.0  # not decided
    if bounds and not reader_of(state.caps, opts.prompt).steps:
        notes.append(f"{bounds} identifier probabilities are estimates (counted in upper_bounds): the model's answer "
                     "did not pass through a token they share, or they were outside its top log-probabilities (a "
                     "tokenizer that splits numbers into digits shares '1' among [1] and [10]..[19]); window=9 "
                     "reads every identifier exactly on this endpoint")
    scores = rank_scores(order, confidence)
    if first_only and n <= opts.window and not partial:
        by_input = [0.0] * n
        for i, v in zip(steps[0].candidates, steps[0].scores):
            by_input[i] = v
        scores = tuple(by_input)
    return Ranking(tuple(order), scores, opts.method, prior, tuple(steps), upper_bounds=bounds, notes=tuple(notes),
                   decoded=decoded, partial=partial)
