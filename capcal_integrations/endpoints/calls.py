"""The wire protocol's primitives, below everything that speaks it: one HTTP request (:class:`Call`), a
:data:`Flow` (a generator that yields lists of calls and receives their decoded answers), the per-endpoint
state (:class:`EndpointState`), and how messages and untrusted text go as chat messages.

Free of I/O, like :mod:`.protocol`, which re-exports all of it (callers import it from there). They live
apart so that the endpoint kinds (:mod:`.endpoints`) and :mod:`.protocol`, which calls them, can both build
on them without importing each other.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..prompts.files import declared_tokens
from ..prompts.render import Messages
from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .caches import RankingTemplates, TemplateCache
from .slots import SlotPins

__all__ = ["Call", "Flow", "Token", "EndpointState", "chat_messages", "text_messages"]

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
    routed: bool = False  # a view's: requests may reach more than one server (Options.routed; see .routing)
    shared: EndpointState | None = field(default=None, repr=False, compare=False)  # a view's endpoint state

    def for_ranking(self, routed: bool = False) -> EndpointState:
        """A view for one ranking: the endpoint's state, with the ranking's own rendered prompts over
        the endpoint's bounded template cache. ``routed``: no slot pins, llama.cpp prompts as ids only."""
        endpoint = self.shared or self
        return replace(endpoint, templates=RankingTemplates(endpoint.templates), routed=routed, shared=endpoint)

    def __setattr__(self, name: str, value: Any) -> None:
        # what a view learns about the endpoint (the probed capabilities, ...) is the endpoint's
        endpoint = self.__dict__.get("shared")
        if endpoint is not None and name not in ("templates", "routed"):
            setattr(endpoint, name, value)
        object.__setattr__(self, name, value)


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

