"""Identifier probabilities from the served model's own tokens.

An identifier such as ``[12]`` is several tokens (``[`` ``1`` ``2`` ``]``). Its probability after a
prefix is the joint probability of all of them, closing ``]`` included. The labels still allowed
form a *trie* over tokens; every node whose next-token distribution is needed is known before any
request (the prefix of each node is the assistant prefix plus the node's tokens), so all of them
are asked at once, for the real and the empty prompt together: one batch per decoding step.

Two forms (DESIGN §4), computed from the same answers by :func:`score_labels`:

* ``"joint"`` (exact, the paper's): every node below the branching point is asked, so each label
  gets its unconstrained joint log-probability; the caller renormalises over the allowed labels.
* ``"trie"`` (cheap): probabilities are renormalised at every node over the children still allowed,
  so single-child nodes cost nothing; only branching nodes are asked.

Tokens shared by *all* allowed labels (the leading ``[`` or `` [``) contribute a common factor that
cancels in either renormalisation, so they are not asked for unless the raw (unrenormalised) joint
probabilities are wanted (``shared=True``).

Where only the most probable label is wanted (vanilla's middle steps), ``best_only`` asks the branching
nodes, then only the nodes of the labels that could still be the best: a node not asked contributes a
log-probability <= 0, so a label's sum over its asked nodes bounds its joint log-probability from above, and
once the label with the largest bound is exact no other can beat it. The choice is the joint form's, from
about 3-5 nodes a step instead of 21 (a 20-passage list's first step).
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from ..endpoints import Query, TokenLogprobs, next_token_logprobs
from ..endpoints.calls import EndpointState, Flow, Token
from ..errors import CapabilityError
from ..prompts.render import Messages

Path = tuple[Token, ...]
#: ``best_only``'s rounds ask the labels whose bound is within this many nats of the first one's together (a cost
#: choice, not an exactness one: fewer requests where closing tokens are near-certain, as on real models)
BAND = 0.5
Answer = tuple[TokenLogprobs, float]  # the wanted tokens found, and the floor (an upper bound for the rest)

__all__ = ["label_trie", "nodes_to_ask", "branching_nodes", "unread_nodes", "score_labels", "label_logprobs",
           "largest_top", "to_ask_again", "LabelScores"]


@dataclass(frozen=True)
class LabelScores:
    """Per label, in the order given: log-probability (unnormalised for ``joint``), and how many of
    the tokens needed were upper bounds because they were outside the endpoint's top-k; ``pruned``: how many
    labels' values are upper bounds because they could not be the best (``best_only``)."""

    logprobs: tuple[float, ...]
    upper_bounds: int
    pruned: int = 0


def label_trie(labels: Sequence[Path]) -> dict[Path, list[Token]]:
    """Children of every internal node of the trie over ``labels`` (insertion order kept).

    >>> t = label_trie([((1, "["), (2, "1"), (9, "]")), ((1, "["), (2, "1"), (3, "0"), (9, "]"))])
    >>> [piece for _, piece in t[((1, "["), (2, "1"))]]
    [']', '0']
    """
    children: dict[Path, list[Token]] = {}
    ends = set()
    for label in labels:
        if not label:
            raise CapabilityError("an identifier tokenized to nothing", missing="tokenize")
        ends.add(label)
        for depth in range(len(label)):
            kids = children.setdefault(label[:depth], [])
            if label[depth] not in kids:
                kids.append(label[depth])
    clash = ends & children.keys()
    if clash or len(ends) != len(labels):
        raise CapabilityError(
            "identifier labels are not prefix-free in this tokenizer (one label's tokens start another's); "
            "use the other identifier style", missing="prefix-free labels")
    return children


def nodes_to_ask(children: Mapping[Path, Sequence[Token]], form: str, *, shared: bool = False) -> list[Path]:
    """The trie nodes whose next-token distribution is needed: each internal node (``joint``) or each
    branching node (``trie``), below the prefix that every label shares unless ``shared``.

    >>> t = label_trie([((1, "["), (2, "1"), (9, "]")), ((1, "["), (2, "1"), (3, "0"), (9, "]")),
    ...                 ((1, "["), (4, "2"), (9, "]"))])
    >>> [len(n) for n in nodes_to_ask(t, "joint")], [len(n) for n in nodes_to_ask(t, "trie")]
    ([1, 2, 3, 2], [1, 2])
    >>> [len(n) for n in nodes_to_ask(t, "joint", shared=True)]
    [0, 1, 2, 3, 2]
    """
    start: Path = ()
    while not shared and len(children.get(start, ())) == 1:  # common to every label: cancels, not asked
        start = start + (children[start][0],)
    return [node for node in children if len(node) >= len(start) and node[:len(start)] == start
            and (form == "joint" or len(children[node]) > 1)]


def branching_nodes(children: Mapping[Path, Sequence[Token]], needed: Sequence[Path], labels: Sequence[Path]
                    ) -> list[Path]:
    """The nodes a lazy reading asks first: those of ``needed`` where the trie branches, and a prefix every label
    shares (asked only where ``needed`` holds it, ``shared``)."""
    return [node for node in needed if len(children[node]) > 1 or all(x[:len(node)] == node for x in labels)]


def unread_nodes(labels: Sequence[Path], needed: Container[Path], known: Container[Path]) -> list[list[Path]]:
    """Per label, its nodes in ``needed`` not in ``known`` (an empty list: the label is read through)."""
    return [[x[:d] for d in range(len(x)) if x[:d] in needed and x[:d] not in known] for x in labels]


def score_labels(labels: Sequence[Path], children: Mapping[Path, Sequence[Token]],
                 answers: Mapping[Path, Answer], form: str) -> LabelScores:
    """Each label's log-probability: the sum over its asked nodes of the chosen child's logprob (a
    child missing from the top-k takes the node's floor and counts as an upper bound), renormalised
    over the node's children for ``trie``. Nodes not asked contribute nothing (shared or single-child).

    >>> A, B, C, END = (1, "1"), (2, "2"), (3, "0"), (9, "]")
    >>> labels = [(A, END), (A, C, END), (B, END)]
    >>> t = label_trie(labels)
    >>> answers = {(): ({A: math.log(.6), B: math.log(.2)}, math.log(.01)),
    ...            (A,): ({END: math.log(.5), C: math.log(.3)}, math.log(.01)), (A, C): ({}, math.log(.05)),
    ...            (B,): ({END: math.log(.9)}, math.log(.01))}
    >>> s = score_labels(labels, t, answers, "joint")
    >>> [round(math.exp(x), 3) for x in s.logprobs], s.upper_bounds  # .6*.5, .6*.3*.05 (bound), .2*.9
    ([0.3, 0.009, 0.18], 1)
    >>> [round(math.exp(x), 3) for x in score_labels(labels, t, answers, "trie").logprobs]  # .75*.625, .75*.375, .25
    [0.469, 0.281, 0.25]
    """
    bounds = sum(k not in got for node, (got, _) in answers.items() for k in children[node])
    out = []
    for label in labels:
        total = 0.0
        for depth, kid in enumerate(label):
            node = label[:depth]
            if node not in answers:
                continue
            got, floor = answers[node]
            value = got.get(kid, floor)
            if form == "trie":
                value -= logsumexp([got.get(k, floor) for k in children[node]])
            total += value
        out.append(total)
    return LabelScores(tuple(out), bounds)


def label_logprobs(state: EndpointState, contexts: Sequence[tuple[Messages, Path]], labels: Sequence[Path], *,
                   form: str = "joint", top: int = 20, shared: bool = False, render: str = "chat",
                   best_only: bool = False) -> Flow[list[LabelScores]]:
    """Log-probability of every label after each ``(messages, assistant prefix tokens)`` context;
    ``shared`` asks the tokens common to all labels too (raw joint probabilities), ``render`` names the
    prompt format (``"chat"``: the server's chat template).

    ``best_only`` (``joint``): only the label that orders first matters (largest joint log-probability, the
    earlier on a tie). The branching nodes are asked (and, ``shared``, the prefix every label shares); then the
    nodes not yet asked of the label with the largest bound and of those within :data:`BAND` of it; then, if
    that label is no longer first, those of every label whose bound reaches the best exact value: at most three
    requests (module docstring). A label not asked through holds an upper bound below the best's value
    (``pruned`` counts them)."""
    if best_only and (form != "joint" or len(contexts) != 1):
        raise ValueError("best_only reads one context in the joint form")
    children = label_trie(labels)
    needed = nodes_to_ask(children, form, shared=shared)
    ask = branching_nodes(children, needed, labels) if best_only else needed
    answers: list[dict[Path, Answer]] = [{} for _ in contexts]
    band = False  # best_only: whether the labels near the first one were asked
    while True:
        queries = [Query(messages, prefix + node, tuple(children[node]), render)
                   for messages, prefix in contexts for node in ask]
        if queries:  # asked once at ``top``; those missing a wanted token again at the endpoint's largest top-k
            found = yield from next_token_logprobs(state, queries, min(top, largest_top(state, top)))
            retry = to_ask_again(state, queries, found, top)
            if retry:
                again = yield from next_token_logprobs(state, [queries[i] for i in retry], largest_top(state, top))
                for i, answer in zip(retry, again):
                    found[i] = answer
            for c, known in enumerate(answers):
                known.update(zip(ask, found[c * len(ask):(c + 1) * len(ask)]))
        scored = [score_labels(labels, children, known, form) for known in answers]
        if not best_only:
            return scored
        [known], [values] = answers, scored
        missing = unread_nodes(labels, needed, known)
        first = min(range(len(labels)), key=lambda j: (-values.logprobs[j], j))
        if not missing[first]:
            return [LabelScores(values.logprobs, values.upper_bounds, sum(map(bool, missing)))]
        # the second request: the first label's nodes and those of the labels whose bound is near its own; the
        # third: every label whose bound reaches the best exact value (after it, the first label is exact)
        best = max((v for v, nodes in zip(values.logprobs, missing) if not nodes), default=-math.inf)
        near = best if band else max(best, values.logprobs[first] - BAND)
        band = True
        ask = list(dict.fromkeys(node for j, nodes in enumerate(missing) if values.logprobs[j] >= near for node in nodes))


def largest_top(state: EndpointState, top: int) -> int:
    """The endpoint's largest top-k (``top`` before the probe)."""
    return state.caps.max_top_logprobs if state.caps else top


def to_ask_again(state: EndpointState, queries: Sequence[Query], found: Sequence[Answer], top: int) -> list[int]:
    """The queries to ask again at :func:`largest_top`: those whose answer at ``top`` missed a wanted token, where
    the endpoint has a larger top-k and cannot return exactly the wanted tokens. (Not a flow: the caller yields,
    so a request is sent from no deeper a stack of generators.)"""
    if largest_top(state, top) <= top or (state.caps and state.caps.logprob_token_ids):
        return []
    return [i for i, (got, _) in enumerate(found) if len(got) < len(queries[i].want)]


def logsumexp(values: Sequence[float]) -> float:
    """``log(sum(exp(v)))``, computed stably (also for :mod:`.textlabels`)."""
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))
