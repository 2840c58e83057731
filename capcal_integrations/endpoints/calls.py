"""The wire protocol's primitives, below everything that speaks it: one HTTP request (:class:`Call`; the
OpenAI routes it may name, :data:`OPENAI_ROUTES`), a :data:`Flow` (a generator that yields lists of calls and
receives their decoded answers), the per-endpoint state (:class:`EndpointState`), and how messages and
untrusted text go as chat messages.

Free of I/O. Everything that talks to an endpoint is a :data:`Flow` that *yields* a list of :class:`Call`
and *receives* the list of decoded JSON answers (or has an :class:`~capcal_integrations.errors.EndpointError`
thrown into it); :mod:`~capcal_integrations.transport.drivers` feeds it with a sync or an async ``openai``
client, so the sync and async APIs are the same code by construction (the shape of httpx's ``auth_flow``).
The endpoint kinds build on these primitives; what they are asked through is
:func:`~capcal_integrations.endpoints.next_token_logprobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..prompts.files import declared_tokens
from ..prompts.render import Messages
from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .caches import RankingTemplates, TemplateCache
from .slots import SlotPins

__all__ = ["Call", "Flow", "Token", "EndpointState", "SLOT", "COMPLETIONS", "CHAT", "OPENAI_ROUTES", "chat_messages",
           "text_messages"]

#: llama.cpp's field that pins a request to one of its slots (the slot that holds the prompt's prefix).
SLOT = "id_slot"
#: The OpenAI routes, relative to ``base_url``; both document a ``user`` field in the body.
COMPLETIONS, CHAT = "completions", "chat/completions"
OPENAI_ROUTES = (COMPLETIONS, CHAT)

T = TypeVar("T")
Token = tuple[int, str]  # (id, piece)


@dataclass(frozen=True)
class Call:
    """One HTTP request. ``path`` is relative to ``base_url`` unless ``root`` (then relative to the
    server root, for llama.cpp/vLLM extras such as ``/tokenize``)."""

    method: str
    path: str
    body: Mapping[str, Any] | None = None
    root: bool = False

    @property
    def slot(self) -> int | None:
        """The llama.cpp slot the request is pinned to (its body's :data:`SLOT`), or None."""
        return self.body.get(SLOT) if isinstance(self.body, Mapping) else None


Flow = Generator[list[Call], list[Any], T]

@dataclass
class EndpointState:
    """What one (endpoint, model) is known to do, probed once, and what is cached about it across
    calls: the tokens of each identifier spelling, rendered chat templates and llama.cpp slot pins.
    Shared by a reranker and its ``with_options`` copies.

    Each ranking runs on :meth:`for_ranking`, a view that shares all of this but keeps its rendered
    prompts to itself (:mod:`.caches`): they are dropped when the ranking ends, and at most
    :data:`~.caches.TEMPLATE_CACHE_SIZE` entries outlive it in the endpoint's ``templates``."""

    model: str | None = None
    caps: Capabilities | None = None
    label_tokens: dict[str, tuple[Token, ...]] = field(default_factory=dict)
    templates: MutableMapping[Any, Any] = field(default_factory=TemplateCache)  # rendered skeletons, prompts as sent (text, ids)
    declared: tuple[str, ...] = ()  # control tokens the endpoint showed (vLLM's template): neutralised in text
    controls: frozenset[int] | None = None  # vLLM, SGLang: the served tokenizer's control tokens (.endpoints.controls)
    tested: set[int] = field(default_factory=set)  # the token ids tested for being control tokens (bounded there)
    slots: SlotPins = field(default_factory=SlotPins)
    announced: set[tuple[str, str]] = field(default_factory=set)  # what was logged once (method auto's choice)
    content: dict[Any, Any] = field(default_factory=dict)  # content-check decisions per model, prompt, placeholder
    decisions: Any = field(default=None, repr=False, compare=False)  # the reranker's decision store (saved_decisions.Store)
    # a view's own, never the endpoint's:
    routed: bool = False  # requests may reach more than one server (Options.routed; see .routing)
    background: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)  # reading runner
    shared: EndpointState | None = field(default=None, repr=False, compare=False)  # the endpoint's state

    def for_ranking(self, routed: bool = False, background: Callable[[Any], None] | None = None) -> EndpointState:
        """A view for one ranking: the endpoint's state, with the ranking's own rendered prompts over
        the endpoint's bounded template cache. ``routed``: no slot pins, llama.cpp prompts as ids only.
        ``background``: where the content check hands a list to read off the request path (the reranker's
        runner, called with a :class:`~capcal_integrations.content_check.attempts.Pending`), or None:
        read inside the ranking."""
        endpoint = self.shared or self
        return replace(endpoint, templates=RankingTemplates(endpoint.templates), routed=routed, background=background,
                       shared=endpoint)

    def learned(self, **facts: Any) -> None:
        """Record what this view learned about the endpoint (its control tokens, ...) on the view and on the
        endpoint, so that the next ranking's view starts with it (every other assignment is the view's own)."""
        for target in (self,) if self.shared is None else (self, self.shared):
            for name, value in facts.items():
                setattr(target, name, value)


def chat_messages(messages: Messages, prefix: str | None = None) -> list[dict[str, str]]:
    out = [{"role": role, "content": content} for role, content in messages]
    if prefix is not None:
        out.append({"role": "assistant", "content": prefix})
    return out

def text_messages(state: EndpointState, prompt: Prompt, style: str = "chat") -> Messages:
    """The one way untrusted text is sent as text (chat transports, vLLM, hosted APIs): each span
    neutralised (:func:`~.untrusted.neutralise`) against the known families, the control tokens this
    endpoint declared (``state.declared``) and, for a client-side format read from a model's
    ``tokenizer_config.json``, the special tokens it declares."""
    return prompt.text(state.declared + declared_tokens(style))

