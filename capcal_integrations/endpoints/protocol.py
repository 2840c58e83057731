"""The wire protocol, written once and free of I/O.

Everything that talks to an endpoint is a generator (a :data:`Flow`) that *yields* a list of
:class:`Call` and *receives* the list of decoded JSON answers (or has an
:class:`~.errors.EndpointError` thrown into it). :mod:`.drivers` feeds these generators with a sync
or an async ``openai`` client, so the sync and async APIs are the same code by construction (the
shape of httpx's ``auth_flow``).

Here: reading next-token log-probabilities after an assistant prefix (:func:`next_token_logprobs`), by
whatever endpoint kind the probe chose (:mod:`.endpoints`: llama.cpp's templated prompt lists, vLLM's
token-id prompt lists, chat prefill); and the names every caller imports from here: the primitives
(:mod:`.calls`), the readers of answers (:mod:`.answers`), tokenizing, and the token-string transports of
hosted APIs (:func:`text_next_tokens`, :func:`generate`).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import (  # noqa: F401 - re-exported
    SPAN_SEPARATOR,
    Query,
    TokenLogprobs,
    generate,
    kind_of,
    span_ids,
    text_next_tokens,
    tokenize,
)
from .answers import Alternatives, Generated, parse_tokens, top_entries  # noqa: F401 - re-exported
from .answers import choices_of as _choices  # noqa: F401 - re-exported (tests/test_fuzz.py)
from .answers import template_of as _template_of  # noqa: F401 - re-exported (tests/test_fuzz.py)
from .answers import usage_of as usage_of  # re-exported: the drivers' and earlier callers' name
from .calls import (  # noqa: F401 - re-exported: every caller's name for them
    Call,
    EndpointState,
    Flow,
    Token,
    chat_messages,
    text_messages,
)


def next_token_logprobs(state: EndpointState, queries: Sequence[Query], top: int
                        ) -> Flow[list[tuple[TokenLogprobs, float]]]:
    """For each query: the wanted tokens found in the top-``top`` and the smallest logprob returned
    (an upper bound for any token not returned). Queries on the same messages share one request
    where the endpoint takes prompt lists."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    kind = kind_of(caps)
    choices = yield from kind.send(state, queries, top)
    return [kind.read(choice, q.want) for q, choice in zip(queries, choices)]
