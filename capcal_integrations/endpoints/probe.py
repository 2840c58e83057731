"""Find out, once per endpoint, what it can do: a :data:`~capcal_integrations.endpoints.calls.Flow` of about seven small requests.

The probe lists the models, finds the server's ``/tokenize`` dialect and ``/props``, and lets the endpoint
kinds (:func:`~.endpoints.choose`) pick the cheapest exact way to read next-token log-probabilities after
an assistant prefix: llama.cpp's templated ``/v1/completions`` prompt lists, vLLM's token-id prompt lists,
else chat completions that continue a prefilled assistant message; where there is none (hosted APIs), a
plain ``/v1/completions`` that takes text prompts, or the model's own answers. The kind it picked is
:attr:`~.types.Capabilities.kind`; :func:`route` says how a prompt format is read on this endpoint.
Optional routes that an endpoint lacks answer 400/404/405/422/501; :func:`optional` turns exactly
those into ``None``, and so is a malformed answer to an optional probe (logged: the feature is then
treated as missing). A malformed model listing is a :class:`~.errors.ResponseError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from ..errors import CapabilityError
from ..types import Capabilities
from . import choose, kind_of, server_facts
from .answers import malformed
from .base import MAX_CONTEXT, MAX_SLOTS, MAX_TOP_LIMIT, optional  # noqa: F401 - re-exported
from .base import count as _count
from .calls import Call, EndpointState, Flow

log = logging.getLogger(__name__)

__all__ = ["capabilities", "probe", "optional", "route", "ROUTES"]


def capabilities(state: EndpointState) -> Flow[Capabilities]:
    """``state.caps``, probed on the endpoint's first use (a ranking's view finds what another probed)."""
    endpoint = state.shared or state
    if endpoint.caps is None:
        caps = yield from probe(state.model)
        endpoint.caps = endpoint.caps or caps  # a concurrent first call may have probed too: keep one
    state.caps = endpoint.caps
    return state.caps


def probe(model: str | None = None) -> Flow[Capabilities]:
    """Probe the endpoint (see the module docstring)."""
    [listing] = yield [Call("GET", "models")]
    data = listing.get("data") if isinstance(listing, Mapping) else None
    if not isinstance(data, list) and model is None:
        raise malformed("the /v1/models answer has no 'data' list (pass model=... to skip it)", listing)
    entries = [m for m in data if isinstance(m, Mapping)] if isinstance(data, list) else []
    if model is None:
        if not entries:
            raise CapabilityError("the endpoint lists no models; pass model=...", missing="models")
        model = entries[0].get("id")
        if not isinstance(model, str) or not model:
            raise malformed("the first model listed has no 'id' (pass model=... to skip it)", listing)
    server, tokenize, props = yield from server_facts(model, entries)
    settings = props.get("default_generation_settings")
    mine = [m for m in entries if m.get("id") == model] or entries  # vLLM, OpenRouter and Together list the context
    context = (_count(settings.get("n_ctx"), "n_ctx", MAX_CONTEXT, props) if isinstance(settings, Mapping) else None
               ) or next((m[k] for m in mine for k in ("max_model_len", "context_length")
                          if _count(m.get(k), k, MAX_CONTEXT, m)), None)
    found = yield from choose(model, server, tokenize)
    caps = Capabilities(model=model, context=context, slots=_count(props.get("total_slots"), "total_slots", MAX_SLOTS,
                                                                    props) or 0, weights=fingerprint(props, mine), **found)
    log.info("probed endpoint: %s (%s)", caps, caps.kind.name)
    return caps


def fingerprint(props: Mapping[str, Any], listed: list[Mapping[str, Any]]) -> str:
    """A digest of what the server reports about its weights, beyond the served name: llama.cpp's model path
    and its ``/v1/models`` metadata (size, parameters, vocabulary, training context), vLLM's ``root`` and
    ``max_model_len``. Two servers of different weights under one name differ here; ``""`` when the server
    reports nothing (hosted APIs: the name is all there is).

    >>> fingerprint({"model_path": "/m/0.5b.gguf"}, [{"meta": {"size": 491}}]) != fingerprint({"model_path": "/m/1.5b.gguf"}, [])
    True
    >>> fingerprint({}, [{"id": "x"}])
    ''
    """
    facts = {"model_path": props.get("model_path")}
    entry = listed[0] if listed else {}
    meta = entry.get("meta")
    if isinstance(meta, Mapping):
        facts.update({f"meta.{k}": meta.get(k) for k in ("size", "n_params", "n_vocab", "n_ctx_train", "n_embd")})
    facts.update({k: entry.get(k) for k in ("root", "max_model_len", "parent")})
    known = {k: v for k, v in facts.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool) and v != ""}
    if not known:
        return ""
    return "sha256:" + hashlib.sha256(json.dumps(known, sort_keys=True).encode()).hexdigest()[:16]


#: How identifier probabilities are read (:func:`route`): after any assistant prefix in the server's chat
#: template (``prefix``), after any prefix in a prompt rendered here (``text``), or from the model's
#: own answer, first identifier only (``generation``).
ROUTES = ("prefix", "text", "generation")


def route(caps: Capabilities, prompt: str = "chat") -> str:
    """How this endpoint reads identifier probabilities for prompts in format ``prompt``
    (``Options.prompt``); a :class:`~.errors.CapabilityError` when it cannot at all
    (:meth:`~.endpoints.base.Kind.route`)."""
    return kind_of(caps).route(caps, prompt)
