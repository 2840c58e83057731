"""Chat completions that continue a prefilled assistant message, read by token *text*, with no tokenizer:
Ollama's OpenAI-compatible API (``Capabilities.transport == "chat-text"``), and any endpoint whose chat
completions continue a final assistant message but which has no ``/tokenize``.

Tested against the documented dialect in :mod:`capcal_integrations.testing` only, never live (Ollama does
not install here). What it relies on, from ``ollama/ollama``'s ``openai/openai.go`` and ``docs/openai.md``:
``/v1/chat/completions`` takes ``logprobs`` and ``top_logprobs`` (since v0.12.11; more than 20 is refused
with a 400) and answers ``logprobs.content`` entries of token texts without ids; a trailing assistant message
is continued, no switch needed; ``/v1/models`` entries are ``owned_by`` the model's namespace, ``"library"``
for the library's models; there is no ``/tokenize``; its ``/v1/completions`` applies the chat template to a
text prompt (no raw prompts: Ollama's native ``/api/generate`` with ``raw: true`` has them, and is not used
here). So identifiers are read as on a hosted ``/v1/completions`` (the ``text`` route of
:mod:`...textlabels`: a walk over token texts), each read one chat completion whose assistant message is the
ranking prefix and the node's text, in the server's own chat template (``prompt="chat"`` only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .answers import Alternatives, completion_alternatives
from .base import CHAT, Kind, register
from .calls import Call, EndpointState, Flow, chat_messages, text_messages

__all__ = ["OLLAMA", "SERVER", "server_of"]

#: ``Capabilities.server`` of an Ollama server (the library's models are listed ``owned_by: library``).
SERVER = "ollama"


def server_of(entries: Sequence[Mapping[str, Any]]) -> str:
    """:data:`SERVER` when the model listing looks like Ollama's, else ``""``."""
    return SERVER if any(m.get("owned_by") == "library" for m in entries) else ""


class ChatText(Kind):
    name: ClassVar[str] = "chat prefill read by token text"
    transport: ClassVar[str] = "chat-text"
    prefill: ClassVar[bool] = True  # Capabilities.server is "ollama" only where the listing says so (server_of)
    costly_prompts: ClassVar[bool] = True

    def route(self, caps: Capabilities, prompt: str = "chat") -> str:
        """``text`` in the server's chat template; other formats need raw text completions, which it lacks."""
        return "text" if prompt == "chat" else super().route(caps, prompt)

    def text_context(self, state: EndpointState, messages: Prompt, prompt: str) -> Any:
        """The messages, their untrusted spans neutralised as text; the assistant prefix follows them."""
        return text_messages(state, messages, prompt)

    def next_tokens(self, state: EndpointState, reads: Sequence[tuple[Any, str]], top: int) -> Flow[list[Alternatives]]:
        """One chat completion per read, continuing the assistant message ``text`` after the messages."""
        caps = state.caps
        assert caps is not None, "probe the endpoint first"
        answers = yield [Call("POST", CHAT, {
            "model": caps.model, "messages": chat_messages(messages, text), "max_tokens": 1, "temperature": 0,
            "logprobs": True, "top_logprobs": min(top, caps.max_top_logprobs), **caps.chat_extra})
            for messages, text in reads]
        return [alternatives for answer in answers for alternatives in completion_alternatives(answer, 1)]


OLLAMA = register(ChatText())
