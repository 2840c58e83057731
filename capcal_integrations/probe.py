"""Find out, once per endpoint, what it can do: a :data:`~.protocol.Flow` of about seven small requests.

The probe picks the cheapest exact way to read next-token log-probabilities after an assistant
prefix (:attr:`~.types.Capabilities.transport`): llama.cpp's templated ``/v1/completions`` prompt lists,
vLLM's token-id prompt lists, else chat completions that continue a prefilled assistant message. Where
there is none (hosted APIs), it looks for a plain ``/v1/completions`` that takes text prompt lists
(``text_completions``). :func:`route` then says how a prompt format is read on this endpoint.
Optional routes that an endpoint lacks answer 400/404/405/422/501; :func:`optional` turns exactly
those into ``None``, and so is a malformed answer to an optional probe (logged: the feature is then
treated as missing). A malformed model listing is a :class:`~.errors.ResponseError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .answers import excerpt, first_choice, malformed, parse_tokens, top_entries
from .errors import CapabilityError, EndpointError, ResponseError
from .protocol import Call, EndpointState, Flow, chat_messages, template_call, tokenize_call
from .types import Capabilities

log = logging.getLogger(__name__)

__all__ = ["capabilities", "probe", "optional", "route", "ROUTES"]

_UNSUPPORTED = (400, 404, 405, 422, 501)
_PROBE_PREFIX = "A B C D E F G H I J K L M N O P Q R S T U V W X"
_CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}  # vLLM's prefill switch


def optional(call: Call) -> Flow[Any | None]:
    """The answer to ``call``, or ``None`` when the endpoint does not support it (an "unsupported"
    status or an unreadable answer). Any other failure propagates."""
    try:
        [answer] = yield [call]
    except EndpointError as err:
        if err.status in _UNSUPPORTED or isinstance(err, ResponseError):
            return None
        raise
    return answer


def capabilities(state: EndpointState) -> Flow[Capabilities]:
    """``state.caps``, probed on the endpoint's first use (a ranking's view finds what another probed)."""
    endpoint = state.shared or state
    if endpoint.caps is None:
        caps = yield from probe(state.model)
        endpoint.caps = endpoint.caps or caps  # a concurrent first call may have probed too: keep one
    state.caps = endpoint.caps
    return state.caps


def _readable(read: Any, *args: Any) -> Any:
    """What ``read`` makes of an optional probe's answer, or ``None`` when that answer is malformed."""
    try:
        return read(*args)
    except ResponseError as err:
        log.info("probe: %s; treated as unsupported", err)
        return None


def _entries(choice: Any) -> list:
    return _readable(top_entries, choice) or []


#: The largest values an endpoint may report (:func:`_count`): above them a report is not believed.
MAX_SLOTS = 4096
MAX_CONTEXT = 2**24  # tokens (16.8 M: ten times the longest context served today)
MAX_TOP_LIMIT = 100_000


def _count(value: Any, what: str = "", bound: int | None = None, body: Any = None) -> int | None:
    """A positive integer an optional field reports (a context size, a slot count), else None; a
    :class:`~.errors.ResponseError` naming the ``bound`` when it is above it.

    >>> _count(8), _count("8"), _count(0)
    (8, None, None)
    >>> _count(10**12, "total_slots", MAX_SLOTS)
    Traceback (most recent call last):
    ...
    capcal_integrations.errors.ResponseError: the endpoint reports total_slots = 1000000000000, above the bound of 4096
    """
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return None
    if bound is not None and value > bound:
        shown = str(value) if value < 10**30 else f"a {len(str(value))}-digit number"
        raise ResponseError(f"the endpoint reports {what} = {shown}, above the bound of {bound}",
                            body=excerpt(body))
    return value


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
    server = "llama.cpp" if any(m.get("owned_by") == "llamacpp" for m in entries) else ""

    tokenize = ""
    for kind in ("llamacpp", "vllm"):
        answer = yield from optional(tokenize_call(kind, model, "[10]"))
        if answer is not None and _readable(parse_tokens, answer):
            tokenize = kind
            break

    props = (yield from optional(Call("GET", "/props", root=True))) if server == "llama.cpp" else None
    props = props if isinstance(props, Mapping) else {}
    settings = props.get("default_generation_settings")
    mine = [m for m in entries if m.get("id") == model] or entries  # vLLM, OpenRouter and Together list the context
    context = (_count(settings.get("n_ctx"), "n_ctx", MAX_CONTEXT, props) if isinstance(settings, Mapping) else None
               ) or next((m[k] for m in mine for k in ("max_model_len", "context_length")
                          if _count(m.get(k), k, MAX_CONTEXT, m)), None)

    chat = yield from _probe_chat(model, 100 if server else 20)
    lists = (yield from _probe_completions(model, tokenize)) if chat.logprobs else Completions()
    if lists.transport == "token-completions":
        server = server or "vllm"
    text, text_lists = (0, False) if lists.transport else (yield from _probe_text_completions(model))
    caps = Capabilities(
        model=model, logprobs=chat.logprobs,
        max_top_logprobs=1000 if server == "llama.cpp" else max(lists.max_top_logprobs, chat.max_top_logprobs),
        transport=lists.transport or ("chat" if chat.prefill else ""), chat_extra=dict(chat.extra),
        tokenize=tokenize, template=bool(lists.transport), prompt_lists=bool(lists.transport) or text_lists,
        logprob_token_ids=lists.logprob_token_ids, context=context, server=server,
        slots=_count(props.get("total_slots"), "total_slots", MAX_SLOTS, props) or 0, text_completions=text,
        chat=chat.answers, weights=fingerprint(props, mine))
    log.info("probed endpoint: %s", caps)
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
    (``Options.prompt``); a :class:`~.errors.CapabilityError` when it cannot at all."""
    if caps.transport in ("completions", "token-completions") or (caps.transport == "chat" and prompt == "chat"):
        return "prefix"
    if caps.text_completions and prompt != "chat":
        return "text"
    if prompt != "chat":
        raise CapabilityError(f"prompt={prompt!r} is sent as text through /v1/completions, which this endpoint does "
                              "not offer with log-probabilities; use prompt='chat'", missing="text completions")
    if caps.logprobs or caps.chat:  # without log-probabilities only answers can be parsed: vanilla, psc
        return "generation"
    raise CapabilityError("the endpoint returns no log-probabilities (chat completions with logprobs/top_logprobs, "
                          "or /v1/completions with logprobs); every method needs them", missing="logprobs")


def _probe_text_completions(model: str) -> Flow[tuple[int, bool]]:
    """The top-k of a ``/v1/completions`` that answers text prompts with log-probabilities (20, else 5
    as OpenAI's legacy completions allow), or 0; and whether it takes a list of prompts per request."""
    for k in (20, 5):
        body = {"model": model, "max_tokens": 1, "logprobs": k, "temperature": 0}
        answer = yield from optional(Call("POST", "completions", {**body, "prompt": ["A B C", "1 2 3"]}))
        if answer is not None and _two_choices(answer, by_id=False):
            return k, True
        answer = yield from optional(Call("POST", "completions", {**body, "prompt": "A B C"}))
        if answer is not None and _entries(_readable(first_choice, answer)):
            return k, False
    return 0, False


@dataclass(frozen=True)
class Completions:
    """Whether ``/v1/completions`` takes the chat-templated prompt as a list of prompts, as text
    (llama.cpp: ``/apply-template``) or as token ids (vLLM: ``/tokenize`` with ``messages``); whether
    it returns the logprobs of given token ids (vLLM's ``logprob_token_ids``); and its top-k limit."""

    transport: str = ""  # "completions" | "token-completions" | ""
    logprob_token_ids: bool = False
    max_top_logprobs: int = 0


def _probe_completions(model: str, tokenize: str) -> Flow[Completions]:
    messages = (("user", "x"),)
    rendered = yield from optional(template_call(model, messages, tokens=False))
    if isinstance(rendered, Mapping) and isinstance(rendered.get("prompt"), str):
        answer = yield from optional(Call("POST", "completions", {
            "model": model, "prompt": ["A B C", "1 2 3"], "max_tokens": 1, "logprobs": 5, "temperature": 0}))
        return Completions("completions" if _two_choices(answer, by_id=False) else "")
    if tokenize != "vllm":
        return Completions()
    rendered = yield from optional(template_call(model, messages, tokens=True))
    ids = rendered.get("tokens") if isinstance(rendered, Mapping) else None
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        return Completions()
    body = {"model": model, "prompt": [ids, ids[:-1]], "max_tokens": 1, "temperature": 0,
            "return_tokens_as_token_ids": True}
    answer = yield from optional(Call("POST", "completions", {**body, "logprobs": 5}))
    if not _two_choices(answer, by_id=True):
        return Completions()
    wanted = sorted({ids[-1], ids[0]})
    answer = yield from optional(Call("POST", "completions", {**body, "logprobs": 1, "logprob_token_ids": wanted}))
    exact = _two_choices(answer, by_id=True) and all(
        set(wanted) <= {e[0] for e in _entries(c)} for c in answer["choices"])
    return Completions("token-completions", exact, (yield from _top_limit(model, ids)))


def _top_limit(model: str, ids: list[int]) -> Flow[int]:
    """The largest top-k the server returns: vLLM refuses more than its ``--max-logprobs`` (default
    20) with "... greater than max allowed: N"; a server that answers 1001 has enough for any re-ask."""
    try:
        yield [Call("POST", "completions", {"model": model, "prompt": [ids], "max_tokens": 1, "logprobs": 1001,
                                            "temperature": 0})]
    except EndpointError as err:
        if err.status not in _UNSUPPORTED:
            raise
        found = re.search(r"max allowed: (\d{1,30})\b", excerpt(err.body, 2000))
        return _count(int(found.group(1)), "a top-k limit", MAX_TOP_LIMIT, err.body) or 20 if found else 20
    return 1000


def _two_choices(answer: Any, *, by_id: bool) -> bool:
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not (isinstance(choices, list) and len(choices) == 2):
        return False
    entries = [_entries(c) for c in choices]
    return all(entries) and (not by_id or all(e[0] is not None for es in entries for e in es))


def _probe_chat(model: str, top: int) -> Flow[ChatSupport]:
    """Ask a chat completion to continue "A B ... X" from a prefilled assistant message: "Y" first
    means the prefill was continued. OpenAI and vLLM cap ``top_logprobs`` at 20 by default, so a
    refused larger ``top`` is retried at 20."""
    base = {"model": model, "max_tokens": 1, "temperature": 0, "logprobs": True,
            "messages": chat_messages((("user", "Continue the sequence."),), _PROBE_PREFIX)}
    answered = ChatSupport()
    for extra in ({}, _CONTINUE):
        answer = None
        for k in dict.fromkeys((top, 20)):
            answer = yield from optional(Call("POST", "chat/completions", {**base, "top_logprobs": k, **extra}))
            if answer is not None:
                top = k
                break
        if not isinstance(answer, Mapping):
            continue
        entries = _entries(_readable(first_choice, answer))
        if not entries:
            return ChatSupport(answers=True)
        if max(entries, key=lambda e: e[2])[1].strip() == "Y":
            return ChatSupport(True, top, True, extra, True)
        answered = ChatSupport(True, top, answers=True)
    if not answered.answers:  # log-probabilities refused or absent: do plain answers come back?
        answer = yield from optional(Call("POST", "chat/completions", {
            "model": model, "max_tokens": 1, "messages": chat_messages((("user", "Say yes."),))}))
        answered = ChatSupport(answers=isinstance(answer, Mapping) and bool(answer.get("choices")))
    return answered
