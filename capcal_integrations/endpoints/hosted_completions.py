"""A hosted API with a plain ``/v1/completions`` (Together, Fireworks, DeepInfra, ...): text prompts,
rendered here in the model's format (``prompt="chatml"``, ...), with log-probabilities of token texts
(``Capabilities.text_completions``: the top-k; ``Capabilities.transport == ""``). Any prefix of a prompt
rendered here can be continued (the ``text`` route of :mod:`...textlabels`, :func:`text_next_tokens`); with
the server's own chat template, identifiers are read from answers, as on a hosted chat API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ..answers import Alternatives, completion_alternatives, first_choice
from ..calls import Call, EndpointState, Flow
from ..types import Capabilities
from .base import COMPLETIONS, Kind, entries, optional, readable, register, two_choices

__all__ = ["HOSTED_COMPLETIONS", "text_next_tokens", "detect"]


class HostedCompletions(Kind):
    name: ClassVar[str] = "hosted completions"

    def matches(self, caps: Capabilities) -> bool:
        return super().matches(caps) and bool(caps.text_completions)


HOSTED_COMPLETIONS = register(HostedCompletions())


def text_next_tokens(state: EndpointState, prompts: Sequence[str], top: int) -> Flow[list[Alternatives]]:
    """The top-``top`` next tokens after each text prompt, from a plain ``/v1/completions``
    (``Capabilities.text_completions``: no template, no tokenizer, no ids): one request with the prompts
    as a list where the endpoint takes lists (``prompt_lists``), else one request per prompt."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    body = {"model": caps.model, "max_tokens": 1, "logprobs": min(top, caps.text_completions), "temperature": 0}
    groups = [list(prompts)] if caps.prompt_lists else [[p] for p in prompts]
    answers = yield [Call("POST", COMPLETIONS, {**body, "prompt": g if caps.prompt_lists else g[0]}) for g in groups]
    return [alternatives for group, answer in zip(groups, answers)
            for alternatives in completion_alternatives(answer, len(group))]


def detect(model: str) -> Flow[tuple[int, bool]]:
    """The top-k of a ``/v1/completions`` that answers text prompts with log-probabilities (20, else 5
    as OpenAI's legacy completions allow), or 0; and whether it takes a list of prompts per request."""
    for k in (20, 5):
        body = {"model": model, "max_tokens": 1, "logprobs": k, "temperature": 0}
        answer = yield from optional(Call("POST", COMPLETIONS, {**body, "prompt": ["A B C", "1 2 3"]}))
        if answer is not None and two_choices(answer, by_id=False):
            return k, True
        answer = yield from optional(Call("POST", COMPLETIONS, {**body, "prompt": "A B C"}))
        if answer is not None and entries(readable(first_choice, answer)):
            return k, False
    return 0, False
