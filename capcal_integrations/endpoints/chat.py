"""Chat completions that continue a prefilled assistant message (``Capabilities.transport == "chat"``): one
request per prefix, the prefix sent as text (so its tokens' pieces must be text), the server's chat template
only. What the probe learns of chat completions (:func:`detect`) serves every kind: whether they return
log-probabilities and how many alternatives, whether they answer at all, and whether (and with which extra
body fields: vLLM's ``continue_final_message``) a final assistant message is continued.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .answers import first_choice
from .base import CHAT, Kind, Query, entries, optional, readable, register
from .calls import Call, EndpointState, Flow, chat_messages, text_messages
from .controls import learn_texts

__all__ = ["CHAT_PREFILL", "ChatSupport", "detect", "CONTINUE"]

#: vLLM's (and SGLang's) switch that continues the final assistant message instead of opening a new one.
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}
_PROBE_PREFIX = "A B C D E F G H I J K L M N O P Q R S T U V W X"


class ChatPrefill(Kind):
    name: ClassVar[str] = "chat prefill"
    transport: ClassVar[str] = "chat"
    prefill: ClassVar[bool] = True
    prefix_as_text: ClassVar[bool] = True
    costly_prompts: ClassVar[bool] = True  # a chat request per prompt, each prompt's whole text sent and tokenized

    def prepare(self, state: EndpointState, texts: Sequence[str] = ()) -> Flow[None]:
        """On a server with vLLM's or SGLang's tokenizer: the control tokens of its template and of ``texts``
        (:func:`~.controls.learn_texts`), neutralised in the text sent; elsewhere the deny-list alone."""
        if state.caps is not None:
            yield from learn_texts(state, state.caps, texts)

    def send(self, state: EndpointState, queries: Sequence[Query], top: int) -> Flow[list[Any]]:
        caps = state.caps
        assert caps is not None, "probe the endpoint first"
        if any(q.render != "chat" for q in queries):
            return (yield from super().send(state, queries, top))
        answers = yield [Call("POST", CHAT, {
            "model": caps.model, "messages": chat_messages(text_messages(state, q.messages), q.text), "max_tokens": 1,
            "temperature": 0, "logprobs": True, "top_logprobs": top, **caps.chat_extra}) for q in queries]
        return [first_choice(a) for a in answers]


CHAT_PREFILL = register(ChatPrefill())


@dataclass(frozen=True)
class ChatSupport:
    """What chat completions offer: log-probabilities, how many alternatives per position, whether
    (and with which extra body fields) a final assistant message is continued, and whether they answer
    at all (with or without log-probabilities)."""

    logprobs: bool = False
    max_top_logprobs: int = 0
    prefill: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    answers: bool = False


def detect(model: str, top: int) -> Flow[ChatSupport]:
    """Ask a chat completion to continue "A B ... X" from a prefilled assistant message: "Y" first
    means the prefill was continued. OpenAI and vLLM cap ``top_logprobs`` at 20 by default, so a
    refused larger ``top`` is retried at 20."""
    base = {"model": model, "max_tokens": 1, "temperature": 0, "logprobs": True,
            "messages": chat_messages((("user", "Continue the sequence."),), _PROBE_PREFIX)}
    answered = ChatSupport()
    for extra in ({}, CONTINUE):
        answer = None
        for k in dict.fromkeys((top, 20)):
            answer = yield from optional(Call("POST", CHAT, {**base, "top_logprobs": k, **extra}))
            if answer is not None:
                top = k
                break
        if not isinstance(answer, Mapping):
            continue
        found = entries(readable(first_choice, answer))
        if not found:
            return ChatSupport(answers=True)
        if max(found, key=lambda e: e[2])[1].strip() == "Y":
            return ChatSupport(True, top, True, extra, True)
        answered = ChatSupport(True, top, answers=True)
    if not answered.answers:  # log-probabilities refused or absent: do plain answers come back?
        answer = yield from optional(Call("POST", CHAT, {
            "model": model, "max_tokens": 1, "messages": chat_messages((("user", "Say yes."),))}))
        answered = ChatSupport(answers=isinstance(answer, Mapping) and bool(answer.get("choices")))
    return answered
