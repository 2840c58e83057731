"""A hosted API with a plain ``/v1/completions`` (Together, Fireworks, DeepInfra, ...): text prompts,
rendered here in the model's format (``prompt="chatml"``, ...), with log-probabilities of token texts
(``Capabilities.text_completions``: the top-k; ``Capabilities.transport == ""``). Any prefix of a prompt
rendered here can be continued (the ``text`` route of :mod:`...textlabels`, :func:`~.base.text_next_tokens`,
re-exported here); with the server's own chat template, identifiers are read from answers, as on a hosted chat API.
"""

from __future__ import annotations

from typing import ClassVar

from ..types import Capabilities
from .answers import first_choice
from .base import COMPLETIONS, Kind, entries, optional, readable, register, text_next_tokens, two_choices
from .calls import Call, Flow

__all__ = ["HOSTED_COMPLETIONS", "text_next_tokens", "detect"]


class HostedCompletions(Kind):
    name: ClassVar[str] = "hosted completions"

    def matches(self, caps: Capabilities) -> bool:
        return super().matches(caps) and bool(caps.text_completions)


HOSTED_COMPLETIONS = register(HostedCompletions())


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
