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

Answers (both logprob shapes: ``content`` lists, legacy ``top_logprobs`` dicts) are read by :mod:`.answers`;
probing is :mod:`.probe`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .answers import (
    Alternatives,
    Generated,
    completion_alternatives,
    first_choice,
    generated,
    malformed,
    parse_tokens,
    top_entries,
)
from .answers import choices_of as _choices
from .answers import template_of as _template_of
from .answers import usage_of as usage_of  # re-exported: the drivers' and earlier callers' name
from .calls import (  # re-exported: every caller's name for them
    Call,
    EndpointState,
    Flow,
    Token,
    chat_messages,
    template_call,
    text_messages,
    tokenize_call,
)
from .controls import token_prompts
from .errors import CapabilityError, EndpointError, ResponseError
from .prompts import Messages, declared_tokens, prompt_text
from .types import Capabilities
from .untrusted import Prompt

TokenLogprobs = dict[Token, float]  # wanted token -> logprob (missing = not in the top-k)


@dataclass(frozen=True)
class Query:
    """Next-token log-probabilities wanted after ``messages`` and an assistant ``prefix``, given as
    the served model's tokens (so a transport can send ids, or their text)."""

    messages: Prompt  # the template with its untrusted spans kept apart (untrusted.Prompt)
    prefix: tuple[Token, ...]
    want: tuple[Token, ...]
    render: str = "chat"  # "chat": the server's chat template; else rendered here (prompts.prompt_text)

    @property
    def text(self) -> str:
        return "".join(piece for _, piece in self.prefix)

    @property
    def prompt(self) -> tuple[Prompt, str]:
        """What identifies the rendered prompt (the same messages in two formats are two prompts)."""
        return self.messages, self.render


# --------------------------------------------------------------------------- tokenizing


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


#: Between the spans of one batched llama.cpp ``/tokenize`` (:func:`span_ids`): an id past any vocabulary,
#: which llama.cpp passes through as given in a mixed list, so that no text can produce it.
SPAN_SEPARATOR = 2**30 - 1


def span_ids(caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]:
    """Each untrusted span's token ids from the served model's tokenizer, special tokens neither added nor
    parsed. On llama.cpp in one ``/tokenize`` for all of them: its mixed content tokenizes each text on its
    own, exactly as one request per text would, and the spans come back between :data:`SPAN_SEPARATOR` ids.
    Should the answer not split into one run per text (a server that checks or drops ids), or the server
    refuse the list (a 4xx), one request per text."""
    if caps.tokenize == "llamacpp" and len(texts) > 1:
        content: list[str | int] = [x for t in texts for x in (SPAN_SEPARATOR, t)][1:]
        runs: list[list[int]] = [[]]
        try:
            [answer] = yield [Call("POST", "/tokenize", {"content": content, "add_special": False,
                                                         "parse_special": False}, root=True)]
            for i, _ in parse_tokens(answer):
                if i == SPAN_SEPARATOR:
                    runs.append([])
                else:
                    runs[-1].append(i)
        except EndpointError as err:
            if not isinstance(err, ResponseError) and not (err.status and 400 <= err.status < 500):
                raise
            runs = []
        if len(runs) == len(texts):
            return runs
    return [[i for i, _ in ts] for ts in (yield from tokenize(caps, texts))]


# --------------------------------------------------------------------------- next-token log-probabilities


def _match(entries: list[tuple[int | None, str, float]], want: Sequence[Token]) -> tuple[TokenLogprobs, float]:
    """The wanted tokens among ``entries`` (not empty), by id where the server gave ids, else by text;
    and the smallest logprob returned."""
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
            "model": caps.model, "messages": chat_messages(text_messages(state, q.messages), q.text), "max_tokens": 1,
            "temperature": 0, "logprobs": True, "top_logprobs": top, **caps.chat_extra}) for q in queries]
        choices = [first_choice(a) for a in answers]
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
    served model's token ids, pinned to a llama.cpp slot (not when ``state.routed``: then llama.cpp's
    prompts go as token ids only, :func:`_ids_only`, one by one, :func:`_prompt_by_prompt`). The prompt
    itself is :func:`sent_prompt`."""
    tokens = caps.transport == "token-completions"
    missing = [key for key in dict.fromkeys(q.prompt for q in queries) if key not in state.templates]
    if missing:
        yield from (token_prompts if tokens else _mixed_prompts)(state, caps, missing)
    ids_only = state.routed and not tokens
    if ids_only:
        yield from _ids_only(state, dict.fromkeys(q.prompt for q in queries))
    groups: dict[tuple[Prompt, str], list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(q.prompt, []).append(i)
    calls = []
    for key, members in groups.items():
        template = state.templates[(_IDS, key) if ids_only else key]
        prompts = [[*template, *(i for i, _ in queries[j].prefix)] for j in members]
        body = {"model": caps.model, "prompt": prompts, "max_tokens": 1, "logprobs": top, "temperature": 0}
        if tokens:
            body["return_tokens_as_token_ids"] = True
            if caps.logprob_token_ids:  # exactly the wanted tokens, whatever their rank
                body.update(logprobs=1, logprob_token_ids=sorted({i for j in members for i, _ in queries[j].want}))
        if caps.slots > 1 and not state.routed and (slot := state.slots.pin(key, caps.slots)) is not None:
            body["id_slot"] = slot
        calls.append(Call("POST", "completions", body))
    try:
        answers = (yield from _prompt_by_prompt(calls)) if ids_only and caps.slots > 1 else (yield calls)
    finally:
        for call in calls:
            state.slots.release(call.body.get("id_slot") if call.body else None)
    choices: list[Any] = [None] * len(queries)
    for members, answer in zip(groups.values(), answers):
        for i, choice in zip(members, _choices(answer, len(members))):
            choices[i] = choice
    return choices


def _prompt_by_prompt(calls: list[Call]) -> Flow[list[Any]]:
    """The answers to ``calls`` (prompt lists) for llama.cpp without slot pins (``routed``). It runs the
    prompts of one prompt list in all its idle slots at once, each slot computing the whole prompt; sent
    one by one instead (each list's prompts in turn, the lists side by side), each prompt goes to the idle
    slot most like it, the one that holds its prefix, and costs only its last tokens."""
    bodies = [dict(call.body or {}) for call in calls]
    parts: list[list[Any]] = [[] for _ in calls]
    for r in range(max(len(body["prompt"]) for body in bodies)):
        live = [k for k, body in enumerate(bodies) if r < len(body["prompt"])]
        answers = yield [Call("POST", "completions", {**bodies[k], "prompt": [bodies[k]["prompt"][r]]}) for k in live]
        for k, answer in zip(live, answers):
            parts[k].extend(_choices(answer, 1))
    return [{"choices": [{**choice, "index": i} for i, choice in enumerate(choices)]} for choices in parts]


def _mixed_prompts(state: EndpointState, caps: Capabilities, keys: Sequence[tuple[Prompt, str]]) -> Flow[None]:
    """llama.cpp: each prompt as a mixed prompt, the template's own text (which the server tokenizes, its
    control tokens included) around the untrusted spans as token ids from ``/tokenize`` with
    ``parse_special: false``, so that no passage or query text can become a control token. The template
    is rendered with markers in place of the spans (``/apply-template``, or here for a client-side
    format), once per shape: the rendered skeletons hold no user text."""
    shapes = [s for s in dict.fromkeys((p.skeleton, style) for p, style in keys) if s not in state.templates]
    served = [s for s in shapes if s[1] == "chat"]
    answers = (yield [template_call(caps.model, skeleton, tokens=False) for skeleton, _ in served]) if served else []
    for shape in shapes:
        state.templates[shape] = (_template_of(answers[served.index(shape)], False) if shape in served
                                  else prompt_text(*shape))
    try:
        parts = {key: key[0].parts(state.templates[(key[0].skeleton, key[1])]) for key in keys}
    except ValueError as err:  # the server's rendering lost the markers: a malformed answer, not cached
        for shape in shapes:
            state.templates.pop(shape, None)
        raise malformed(f"/apply-template: {err}", answers) from None
    declared = state.declared + declared_tokens(keys[0][1])
    spelt = {key: [x if isinstance(x, str) else (key[0].spelling(x, declared),) for x in xs] for key, xs in parts.items()}
    spellings = list(dict.fromkeys(x[0] for xs in spelt.values() for x in xs if isinstance(x, tuple)))
    ids = dict(zip(spellings, (yield from span_ids(caps, spellings))))
    for key, xs in spelt.items():  # the template's text as text, each span's text as its ids
        state.templates[key] = [y for x in xs for y in ([x] if isinstance(x, str) else ids[x[0]])]


_IDS = "ids only"  # the rendered-prompt cache's key of a llama.cpp prompt as token ids only: (_IDS, key)


def _ids_only(state: EndpointState, keys: Iterable[tuple[Prompt, str]]) -> Flow[None]:
    """llama.cpp's mixed prompts (:func:`_mixed_prompts`) as token ids only, for routers, which accept a
    prompt as text or as ids but not both (vllm-router answers 422). llama.cpp's ``/tokenize`` takes the
    same mixed list and tokenizes it with the same function as ``/v1/completions`` (its text with control
    tokens parsed, special tokens added to a first text piece), so the ids are the ones it would run:
    one request per prompt, once per ranking."""
    todo = [key for key in keys if (_IDS, key) not in state.templates]
    if not todo:
        return
    answers = yield [Call("POST", "/tokenize", {"content": list(state.templates[key]), "add_special": True,
                                                "parse_special": True}, root=True) for key in todo]
    for key, answer in zip(todo, answers):
        state.templates[(_IDS, key)] = [i for i, _ in parse_tokens(answer)]


# --------------------------------------------------------------------------- token strings (no ids, no tokenizer)

def text_next_tokens(state: EndpointState, prompts: Sequence[str], top: int) -> Flow[list[Alternatives]]:
    """The top-``top`` next tokens after each text prompt, from a plain ``/v1/completions``
    (``Capabilities.text_completions``: no template, no tokenizer, no ids): one request with the prompts
    as a list where the endpoint takes lists (``prompt_lists``), else one request per prompt."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    body = {"model": caps.model, "max_tokens": 1, "logprobs": min(top, caps.text_completions), "temperature": 0}
    groups = [list(prompts)] if caps.prompt_lists else [[p] for p in prompts]
    answers = yield [Call("POST", "completions", {**body, "prompt": g if caps.prompt_lists else g[0]}) for g in groups]
    return [alternatives for group, answer in zip(groups, answers)
            for alternatives in completion_alternatives(answer, len(group))]


def generate(state: EndpointState, conversations: Sequence[Messages], *, max_tokens: int, top: int
             ) -> Flow[list[Generated]]:
    """An ordinary greedy chat completion per conversation, with the ``top`` alternatives of every
    generated token (hosted APIs cap ``top_logprobs`` at 20). Where the endpoint returns no
    log-probabilities, the answer's text is one position without alternatives."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    scored = {"logprobs": True, "top_logprobs": min(top, caps.max_top_logprobs)} if caps.logprobs else {}
    answers = yield [Call("POST", "chat/completions", {
        "model": caps.model, "messages": chat_messages(text_messages(state, m)), "max_tokens": max_tokens,
        "temperature": 0, **scored})
        for m in conversations]
    return [generated(answer, caps.logprobs) for answer in answers]
