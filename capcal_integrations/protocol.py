"""The wire protocol, written once and free of I/O.

Everything that talks to an endpoint is a generator (a :data:`Flow`) that *yields* a list of
:class:`Call` and *receives* the list of decoded JSON answers (or has an
:class:`~.errors.EndpointError` thrown into it). :mod:`.drivers` feeds these generators with a sync
or an async ``openai`` client, so the sync and async APIs are the same code by construction (the
shape of httpx's ``auth_flow``).

Here: the per-endpoint state (:class:`EndpointState`), tokenizing, and reading next-token
log-probabilities after an assistant prefix, by one of three transports:

* ``"completions"`` (llama.cpp): the chat template rendered as text (``/apply-template``), then every
  assistant prefix (as token ids after the text) of one prompt as a prompt list in one
  ``/v1/completions`` request;
* ``"token-completions"`` (vLLM): the same, in token ids: the template's ids from ``/tokenize`` with
  ``messages``, the assistant prefix as the served model's own label token ids, answers keyed by
  token id (``return_tokens_as_token_ids``), and where the server has it, ``logprob_token_ids``
  returns exactly the tokens wanted (no top-k, no upper bounds);
* ``"chat"``: chat completions that continue a prefilled assistant message, one request per prefix.

Endpoints that can do none of these (hosted chat APIs) are read through token *strings*
(:mod:`.textlabels`): :func:`text_next_tokens` sends text prompts, rendered here, to a plain
``/v1/completions``; :func:`generate` asks for an ordinary chat completion with ``top_logprobs``.

Both logprob shapes (``content`` lists, legacy ``top_logprobs`` dicts) are parsed; probing is :mod:`.probe`.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import CapabilityError, ResponseError
from .prompts import Messages, prompt_text
from .slots import SlotPins
from .types import Capabilities, Usage

T = TypeVar("T")
Token = tuple[int, str]  # (id, piece)
TokenLogprobs = dict[Token, float]  # wanted token -> logprob (missing = not in the top-k)


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
    """Next-token log-probabilities wanted after ``messages`` and an assistant ``prefix``, given as
    the served model's tokens (so a transport can send ids, or their text)."""

    messages: Messages
    prefix: tuple[Token, ...]
    want: tuple[Token, ...]
    render: str = "chat"  # "chat": the server's chat template; else rendered here (prompts.prompt_text)

    @property
    def text(self) -> str:
        return "".join(piece for _, piece in self.prefix)

    @property
    def prompt(self) -> tuple[Messages, str]:
        """What identifies the rendered prompt (the same messages in two formats are two prompts)."""
        return self.messages, self.render


@dataclass
class EndpointState:
    """What one (endpoint, model) is known to do, probed once, and what is cached about it across
    calls: the tokens of each identifier spelling, rendered chat templates and llama.cpp slot pins.
    Shared by a reranker and its ``with_options`` copies."""

    model: str | None = None
    caps: Capabilities | None = None
    label_tokens: dict[str, tuple[Token, ...]] = field(default_factory=dict)
    templates: dict[tuple[Messages, str], Any] = field(default_factory=dict)  # rendered text, or token ids
    slots: SlotPins = field(default_factory=SlotPins)
    announced: set[tuple[str, str]] = field(default_factory=set)  # what was logged once (method auto's choice)


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


# --------------------------------------------------------------------------- tokenizing


def parse_tokens(answer: Any) -> list[Token]:
    """``(id, piece)`` pairs from llama.cpp's or vLLM's ``/tokenize`` answer."""
    tokens = answer.get("tokens") if isinstance(answer, Mapping) else None
    if not isinstance(tokens, list):
        raise ValueError(f"not a tokenize answer: {str(answer)[:200]}")
    if tokens and isinstance(tokens[0], Mapping):  # llama.cpp with_pieces
        return [(int(t["id"]), t["piece"] if isinstance(t["piece"], str) else bytes(t["piece"]).decode("utf-8", "replace"))
                for t in tokens]
    pieces = answer.get("token_strs") or [""] * len(tokens)
    return [(int(t), str(s)) for t, s in zip(tokens, pieces)]


def tokenize_call(kind: str, model: str, text: str) -> Call:
    """The ``/tokenize`` request of a llama.cpp (``kind="llamacpp"``) or vLLM server, no special tokens."""
    if kind == "llamacpp":
        return Call("POST", "/tokenize", {"content": text, "with_pieces": True, "add_special": False}, root=True)
    return Call("POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False,
                                      "return_token_strs": True}, root=True)


def tokenize(caps: Capabilities, texts: Sequence[str], *, text: bool = False) -> Flow[list[list[Token]]]:
    """Tokenize each text with the served model's own tokenizer (no special tokens).

    llama.cpp's pieces are text. vLLM's ``token_strs`` are the tokenizer's own symbols (``"Ġ["``,
    ``"▁["``), not text: with ``text=True`` each piece is recovered from ``/detokenize`` of the
    growing id prefixes (a piece is what its token adds to the decoded text)."""
    if not caps.tokenize:
        raise CapabilityError(
            "the endpoint has no /tokenize route, so identifier labels cannot be built from the served "
            "model's tokenizer (llama.cpp and vLLM have one)", missing="tokenize")
    answers = yield [tokenize_call(caps.tokenize, caps.model, t) for t in texts]
    tokens = [parse_tokens(a) for a in answers]
    if not text or caps.tokenize != "vllm":
        return tokens
    prefixes = sorted({tuple(i for i, _ in ts[:j]) for ts in tokens for j in range(1, len(ts) + 1)})
    decoded = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": list(p)}, root=True) for p in prefixes]
    text_of = {p: str(d.get("prompt", "")) if isinstance(d, Mapping) else "" for p, d in zip(prefixes, decoded)}
    out = []
    for original, ts in zip(texts, tokens):
        ids = tuple(i for i, _ in ts)
        pieces = [text_of[ids[:j + 1]][len(text_of[ids[:j]]) if j else 0:] for j in range(len(ids))]
        if pieces and original.startswith(" ") and not pieces[0].startswith(" "):
            pieces[0] = " " + pieces[0]  # SentencePiece decoders drop a leading space
        out.append([(i, p) for i, p in zip(ids, pieces)])
    return out


# --------------------------------------------------------------------------- next-token log-probabilities


def top_entries(choice: Any) -> list[tuple[int | None, str, float]]:
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
        return [(_token_id(str(piece)), str(piece), float(value)) for piece, value in legacy[0].items()
                if value is not None]
    return []


def _token_id(key: str) -> int | None:
    """vLLM's ``return_tokens_as_token_ids`` keys are ``"token_id:123"``.

    >>> _token_id("token_id:508"), _token_id(" [")
    (508, None)
    """
    return int(key[9:]) if key.startswith("token_id:") and key[9:].isdigit() else None


def _match(entries: list[tuple[int | None, str, float]], want: Sequence[Token]) -> tuple[TokenLogprobs, float]:
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


def next_token_logprobs(state: EndpointState, queries: Sequence[Query], top: int
                        ) -> Flow[list[tuple[TokenLogprobs, float]]]:
    """For each query: the wanted tokens found in the top-``top`` and the smallest logprob returned
    (an upper bound for any token not returned). Queries on the same messages share one request
    where the endpoint takes prompt lists."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    if caps.transport in ("completions", "token-completions"):
        choices = yield from _completions(state, caps, queries, top)
    elif any(q.render != "chat" for q in queries):
        raise CapabilityError(f"prompt={queries[0].render!r} sends text through /v1/completions, which this endpoint "
                              "does not offer with prompt lists; use prompt='chat'", missing="completions prompt lists")
    elif caps.transport == "chat":
        answers = yield [Call("POST", "chat/completions", {
            "model": caps.model, "messages": chat_messages(q.messages, q.text), "max_tokens": 1,
            "temperature": 0, "logprobs": True, "top_logprobs": top, **caps.chat_extra}) for q in queries]
        choices = [(a.get("choices") or [None])[0] for a in answers]
    else:
        raise CapabilityError(
            "the endpoint cannot continue a prefilled assistant message (and has no templated prompt lists), "
            "so identifier probabilities after a ranking prefix cannot be read here (probe.route says how this "
            "endpoint is read instead)", missing="assistant prefill")
    out = []
    for q, choice in zip(queries, choices):
        entries = top_entries(choice)
        if not entries:
            raise ResponseError("the answer carries no top log-probabilities", body=choice)
        out.append(_match(entries, q.want))
    return out


def _completions(state: EndpointState, caps: Capabilities, queries: Sequence[Query], top: int) -> Flow[list[Any]]:
    """One ``/v1/completions`` request per prompt with every prefix as a prompt list, the prefix as the
    served model's token ids: llama.cpp gets the template as text (``/apply-template``) followed by
    the ids, pinned to a slot; vLLM gets token ids only (the template from ``/tokenize`` with
    ``messages``) and answers by token id. A prompt in a client-side format is rendered here
    (:func:`~.prompts.prompt_text`), and tokenized by vLLM."""
    tokens = caps.transport == "token-completions"
    missing = sorted({q.prompt for q in queries if q.prompt not in state.templates})
    ask = [key for key in missing if tokens or key[1] == "chat"]
    answers = (yield [template_call(caps.model, m, tokens=tokens) if style == "chat"
                      else tokenize_call("vllm", caps.model, prompt_text(m, style)) for m, style in ask]) if ask else []
    rendered = dict(zip(ask, answers))
    for key in missing:
        state.templates[key] = (_template_of(rendered[key], tokens) if key in rendered else prompt_text(*key))
    groups: dict[tuple[Messages, str], list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(q.prompt, []).append(i)
    calls = []
    for key, members in groups.items():
        template = state.templates[key]
        prompts = [_prompt(template, queries[j].prefix, tokens) for j in members]
        body = {"model": caps.model, "prompt": prompts, "max_tokens": 1, "logprobs": top, "temperature": 0}
        if tokens:
            body["return_tokens_as_token_ids"] = True
            if caps.logprob_token_ids:  # exactly the wanted tokens, whatever their rank
                body.update(logprobs=1, logprob_token_ids=sorted({i for j in members for i, _ in queries[j].want}))
        if caps.slots > 1 and (slot := state.slots.pin(key, caps.slots)) is not None:
            body["id_slot"] = slot
        calls.append(Call("POST", "completions", body))
    try:
        answers = yield calls
    finally:
        for call in calls:
            state.slots.release(call.body.get("id_slot") if call.body else None)
    choices: list[Any] = [None] * len(queries)
    for members, answer in zip(groups.values(), answers):
        for i, choice in zip(members, _choices(answer, len(members))):
            choices[i] = choice
    return choices


def _choices(answer: Any, asked: int) -> list[Any]:
    """The choices of a completions answer to ``asked`` prompts, in prompt order."""
    got = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0)) if isinstance(answer, Mapping) else []
    if len(got) != asked:
        raise ResponseError(f"asked for {asked} completions, got {len(got)}", body=answer)
    return got


def _prompt(template: Any, prefix: tuple[Token, ...], tokens: bool) -> Any:
    """One prompt of a list: the template's token ids and the prefix's (vLLM), or llama.cpp's mixed
    prompt, the template's text then the prefix's ids (text alone when there is no prefix: llama.cpp
    refuses a mixed prompt without ids)."""
    ids = [i for i, _ in prefix]
    if tokens:
        return [*template, *ids]
    return [template, *ids] if ids else template


def template_call(model: str, messages: Messages, *, tokens: bool) -> Call:
    """The request that renders the chat template: as token ids (vLLM's ``/tokenize``) or as text
    (llama.cpp's ``/apply-template``)."""
    if tokens:
        return Call("POST", "/tokenize", {"model": model, "messages": chat_messages(messages),
                                          "add_generation_prompt": True, "add_special_tokens": False}, root=True)
    return Call("POST", "/apply-template", {"messages": chat_messages(messages)}, root=True)


def _template_of(answer: Any, tokens: bool) -> Any:
    """The rendered template: text (``/apply-template``) or token ids (vLLM's ``/tokenize``)."""
    if tokens:
        ids = answer.get("tokens") if isinstance(answer, Mapping) else None
        if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
            return tuple(ids)
        raise ResponseError("malformed /tokenize answer for the chat template", body=answer)
    prompt = answer.get("prompt") if isinstance(answer, Mapping) else None
    if not isinstance(prompt, str):
        raise ResponseError("malformed /apply-template answer", body=answer)
    return prompt


# --------------------------------------------------------------------------- token strings (no ids, no tokenizer)

Alternatives = tuple[tuple[str, float], ...]  # (token text, logprob) at one position, best first
Generated = tuple[tuple[str, Alternatives], ...]  # per generated position: the token chosen, its alternatives


def _alternatives(entries: list[tuple[int | None, str, float]]) -> Alternatives:
    return tuple(sorted(((piece, value) for _, piece, value in entries), key=lambda e: -e[1]))


def text_next_tokens(state: EndpointState, prompts: Sequence[str], top: int) -> Flow[list[Alternatives]]:
    """The top-``top`` next tokens after each text prompt, from a plain ``/v1/completions``
    (``Capabilities.text_completions``: no template, no tokenizer, no ids): one request with the prompts
    as a list where the endpoint takes lists (``prompt_lists``), else one request per prompt."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    body = {"model": caps.model, "max_tokens": 1, "logprobs": min(top, caps.text_completions), "temperature": 0}
    groups = [list(prompts)] if caps.prompt_lists else [[p] for p in prompts]
    answers = yield [Call("POST", "completions", {**body, "prompt": g if caps.prompt_lists else g[0]}) for g in groups]
    out: list[Alternatives] = []
    for group, answer in zip(groups, answers):
        out += [_alternatives(top_entries(c)) for c in _choices(answer, len(group))]
    if not all(out):
        raise ResponseError("a completion carries no top log-probabilities", body=answers)
    return out


def generate(state: EndpointState, conversations: Sequence[Messages], *, max_tokens: int, top: int
             ) -> Flow[list[Generated]]:
    """An ordinary greedy chat completion per conversation, with the ``top`` alternatives of every
    generated token (hosted APIs cap ``top_logprobs`` at 20). Where the endpoint returns no
    log-probabilities, the answer's text is one position without alternatives."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    scored = {"logprobs": True, "top_logprobs": min(top, caps.max_top_logprobs)} if caps.logprobs else {}
    answers = yield [Call("POST", "chat/completions", {
        "model": caps.model, "messages": chat_messages(m), "max_tokens": max_tokens, "temperature": 0, **scored})
        for m in conversations]
    out = []
    for answer in answers:
        choice = (answer.get("choices") or [None])[0] if isinstance(answer, Mapping) else None
        if not caps.logprobs:
            text = ((choice or {}).get("message") or {}).get("content") if isinstance(choice, Mapping) else None
            if not isinstance(text, str):
                raise ResponseError("the chat completion carries no answer", body=answer)
            out.append(((text, ()),))
            continue
        content = ((choice or {}).get("logprobs") or {}).get("content") if isinstance(choice, Mapping) else None
        if not isinstance(content, list) or not content:
            raise ResponseError("the chat completion carries no per-token log-probabilities", body=answer)
        out.append(tuple((str(pos.get("token", "")), _alternatives(top_entries({"logprobs": {"content": [pos]}})))
                         for pos in content))
    return out
