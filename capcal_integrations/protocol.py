"""The wire protocol, written once and free of I/O.

Everything that talks to an endpoint is a generator that *yields* a list of :class:`Call` and
*receives* the list of decoded JSON answers (or has an :class:`~.errors.EndpointError` thrown into
it). :mod:`.drivers` feeds these generators with a sync or an async ``openai`` client, so the sync
and async APIs are the same code by construction (the shape of httpx's ``auth_flow``).

Here: probing what an endpoint can do, tokenizing, and reading next-token log-probabilities after an
assistant prefix, through llama.cpp's templated ``/v1/completions`` prompt lists or through chat
completions that continue a prefilled assistant message; both logprob shapes (the ``content`` list
and the legacy ``top_logprobs`` dicts) are parsed.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import CapabilityError, EndpointError, ResponseError
from .types import Capabilities, Usage

log = logging.getLogger(__name__)

T = TypeVar("T")
Messages = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Call:
    """One HTTP request. ``path`` is relative to ``base_url`` unless ``root`` (then relative to the
    server root, for llama.cpp/vLLM extras such as ``/tokenize``)."""

    method: str
    path: str
    body: Mapping[str, Any] | None = None
    root: bool = False


Flow = Generator[list[Call], list[Any], T]


@dataclass(frozen=True)
class Query:
    """Next-token log-probabilities wanted after ``messages`` + assistant text ``prefix``."""

    messages: Messages
    prefix: str
    want: tuple[tuple[int, str], ...]  # (token id, piece) pairs whose log-probabilities are needed


TokenLogprobs = dict[tuple[int, str], float]  # wanted token -> logprob (missing = not in the top-k)

_PROBE_PREFIX = "A B C D E F G H I J K L M N O P Q R S T U V W X"
_UNSUPPORTED = (400, 404, 405, 422, 501)


def _unsupported(err: EndpointError) -> bool:
    return err.status in _UNSUPPORTED or isinstance(err, ResponseError)


def chat_messages(messages: Messages, prefix: str | None = None) -> list[dict[str, str]]:
    out = [{"role": role, "content": content} for role, content in messages]
    if prefix is not None:
        out.append({"role": "assistant", "content": prefix})
    return out


def usage_of(answer: Any) -> Usage:
    """Token counts a server reported in one answer (zeros when it reported none)."""
    usage = answer.get("usage") if isinstance(answer, Mapping) else None
    if not isinstance(usage, Mapping):
        return Usage(requests=1)
    details = usage.get("prompt_tokens_details") or {}
    return Usage(1, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                 int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0)


# --------------------------------------------------------------------------- probing


def probe(model: str | None = None, context: int | None = None) -> Flow[Capabilities]:
    """Find out, once, what the endpoint can do. Costs about six small requests."""
    [listing] = yield [Call("GET", "models")]
    served = [m.get("id") for m in (listing or {}).get("data", []) if isinstance(m, Mapping)]
    if model is None:
        if not served:
            raise CapabilityError("the endpoint lists no models; pass model=...", missing="models")
        model = str(served[0])
    server = "llama.cpp" if any(m.get("owned_by") == "llamacpp" for m in listing.get("data", [])) else ""

    tokenize = ""
    for kind, body in (
        ("llamacpp", {"content": "[10]", "with_pieces": True, "add_special": False}),
        ("vllm", {"model": model, "prompt": "[10]", "add_special_tokens": False, "return_token_strs": True}),
    ):
        try:
            [answer] = yield [Call("POST", "/tokenize", body, root=True)]
            parse_tokens(answer)
            tokenize = kind
            break
        except (EndpointError, ValueError) as err:
            if isinstance(err, EndpointError) and not _unsupported(err):
                raise

    slots = 0
    if server == "llama.cpp":
        try:
            [props] = yield [Call("GET", "/props", root=True)]
            slots = int(props.get("total_slots") or 0)
            if context is None:
                context = int((props.get("default_generation_settings") or {}).get("n_ctx") or 0) or None
        except EndpointError as err:
            if not _unsupported(err):
                raise
    if context is None:
        context = yield from _probe_context(listing)

    template = False
    try:
        [answer] = yield [Call("POST", "/apply-template", {"messages": chat_messages((("user", "x"),))}, root=True)]
        template = isinstance(answer, Mapping) and isinstance(answer.get("prompt"), str)
    except EndpointError as err:
        if not _unsupported(err):
            raise

    logprobs, cap, prefill, extra = yield from _probe_chat(model, 100 if server else 20)
    prompt_lists = False
    if template and logprobs:
        try:
            [answer] = yield [Call("POST", "completions", {
                "model": model, "prompt": ["A B C", "1 2 3"], "max_tokens": 1, "logprobs": 5, "temperature": 0})]
            prompt_lists = len(answer.get("choices", [])) == 2 and all(_top_entries(c) for c in answer["choices"])
        except EndpointError as err:
            if not _unsupported(err):
                raise
    transport = "completions" if prompt_lists else ("chat" if prefill else "")
    caps = Capabilities(
        model=model, logprobs=logprobs, max_top_logprobs=1000 if server == "llama.cpp" else cap, transport=transport,
        chat_extra=extra, tokenize=tokenize, template=template, prompt_lists=prompt_lists, context=context,
        server=server, slots=slots)
    log.info("probed endpoint: %s", caps)
    return caps


def _probe_context(listing: Mapping[str, Any]) -> Flow[int | None]:
    for entry in listing.get("data", []):
        if isinstance(entry, Mapping):
            for key in ("max_model_len", "context_length"):
                if isinstance(entry.get(key), int):
                    return entry[key]
    try:
        [props] = yield [Call("GET", "/props", root=True)]
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        return int(n_ctx) if n_ctx else None
    except EndpointError as err:
        if not _unsupported(err):
            raise
    return None


def _probe_chat(model: str, top: int) -> Flow[tuple[bool, int, bool, dict[str, Any]]]:
    """Chat logprobs, the top-k limit, and whether a prefilled assistant message is continued."""
    base = {"model": model, "max_tokens": 1, "temperature": 0, "logprobs": True,
            "messages": chat_messages((("user", "Continue the sequence."),), _PROBE_PREFIX)}
    cap = top
    for extra in ({}, {"continue_final_message": True, "add_generation_prompt": False}):
        try:
            [answer] = yield [Call("POST", "chat/completions", {**base, "top_logprobs": cap, **extra})]
        except EndpointError as err:
            if not _unsupported(err):
                raise
            if cap > 20 and not extra:  # OpenAI and vLLM cap top_logprobs at 20
                cap = 20
                try:
                    [answer] = yield [Call("POST", "chat/completions", {**base, "top_logprobs": cap})]
                except EndpointError as err2:
                    if not _unsupported(err2):
                        raise
                    continue
            else:
                continue
        entries = _top_entries(answer["choices"][0]) if answer.get("choices") else []
        if not entries:
            return False, 0, False, {}
        best = max(entries, key=lambda e: e[2])
        if best[1].strip() == "Y":
            return True, cap, True, extra
    return True, cap, False, {}


# --------------------------------------------------------------------------- tokenizing


def parse_tokens(answer: Any) -> list[tuple[int, str]]:
    """``(id, piece)`` pairs from llama.cpp's or vLLM's ``/tokenize`` answer."""
    tokens = answer.get("tokens") if isinstance(answer, Mapping) else None
    if not isinstance(tokens, list):
        raise ValueError(f"not a tokenize answer: {str(answer)[:200]}")
    if tokens and isinstance(tokens[0], Mapping):  # llama.cpp with_pieces
        return [(int(t["id"]), t["piece"] if isinstance(t["piece"], str) else bytes(t["piece"]).decode("utf-8", "replace"))
                for t in tokens]
    pieces = answer.get("token_strs") or [""] * len(tokens)
    return [(int(t), str(s)) for t, s in zip(tokens, pieces)]


def tokenize(caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[tuple[int, str]]]]:
    """Tokenize each text with the served model's own tokenizer (no special tokens)."""
    if not caps.tokenize:
        raise CapabilityError(
            "the endpoint has no /tokenize route, so identifier labels cannot be built from the served "
            "model's tokenizer (llama.cpp and vLLM have one)", missing="tokenize")
    if caps.tokenize == "llamacpp":
        calls = [Call("POST", "/tokenize", {"content": t, "with_pieces": True, "add_special": False}, root=True) for t in texts]
    else:
        calls = [Call("POST", "/tokenize", {"model": caps.model, "prompt": t, "add_special_tokens": False,
                                            "return_token_strs": True}, root=True) for t in texts]
    answers = yield calls
    return [parse_tokens(a) for a in answers]


# --------------------------------------------------------------------------- next-token log-probabilities


def _top_entries(choice: Any) -> list[tuple[int | None, str, float]]:
    """``(id, piece, logprob)`` of the first generated position, from either logprob shape."""
    lp = choice.get("logprobs") if isinstance(choice, Mapping) else None
    if not isinstance(lp, Mapping):
        return []
    content = lp.get("content")
    if isinstance(content, list) and content:
        first = content[0]
        return [(e.get("id"), str(e.get("token", "")), float(e["logprob"]))
                for e in first.get("top_logprobs") or [] if e.get("logprob") is not None]
    legacy = lp.get("top_logprobs")
    if isinstance(legacy, list) and legacy and isinstance(legacy[0], Mapping):
        return [(None, str(piece), float(value)) for piece, value in legacy[0].items()]
    return []


def _match(entries: list[tuple[int | None, str, float]], want: Sequence[tuple[int, str]]) -> tuple[TokenLogprobs, float]:
    by_id = {i: v for i, _, v in entries if i is not None}
    by_piece: dict[str, float] = {}
    for _, piece, value in entries:
        by_piece[piece] = max(value, by_piece.get(piece, float("-inf")))
    found = {}
    for token in want:
        value = by_id.get(token[0]) if by_id else by_piece.get(token[1])
        if value is not None:
            found[token] = value
    return found, min(v for _, _, v in entries)


def next_token_logprobs(
    caps: Capabilities, queries: Sequence[Query], top: int, cache: dict[str, dict]
) -> Flow[list[tuple[TokenLogprobs, float]]]:
    """For each query: the wanted tokens found in the top-``top`` and the smallest logprob returned
    (an upper bound for any token not returned). ``cache`` keeps rendered chat templates and the
    llama.cpp slot each prompt is pinned to, across steps and calls."""
    if caps.transport == "completions":
        templates = cache.setdefault("templates", {})
        missing = sorted({q.messages for q in queries if q.messages not in templates})
        if missing:
            answers = yield [Call("POST", "/apply-template", {"messages": chat_messages(m)}, root=True) for m in missing]
            for m, a in zip(missing, answers):
                templates[m] = _prompt_of(a)
        groups: dict[Messages, list[int]] = {}
        for i, q in enumerate(queries):
            groups.setdefault(q.messages, []).append(i)
        calls = []
        for messages, members in groups.items():
            body = {"model": caps.model, "prompt": [templates[messages] + queries[i].prefix for i in members],
                    "max_tokens": 1, "logprobs": top, "temperature": 0}
            if caps.slots > 1:
                body["id_slot"] = _slot(cache, messages, caps.slots)
            calls.append(Call("POST", "completions", body))
        answers = yield calls
        choices: list[Any] = [None] * len(queries)
        for members, answer in zip(groups.values(), answers):
            got = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
            if len(got) != len(members):
                raise ResponseError(f"asked for {len(members)} completions, got {len(got)}", body=answer)
            for i, choice in zip(members, got):
                choices[i] = choice
    elif caps.transport == "chat":
        answers = yield [Call("POST", "chat/completions", {
            "model": caps.model, "messages": chat_messages(q.messages, q.prefix), "max_tokens": 1,
            "temperature": 0, "logprobs": True, "top_logprobs": top, **caps.chat_extra}) for q in queries]
        choices = [(a.get("choices") or [None])[0] for a in answers]
    else:
        raise CapabilityError(
            "the endpoint cannot continue a prefilled assistant message (and has no templated prompt lists), "
            "so identifier probabilities after a ranking prefix cannot be read; every method here needs that. "
            "OpenAI's API lacks it; llama.cpp's server and vLLM have it", missing="assistant prefill")
    out = []
    for q, choice in zip(queries, choices):
        entries = _top_entries(choice)
        if not entries:
            raise ResponseError("the answer carries no top log-probabilities", body=choice)
        out.append(_match(entries, q.want))
    return out


def _slot(cache: dict[str, dict], messages: Messages, slots: int) -> int:
    """Pin each prompt to a llama.cpp slot: a new prompt takes the least recently used slot.

    A list of prompts is otherwise spread over idle slots, and every slot that does not hold the
    shared prefix recomputes the whole prompt; pinned, the prompts run one after another in one slot
    and each costs only its last few tokens. Least-recently-used (not round robin) keeps the prompts
    of one decoding step, the real and the empty one, in different slots even when one of them comes
    back from an earlier list (the empty prompt is the same for every order of a query's passages):
    two live prompts sharing a slot would each evict the other at every step.
    """
    state = cache.setdefault("slot_state", {"owner": {}, "used": {}, "tick": 0})  # slot -> prompt, last use
    state["tick"] += 1
    slot = next((s for s, owner in state["owner"].items() if owner == messages), None)
    if slot is None:
        slot = min(range(slots), key=lambda s: (state["used"].get(s, 0), s))
        state["owner"][slot] = messages
    state["used"][slot] = state["tick"]
    return slot


def _prompt_of(answer: Any) -> str:
    prompt = answer.get("prompt") if isinstance(answer, Mapping) else None
    if not isinstance(prompt, str):
        raise ResponseError("malformed /apply-template answer", body=answer)
    return prompt
