"""A hosted chat API (OpenAI, Azure OpenAI, OpenRouter, ...): chat completions with ``top_logprobs`` (at
most 20), token texts without ids, no tokenizer, no prefix continued (``Capabilities.transport == ""``).
Identifiers are read from the model's own answer (:func:`generate`, the ``generation`` route of
:mod:`...textlabels`); where chat completions return no log-probabilities, only answers can be parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ..prompts.render import Messages
from ..types import Capabilities
from .answers import Generated, generated
from .base import CHAT, Kind, register
from .calls import Call, EndpointState, Flow, chat_messages, text_messages

__all__ = ["HOSTED_CHAT", "generate"]


class HostedChat(Kind):
    name: ClassVar[str] = "hosted chat"

    def matches(self, caps: Capabilities) -> bool:
        return super().matches(caps) and not caps.text_completions


HOSTED_CHAT = register(HostedChat())


def generate(state: EndpointState, conversations: Sequence[Messages], *, max_tokens: int, top: int
             ) -> Flow[list[Generated]]:
    """An ordinary greedy chat completion per conversation, with the ``top`` alternatives of every
    generated token (hosted APIs cap ``top_logprobs`` at 20). Where the endpoint returns no
    log-probabilities, the answer's text is one position without alternatives."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    scored = {"logprobs": True, "top_logprobs": min(top, caps.max_top_logprobs)} if caps.logprobs else {}
    answers = yield [Call("POST", CHAT, {
        "model": caps.model, "messages": chat_messages(text_messages(state, m)), "max_tokens": max_tokens,
        "temperature": 0, **scored})
        for m in conversations]
    return [generated(answer, caps.logprobs) for answer in answers]
