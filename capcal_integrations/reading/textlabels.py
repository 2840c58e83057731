"""Identifier probabilities read from token *strings*: for endpoints with no tokenizer and no token ids.

Hosted APIs return, per position, the text of the top tokens and their log-probabilities, nothing
else. An identifier's probability is then read by walking its spelling through those strings: a
*node* is the text written so far after the prefix (``""``, ``"["``, ``"[1"``), its *read* is the
top-k alternatives at that point, and an alternative extends the node by its text. Whatever the
tokenizer does (``[`` ``1`` ``2`` ``]``, or ``[12``, or ``12]>``), the label ``[12]`` is reached by the
alternatives whose texts spell it, and :func:`score_texts` sums the paths that reach it.

Two ways to get reads:

* :func:`text_label_logprobs` (``/v1/completions`` with text prompts, or chat completions continuing a
  prefilled assistant message where there is no tokenizer): any node can be read (the prompt, the prefix
  and the node's text), so the walk reads every node it needs, breadth first, all contexts
  of a step in one request per level;
* :func:`generated_label_logprobs` (chat completions without prefill): only the nodes along the
  model's own greedy answer are read, one request per context. A node the answer did not pass
  through and that several identifiers share (``[1`` for ``[1]``, ``[10]``..``[19]`` when the
  tokenizer splits numbers into digits) leaves those identifiers *estimated* (see :func:`_value`).

A label missing from a read's top-k takes the read's smallest log-probability (an upper bound), as in
:mod:`.labels`. A node only one allowed label can pass through counts as that label (its closing
``]`` is not read); with ``probability="trie"`` the text walk reads only nodes several labels share.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..endpoints import generate, kind_of
from ..endpoints.answers import Alternatives, Generated
from ..endpoints.calls import EndpointState, Flow
from ..errors import ResponseError
from ..prompts.render import Messages
from .labels import LabelScores, logsumexp

__all__ = ["score_texts", "nodes_to_read", "text_label_logprobs", "generated_label_logprobs", "path_reads",
           "parse_ranking"]

Reads = Mapping[str, Alternatives]  # node text -> the alternatives read there


def _consistent(text: str, label: str) -> bool:
    """Whether ``text`` is on the way to ``label`` or spells it whole (and perhaps what follows it)."""
    return label.startswith(text) or text.startswith(label)


def score_texts(labels: Sequence[str], reads: Reads, start: str = "", *, form: str = "joint",
                strip: bool = False) -> LabelScores:
    """Each label's log-probability from ``start`` (its text must begin with ``start``), summed over the
    read paths that spell it: ``joint`` (each path's log-probabilities added), or ``trie`` (each read
    renormalised over its alternatives that lead to an allowed label, as :mod:`.labels` does). ``strip``
    drops leading whitespace of the alternatives read at ``start`` (a generated answer may begin
    ``" [4]"``). A label with no fully read path is estimated (see :func:`_value`: an upper bound, or
    the floor of a read) and counted in ``upper_bounds``.

    >>> reads = {"": (("[", math.log(.9)), ("x", math.log(.1))),
    ...          "[": (("1", math.log(.5)), ("2", math.log(.3)), ("3", math.log(.1)))}
    >>> s = score_texts(["[1]", "[2]", "[3]", "[10]", "[4]"], reads)
    >>> [round(math.exp(v), 3) for v in s.logprobs], s.upper_bounds  # [1] and [10] share the unread "[1"
    ([0.45, 0.27, 0.09, 0.09, 0.09], 3)
    >>> [round(math.exp(v), 3) for v in score_texts(["[1]", "[2]", "[3]"], reads, form="trie").logprobs]
    [0.556, 0.333, 0.111]
    """
    out, bounds = [], 0
    for label in labels:
        exact, estimate = _value(label, start, reads, labels, form, strip)
        out.append(exact if exact is not None else estimate if estimate is not None else -math.inf)
        bounds += exact is None
    return LabelScores(tuple(out), bounds)


def _value(label: str, node: str, reads: Reads, labels: Sequence[str], form: str, strip: bool
           ) -> tuple[float | None, float | None]:
    """(log-probability over fully read paths or None, estimate or None) of ``label``'s rest from ``node``.

    A node not read counts whole for the one label that passes through it (its closing ``]`` is not
    read: the trie form's factor 1). When several do (``[1`` of ``[1]`` and ``[10]``), the shortest of
    them (``[1]``, the node closed) is estimated by the node's probability, an upper bound; the others
    by the floor of the read above (None here). A read without alternatives tells nothing: it counts as
    not read (else every label below it would be -inf, and their renormalisation NaN)."""
    read = reads.get(node) or None
    sharing = [other for other in labels if other.startswith(node)]
    if read is None:
        if len(sharing) == 1:
            return 0.0, 0.0
        return None, (0.0 if len(label) == min(map(len, sharing)) else None)
    texts = [(node + (piece.lstrip() if strip and node == "" else piece), logprob) for piece, logprob in read]
    texts = [(t, v) for t, v in texts if len(t) > len(node)]
    floor = min((v for _, v in read), default=-math.inf)
    norm = 0.0
    if form == "trie":  # renormalise over what leads to an allowed label; one floor per label nothing leads to
        leads = [(t, v) for t, v in texts if any(_consistent(t, o) for o in sharing)]
        unreached = sum(not any(_consistent(t, o) for t, _ in leads) for o in sharing)
        norm = logsumexp([v for _, v in leads] + [floor] * unreached)
    exact, estimate = [], []
    for text, logprob in texts:
        if text.startswith(label):  # spelled whole (whatever follows belongs to the next step)
            exact.append(logprob - norm)
        elif label.startswith(text):
            rest, rest_estimate = _value(label, text, reads, labels, form, False)
            if rest is not None:
                exact.append(logprob - norm + rest)
            elif rest_estimate is not None:
                estimate.append(logprob - norm + rest_estimate)
    if exact:
        return logsumexp(exact), None
    return None, max(estimate) if estimate else floor - norm


def nodes_to_read(labels: Sequence[str], reads: Reads, form: str = "joint") -> list[str]:
    """The unread nodes the reads lead to that a label passes through (``joint``), or that several
    labels share (``trie``).

    >>> nodes_to_read(["[1]", "[10]", "[2]"], {"[": (("1", -0.5), ("2", -1.0), ("x", -3.0))})
    ['[1', '[2']
    >>> nodes_to_read(["[1]", "[10]", "[2]"], {"[": (("1", -0.5), ("2", -1.0))}, "trie")
    ['[1']
    """
    need = 1 if form == "joint" else 2
    found = {node + piece for node, read in reads.items() for piece, _ in read if piece}
    return sorted(t for t in found - set(reads) if sum(label.startswith(t) and label != t for label in labels) >= need)


def text_label_logprobs(state: EndpointState, prompts: Sequence[Any], labels: Sequence[str], *, prefix: str = "",
                        form: str = "joint", top: int = 20, shared: bool = False) -> Flow[list[LabelScores]]:
    """Every label's log-probability after each prompt and the assistant ``prefix``, read breadth first
    through the endpoint kind's :meth:`~.endpoints.base.Kind.next_tokens` (a text prompt for
    ``/v1/completions``, or chat messages continued by a prefilled assistant message): one request per
    level of the walk for all prompts. The text every label begins with is not read unless ``shared``."""
    start = "" if shared else os.path.commonprefix(list(labels))
    reads: list[dict[str, Alternatives]] = [{} for _ in prompts]
    frontier = [(c, start) for c in range(len(prompts))]
    while frontier:
        answers = yield from kind_of(state.caps).next_tokens(state, [(prompts[c], prefix + node) for c, node in frontier],
                                                             top)
        for (c, node), answer in zip(frontier, answers):
            reads[c][node] = answer
        frontier = [(c, node) for c in range(len(prompts)) for node in nodes_to_read(labels, reads[c], form)]
    return [score_texts(labels, r, start, form=form) for r in reads]


def path_reads(generated: Generated, labels: Sequence[str]) -> tuple[dict[str, Alternatives], str]:
    """The reads along a generated answer from its first token that begins an identifier (its text,
    stripped, starts a label or spells one): node ``""`` there, then the text generated since. Also
    the whole generated text. Tokens before it (a preamble, or junk such as ``[]``) are skipped: the
    distribution read is then the first identifier's *after* them.

    >>> g = (("[]", ()), (" >", ()), (" [", ((" [", -0.1),)), ("4", (("4", -0.2), ("1", -2.0))), ("]", (("]", -0.01),)))
    >>> reads, text = path_reads(g, ["[1]", "[4]"])
    >>> sorted(reads), text
    (['', '[', '[4'], '[] > [4]')
    """
    text = "".join(token for token, _ in generated)

    def begins(token: str) -> bool:
        t = token.lstrip()
        return bool(t) and any(_consistent(t, label) for label in labels)

    start = next((i for i, (token, _) in enumerate(generated) if begins(token)), None)
    if start is None:
        return {}, text
    reads, node = {}, ""
    for k, (token, alternatives) in enumerate(generated[start:]):
        reads[node] = alternatives
        node += token.lstrip() if k == 0 else token
    return reads, text


def generated_label_logprobs(state: EndpointState, conversations: Sequence[Messages], labels: Sequence[str], *,
                             top: int = 20) -> Flow[list[LabelScores]]:
    """Every label's log-probability as the first identifier of the model's answer to each
    conversation, read along its own greedy answer (one chat completion each).
    Always the ``trie`` form: the joint form needs every identifier's closing ``]``, which an answer
    reads only for its own."""
    answers = yield from generate(state, conversations, max_tokens=_ANSWER_TOKENS, top=top)
    out = []
    for answer in answers:
        reads, text = path_reads(answer, labels)
        if not reads:
            raise ResponseError(f"the model's answer names no identifier in its first {_ANSWER_TOKENS} tokens, so "
                                f"there is no first-identifier distribution to read: {text!r}", body=text)
        if not reads[""]:
            raise ResponseError("the answer carries no top log-probabilities where its first identifier begins, so "
                                f"there is no first-identifier distribution to read: {text!r}", body=text)
        out.append(score_texts(labels, reads, form="trie", strip=True))
    return out


#: Tokens generated to read the first identifier: room for a short preamble ("Sure! The ranking is:").
_ANSWER_TOKENS = 24


#: Exactly an identifier as the prompt spells it: ``[7]``, not ``[ 7 ]``, ``[7 ]`` or ``［7］`` (look-alikes a
#: passage could have planted are cleaned from the prompt, and are not read from the answer either).
_IDENTIFIER = re.compile(r"\[([0-9]{1,3}|[A-Za-z])\]")


def parse_ranking(text: str, labels: Sequence[str]) -> tuple[list[int], int]:
    """The label indices in the order the answer names them (first mention wins; unknown
    identifiers are skipped), then the labels it left out in their given order; and how many were
    left out.

    >>> parse_ranking("[2] > [4] > [2] > [9] > [1]", ["[1]", "[2]", "[3]", "[4]"])
    ([1, 3, 0, 2], 1)
    >>> parse_ranking("[ 3 ] > ［2］ > [4] > [1 ]", ["[1]", "[2]", "[3]", "[4]"])
    ([3, 0, 1, 2], 3)
    """
    index = {label: i for i, label in enumerate(labels)}
    order = list(dict.fromkeys(index[f"[{m}]"] for m in _IDENTIFIER.findall(text) if f"[{m}]" in index))
    named = set(order)
    missing = [i for i in range(len(labels)) if i not in named]
    return order + missing, len(missing)
