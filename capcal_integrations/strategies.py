"""Ranking strategies, written once and free of I/O.

Each strategy is a generator (a :data:`~.protocol.Flow`) that yields HTTP calls and receives their
answers; :mod:`.drivers` runs it with a sync or an async client. Methods:

* ``vanilla``: constrained listwise decoding, no calibration;
* ``capcal``: the same decoding, each step's distribution calibrated against the empty prompt's;
* ``first-token`` / ``first-token-capcal``: everything ranked from the first step's distribution;
* ``psc``: permutation self-consistency, ``m`` shuffled vanilla rankings aggregated by Borda count.

Lists longer than ``window`` are ranked by a back-to-front sliding window (:func:`windows`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .calibration import adaptive_alpha, calibrated, entropy, normalise_logprobs, order_of_scores
from .errors import InputError
from .labels import label_logprobs
from .prompts import DEFAULT_PLACEHOLDER, RANK_ZEPHYR, PromptTemplate, clean_passage, labels, passage_text, render
from .protocol import Flow, tokenize
from .types import Capabilities, Document, Ranking, Step

__all__ = ["Options", "METHODS", "windows", "borda", "rerank_flow", "parallel"]

METHODS = ("capcal", "vanilla", "first-token", "first-token-capcal", "psc")
_CALIBRATED = {"capcal", "first-token-capcal"}


@dataclass(frozen=True)
class Options:
    """Everything that decides how a list is ranked (validated in ``__post_init__``)."""

    method: str = "capcal"
    alpha: float | str = "adaptive"
    calibration: str = "additive"  # "additive" (the paper's) | "log" (log p - alpha log q)
    placeholder: str = DEFAULT_PLACEHOLDER
    template: PromptTemplate = RANK_ZEPHYR
    label_style: str = "numeric"
    probability: str = "joint"  # "joint" (exact) | "trie" (renormalised per trie node; cheaper)
    window: int = 20
    stride: int = 10
    m: int = 5
    seed: int = 0
    max_passage_words: int | None = 300
    max_context: int | None = None
    top_logprobs: int = 20
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not (self.alpha == "adaptive" or (isinstance(self.alpha, (int, float)) and self.alpha >= 0)):
            raise InputError(f"alpha must be 'adaptive' or a number >= 0, got {self.alpha!r}")
        if self.calibration not in ("additive", "log"):
            raise InputError(f"calibration must be 'additive' or 'log', got {self.calibration!r}")
        if self.probability not in ("joint", "trie"):
            raise InputError(f"probability must be 'joint' or 'trie', got {self.probability!r}")
        if self.window < 2 or not 1 <= self.stride <= self.window:
            raise InputError(f"need window >= 2 and 1 <= stride <= window, got {self.window}/{self.stride}")
        if self.m < 1:
            raise InputError(f"psc needs m >= 1 shuffles, got {self.m}")
        labels(min(self.window, 26), self.label_style)  # validates the style

    @property
    def calibrated(self) -> bool:
        return self.method in _CALIBRATED


def windows(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """Back-to-front sliding windows ``[start, end)`` over ``n`` ranked items, as RankGPT runs them.

    The last window is shifted to start at 0 rather than shrunk, so the top is always compared in a
    full window (RankGPT's loop would skip the head when ``n - size`` is not a multiple of ``stride``).

    >>> windows(100, 20, 10)[:2], len(windows(100, 20, 10)), windows(100, 20, 10)[-1]
    ([(80, 100), (70, 90)], 9, (0, 20))
    >>> windows(25, 20, 10)
    [(5, 25), (0, 20)]
    >>> windows(20, 20, 10), windows(5, 20, 10), windows(0, 20, 10)
    ([(0, 20)], [(0, 5)], [])
    """
    if n <= 0:
        return []
    if n <= size:
        return [(0, n)]
    out = []
    end = n
    while True:
        start = max(0, end - size)
        out.append((start, start + size))
        if start == 0:
            return out
        end -= stride


def borda(rankings: Sequence[Sequence[int]], n: int) -> list[int]:
    """Borda aggregation: an item at rank ``r`` (0-based) of a list of ``n`` earns ``n - 1 - r``
    points; ties are broken by the input index. Returns the aggregated order.

    >>> borda([[0, 1, 2], [1, 0, 2], [1, 2, 0]], 3)  # points: 0 -> 3, 1 -> 5, 2 -> 1
    [1, 0, 2]
    """
    points = [0] * n
    for ranking in rankings:
        for r, item in enumerate(ranking):
            points[item] += n - 1 - r
    return sorted(range(n), key=lambda i: (-points[i], i))


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


@dataclass(frozen=True)
class _Window:
    order: list[int]  # positions within the window, best first
    confidence: list[float]  # per position: calibrated share when chosen (0..1)
    steps: list[Step]
    prior: tuple[float, ...] | None
    upper_bounds: int


def _rank_window(caps: Capabilities, opts: Options, query: str, texts: list[str], first_only: bool,
                 cache: dict) -> Flow[_Window]:
    n = len(texts)
    ids = labels(n, opts.label_style)
    real = render(opts.template, query, texts, ids)
    empty = render(opts.template, query, [opts.placeholder] * n, ids) if opts.calibrated else None
    spellings = [s for i in ids for s in (i, " " + i) if s not in cache["labels"]]
    if spellings:
        for text, tokens in zip(spellings, (yield from tokenize(caps, spellings))):
            cache["labels"][text] = tuple(tokens)
    remaining, chosen_labels = list(range(n)), []
    order, confidence, steps, prior, bounds = [], [0.0] * n, [], None, 0
    while len(remaining) > 1:
        prefix = " > ".join(chosen_labels) + " >" if chosen_labels else ""
        paths = [cache["labels"][(" " if chosen_labels else "") + ids[i]] for i in remaining]
        contexts = [(real, prefix)] + ([(empty, prefix)] if empty else [])
        scored = yield from label_logprobs(caps, contexts, paths, form=opts.probability, top=opts.top_logprobs,
                                           cache=cache)
        p = normalise_logprobs(scored[0].logprobs)
        q = normalise_logprobs(scored[1].logprobs) if empty else None
        alpha = 0.0
        s = p
        if q is not None:
            alpha = adaptive_alpha(p) if opts.alpha == "adaptive" else float(opts.alpha)
            s = calibrated(p, q, alpha, opts.calibration)
            if prior is None:
                prior = tuple(q)
        bounds += sum(x.upper_bounds for x in scored)
        share = _shares(s)
        if first_only:
            ranked = order_of_scores(s)
            steps.append(Step(tuple(remaining), tuple(p), q and tuple(q), tuple(s), alpha, entropy(p),
                              remaining[ranked[0]], upper_bounds=bounds))
            return _Window([remaining[j] for j in ranked], share, steps, prior, bounds)
        best = max(range(len(remaining)), key=lambda j: (s[j], -j))
        steps.append(Step(tuple(remaining), tuple(p), q and tuple(q), tuple(s), alpha, entropy(p),
                          remaining[best], upper_bounds=bounds))
        confidence[remaining[best]] = share[best]
        order.append(remaining[best])
        chosen_labels.append(ids[remaining.pop(best)])
    order += remaining
    if remaining:
        confidence[remaining[0]] = 1.0
    return _Window(order, confidence, steps, prior, bounds)


def _shares(s: Sequence[float]) -> list[float]:
    """Calibrated scores clipped at zero and renormalised: the chosen one's share is its confidence."""
    clipped = [max(x, 0.0) for x in s]
    total = sum(clipped)
    return [x / total for x in clipped] if total > 0 else [1.0 / len(s)] * len(s)


def _fit(caps: Capabilities, opts: Options, query: str, docs: Sequence[Document]) -> Flow[list[str]]:
    """Clean every passage and cut them so the widest window's prompt fits the context."""
    context = opts.max_context or caps.context or 4096
    width = min(opts.window, len(docs))
    budget = context - (6 * width + 64)  # room for the chat template and a full ranking
    words = opts.max_passage_words
    for _ in range(8):
        texts = [clean_passage(passage_text(d), words) for d in docs]
        longest = sorted(texts, key=len, reverse=True)[:width]
        messages = render(opts.template, query, longest, labels(width, opts.label_style))
        whole = "\n".join(content for _, content in messages)
        if caps.tokenize:
            [tokens] = yield from tokenize(caps, [whole])
            size = len(tokens)
        else:
            size = len(whole) // 3
        if size <= budget:
            return texts
        longest_words = max(len(t.split()) for t in longest)
        if longest_words <= 1:
            break
        words = max(1, int(min(words or longest_words, longest_words) * budget / size * 0.9))
    raise InputError(f"the query and {width} passages do not fit a {context}-token context even at one word per "
                     "passage; shorten the query or lower window")


def rerank_flow(caps: Capabilities, opts: Options, query: str, docs: Sequence[Document], cache: dict) -> Flow[Ranking]:
    """Rank ``docs`` for ``query``; ``cache`` holds label tokens and rendered templates across calls."""
    n = len(docs)
    if n <= 1:
        return Ranking(tuple(range(n)), (1.0,) * n, opts.method)
    texts = yield from _fit(caps, opts, query, docs)
    if opts.method == "psc":
        rng = random.Random(opts.seed)
        shuffles = [rng.sample(range(n), n) for _ in range(opts.m)]
        vanilla = replace(opts, method="vanilla")
        runs = yield from parallel([_sliding(caps, vanilla, query, [texts[i] for i in s], cache) for s in shuffles])
        rankings = [[s[i] for i in run.order] for s, run in zip(shuffles, runs)]
        order = borda(rankings, n)
        bounds = sum(run.upper_bounds for run in runs)
        # steps are left out: each run's steps index its own shuffled list
        return Ranking(tuple(order), _rank_scores(order, [1.0] * n), "psc", upper_bounds=bounds)
    run = yield from _sliding(caps, opts, query, texts, cache)
    return run


def _sliding(caps: Capabilities, opts: Options, query: str, texts: list[str], cache: dict) -> Flow[Ranking]:
    n = len(texts)
    first_only = opts.method.startswith("first-token")
    order, confidence = list(range(n)), [0.0] * n
    steps: list[Step] = []
    prior, bounds = None, 0
    for w, (start, end) in enumerate(windows(n, opts.window, opts.stride)):
        members = order[start:end]
        result = yield from _rank_window(caps, opts, query, [texts[i] for i in members], first_only, cache)
        order[start:end] = [members[j] for j in result.order]
        for j, c in enumerate(result.confidence):
            confidence[members[j]] = c
        steps += [Step(tuple(members[c] for c in s.candidates), s.p, s.q, s.scores, s.alpha, s.entropy,
                       members[s.chosen], w, s.upper_bounds) for s in result.steps]
        prior = prior or result.prior
        bounds += result.upper_bounds
    if first_only and n <= opts.window:
        s0 = steps[0]
        scores = [0.0] * n
        for i, v in zip(s0.candidates, s0.scores):
            scores[i] = v
        return Ranking(tuple(order), tuple(scores), opts.method, prior, tuple(steps), upper_bounds=bounds)
    return Ranking(tuple(order), _rank_scores(order, confidence), opts.method, prior, tuple(steps), upper_bounds=bounds)


def _rank_scores(order: Sequence[int], confidence: Sequence[float]) -> tuple[float, ...]:
    """``(n - r - 1 + c) / n`` for the item at rank ``r``: strictly follows ``order``.

    >>> _rank_scores([2, 0, 1], [0.5, 1.0, 0.25])  # ranks 2 -> 0, 0 -> 1, 1 -> 2; c is capped at 0.999
    (0.5, 0.333, 0.75)
    """
    n = len(order)
    scores = [0.0] * n
    for r, item in enumerate(order):
        scores[item] = (n - r - 1 + min(max(confidence[item], 0.0), 0.999)) / n
    return tuple(scores)
