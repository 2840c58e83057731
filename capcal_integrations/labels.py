"""Identifier probabilities from the served model's own tokens.

An identifier such as ``[12]`` is several tokens (``[`` ``1`` ``2`` ``]``). Its probability after a
prefix is the joint probability of all of them, closing ``]`` included. The labels still allowed
form a *trie* over token ids; :func:`label_logprobs` walks it level by level, asking for the
next-token distribution at each node it needs, for several contexts at once (the real and the
empty prompt share every request batch).

Two forms (DESIGN §4):

* ``"joint"`` (exact, the paper's): every node below the branching point is asked, so each label
  gets its unconstrained joint log-probability; the caller renormalises over the allowed labels.
* ``"trie"`` (cheap): probabilities are renormalised at every node over the children still allowed,
  so single-child nodes cost nothing; only branching nodes are asked.

Tokens shared by *all* allowed labels (the leading ``[`` or `` [``) contribute a common factor that
cancels in either renormalisation, so they are never asked for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import CapabilityError
from .protocol import Flow, Messages, Query, next_token_logprobs

Token = tuple[int, str]  # (id, piece)
Path = tuple[Token, ...]

__all__ = ["label_trie", "label_logprobs", "LabelScores"]


@dataclass(frozen=True)
class LabelScores:
    """Per label, in the order given: log-probability (unnormalised for ``joint``), and how many of
    them are upper bounds because a needed token was outside the endpoint's top-k."""

    logprobs: tuple[float, ...]
    upper_bounds: int


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


def label_logprobs(
    caps, contexts: Sequence[tuple[Messages, str]], labels: Sequence[Path], *, form: str = "joint",
    top: int = 20, cache: dict | None = None,
) -> Flow[list[LabelScores]]:
    """Log-probability of every label after each ``(messages, assistant_prefix)`` context."""
    cache = {} if cache is None else cache
    children = label_trie(labels)
    start: Path = ()
    while len(children.get(start, ())) == 1:  # common to every label: cancels, never asked
        start = start + (children[start][0],)
    score = [{start: 0.0} for _ in contexts]
    bounds = [0 for _ in contexts]
    frontier = [start]
    while frontier:
        asked = [n for n in frontier if n in children and (form == "joint" or len(children[n]) > 1)]
        queries = [Query(m, prefix + "".join(p for _, p in node), tuple(children[node]))
                   for m, prefix in contexts for node in asked]
        found = yield from _ask(caps, queries, top, cache)
        for c in range(len(contexts)):
            for a, node in enumerate(asked):
                got, floor = found[c * len(asked) + a]
                kids = children[node]
                values = [got.get(k, floor) for k in kids]
                bounds[c] += sum(k not in got for k in kids)
                if form == "trie":
                    norm = _logsumexp(values)
                    values = [v - norm for v in values]
                for kid, v in zip(kids, values):
                    score[c][node + (kid,)] = score[c][node] + v
            for node in frontier:
                if node in children and node not in asked:  # trie form, single child: probability 1
                    score[c][node + (children[node][0],)] = score[c][node]
        frontier = [node + (kid,) for node in frontier for kid in children.get(node, ())]
    return [LabelScores(tuple(s[label] for label in labels), b) for s, b in zip(score, bounds)]


def _ask(caps, queries: list[Query], top: int, cache: dict) -> Flow[list]:
    """Ask once at ``top``; re-ask those missing a wanted token at the endpoint's largest top-k."""
    if not queries:
        return []
    found = yield from next_token_logprobs(caps, queries, min(top, caps.max_top_logprobs), cache)
    retry = [i for i, (got, _) in enumerate(found) if len(got) < len(queries[i].want)]
    if retry and caps.max_top_logprobs > top:
        again = yield from next_token_logprobs(caps, [queries[i] for i in retry], caps.max_top_logprobs, cache)
        for i, answer in zip(retry, again):
            found[i] = answer
    return found


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))
