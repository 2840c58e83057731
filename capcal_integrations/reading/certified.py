"""CapCal's middle steps from the trie nodes its choice needs: both streams asked together, the choice certified.

The whole reading asks every node of the identifier trie on the real and the empty stream. Here a step asks, in
at most :data:`ROUNDS` rounds, each one batch holding both streams' prompts (a wanted token outside the top-k asked
again at the largest):

1. the branching nodes of both streams (and, ``shared``, the prefix every label shares);
2. to 4. the reads a plan, made from what the rounds before read, predicts will certify the best label: every bound
   taken as its value, the predicted choice's real nodes, then, greedily, the read (a rival's real or empty nodes, the
   choice's empty nodes, the largest unread label's on either stream, for the normalisers' least values) that most
   raises the least lower bound of :func:`~..calibration.certify.rival_slacks`, until it clears the margin (a plan
   fails where a read factor is below its bound, most often the empty stream's closing ``]``: the next round plans
   again from the values read);
5. every node left: the whole reading (also earlier, where no reads would certify: a near-tie).

After each round, the label with the best score at the bounds is certified or not by
:func:`~..calibration.certify.certified` (whatever the unread factors are, it is the whole reading's choice); a
certified step stops. So the choice is always the whole reading's, however many rounds a step takes.

Why five rounds and not three (a third round reading every node left): on 10 DL19 lists of 20 passages (the
packaged 0.5B on llama.cpp, every prompt's answer recorded from the whole reading and the lazy readings answered
from that record), the same orders on 10 of 10 either way, 206 nodes a list against 268, middle steps certified
before the last round 165 of 170 against 130, and fewer requests, 79.2 a list against 80.7
(``python -m benchmarks.fidelity lazy --lists 10 --passages 20 --alphas 1.0 --rounds 3,5``, run ``lazy-rounds``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..calibration.certify import MARGIN, Box, alpha_bounds, certified, rival_slacks
from ..calibration.formulas import adaptive_alpha, calibrate, normalise, order_of_scores
from ..endpoints import Query, next_token_logprobs
from ..endpoints.calls import EndpointState, Flow
from ..prompts.render import Messages
from .labels import (
    LabelScores,
    Path,
    branching_nodes,
    label_trie,
    largest_top,
    nodes_to_ask,
    score_labels,
    to_ask_again,
    unread_nodes,
)

__all__ = ["ROUNDS", "CertifiedScores", "certified_labels"]

#: A lazy step's rounds at most (module docstring): the branching nodes, three plans, every node left
ROUNDS = 5


@dataclass(frozen=True)
class CertifiedScores:
    """The real and the empty stream's label log-probabilities (upper bounds where a label is not read through;
    the real one's ``pruned`` counts the labels read through on neither or one stream only), and the certified
    choice (``None``: every node was read, the whole reading: choose from the values as it does)."""

    real: LabelScores
    empty: LabelScores
    chosen: int | None


def certified_labels(state: EndpointState, streams: tuple[Messages, Messages], prefix: Path, labels: Sequence[Path],
                     *, alpha: float | None, normalise_shares: bool = True, top: int = 20, shared: bool = False,
                     render: str = "chat") -> Flow[CertifiedScores]:
    """The labels' joint log-probabilities on the real and the empty stream (each ``(messages)`` after ``prefix``)
    read far enough to certify the additive form's choice (module docstring); ``alpha`` fixed, or ``None``: the
    adaptive rule; ``normalise_shares=False``: the raw form (``shared`` then asks the prefix every label shares)."""
    children = label_trie(labels)
    needed = nodes_to_ask(children, "joint", shared=shared)
    first = branching_nodes(children, needed, labels)
    needed_set = set(needed)
    known: tuple[dict, dict] = ({}, {})
    ask = (first, first)
    for round_ in range(ROUNDS):
        queries = [Query(messages, prefix + node, tuple(children[node]), render)
                   for messages, nodes in zip(streams, ask) for node in nodes]
        found = yield from next_token_logprobs(state, queries, min(top, largest_top(state, top)))
        retry = to_ask_again(state, queries, found, top)  # a wanted token missing: again at the largest top-k
        if retry:
            again = yield from next_token_logprobs(state, [queries[i] for i in retry], largest_top(state, top))
            for i, answer in zip(retry, again):
                found[i] = answer
        k = len(ask[0])
        known[0].update(zip(ask[0], found[:k]))
        known[1].update(zip(ask[1], found[k:]))
        scored = [score_labels(labels, children, answers, "joint") for answers in known]
        missing = [unread_nodes(labels, needed_set, answers) for answers in known]
        pruned = sum(bool(r or e) for r, e in zip(*missing))
        if not pruned:
            return CertifiedScores(scored[0], scored[1], None)
        boxes = [_box(s.logprobs, m, normalise_shares) for s, m in zip(scored, missing)]
        interval = (alpha, alpha) if alpha is not None else alpha_bounds(boxes[0])
        c = _best_at_bounds(boxes, alpha, normalise_shares)
        if certified(c, boxes[0], boxes[1], interval, normalise=normalise_shares):
            return CertifiedScores(replace(scored[0], pruned=pruned), scored[1], c)
        plan = _plan(c, boxes, alpha, normalise_shares) if round_ < ROUNDS - 2 else None
        reads = [[False] * len(labels), [False] * len(labels)]
        for s, i in plan if plan is not None else [(s, i) for s in (0, 1) for i in range(len(labels))]:
            reads[s][i] = True
        ask = tuple(list(dict.fromkeys(node for i, nodes in enumerate(missing[s]) if reads[s][i] for node in nodes))
                    for s in (0, 1))
        if not any(ask):  # nothing the plan would read: the rest
            ask = tuple(list(dict.fromkeys(node for nodes in missing[s] for node in nodes)) for s in (0, 1))
    raise AssertionError("the last round reads every node left")  # pragma: no cover


def _box(logprobs: Sequence[float], missing: Sequence[Sequence[Path]], normalise_shares: bool) -> list[tuple[float, float]]:
    """Per label ``(lo, hi)`` of its joint probability: ``hi`` the product of its asked factors, ``lo`` the same
    once it is read through, else 0. Normalised, scaled by the largest (the shares, and the certificate, do not
    change with a common factor; no underflow)."""
    shift = max(logprobs) if normalise_shares else 0.0
    return [(0.0 if m else math.exp(v - shift), math.exp(v - shift)) for v, m in zip(logprobs, missing)]


def _scores_at_bounds(boxes: Sequence[Box], alpha: float | None, normalise_shares: bool) -> list[float]:
    """The additive scores with every label at its upper bound (a point of the box)."""
    hi_a, hi_b = ([hi for _, hi in box] for box in boxes)
    shares_p = normalise(hi_a)
    p, q = (shares_p, normalise(hi_b)) if normalise_shares else (hi_a, hi_b)
    return calibrate(p, q, adaptive_alpha(shares_p) if alpha is None else alpha)


def _best_at_bounds(boxes: Sequence[Box], alpha: float | None, normalise_shares: bool) -> int:
    return order_of_scores(_scores_at_bounds(boxes, alpha, normalise_shares))[0]


def _plan(c: int, boxes: Sequence[Box], alpha: float | None, normalise_shares: bool,
          values: Sequence[Sequence[float]] | None = None) -> list[tuple[int, int]] | None:
    """The reads ``(stream, label)`` predicted to certify ``c``, each read's bound taken as its value (module
    docstring), or its value in ``values`` where known (``benchmarks.fidelity lazy --known``: the reads a plan that
    knew every value would make); ``None`` where no reads would (a near-tie: read everything)."""
    state = [list(box) for box in boxes]
    n = len(state[0])

    def unread(s: int, i: int) -> bool:
        return state[s][i][0] != state[s][i][1]

    def least(trial: Sequence[list[tuple[float, float]]]) -> tuple[float, int]:
        interval = (alpha, alpha) if alpha is not None else alpha_bounds(trial[0])
        slacks = rival_slacks(c, trial[0], trial[1], interval, normalise=normalise_shares)
        j = min(range(n), key=slacks.__getitem__)
        scale = 1.0 if normalise_shares else max(sum(hi for _, hi in trial[0]), sum(hi for _, hi in trial[1]), 1e-300)
        return slacks[j] - 2 * MARGIN * scale * (1 + max(interval)), j

    def read(trial: list[list[tuple[float, float]]], s: int, i: int) -> list[list[tuple[float, float]]]:
        out = [list(x) for x in trial]
        v = trial[s][i][1] if values is None else values[s][i]
        out[s][i] = (v, v)
        return out

    plan = []
    if unread(0, c):
        state, plan = read(state, 0, c), [(0, c)]
    for _ in range(2 * n):
        slack, j = least(state)
        if slack > 0:
            return plan
        largest = [max((i for i in range(n) if i not in (c, j) and unread(s, i)), key=lambda i: state[s][i][1],
                       default=None) for s in (0, 1)]
        options = [o for o in dict.fromkeys([(0, j), (1, j), (1, c), (0, largest[0]), (1, largest[1])])
                   if o[1] is not None and unread(*o)]
        if not options:
            return None
        s, i = max(options, key=lambda o: least(read(state, *o))[0])
        state = read(state, s, i)
        plan.append((s, i))
    return None
