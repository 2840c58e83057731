"""What an endpoint kind is (:class:`Kind`), what a tokenizer dialect is (:class:`Tokenizer`), and the
small pieces every kind's probe and transport share. Free of I/O: every request is a :data:`~..calls.Flow`.

A kind says how it renders and sends the prompts of one decoding step (:meth:`Kind.send`; every kind's answers
are read by :func:`~.answers.wanted_logprobs`) and what it can do (its flags, and :meth:`Kind.route`: prefix,
text or generation). The probe picks one (:func:`~.choose`) and stores it in :attr:`~..types.Capabilities.kind`;
nothing else in the core asks which kind it is talking to.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ..errors import CapabilityError, EndpointError, ResponseError
from ..prompts.files import prompt_text
from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .answers import Alternatives, completion_alternatives, excerpt, parse_tokens, top_entries
from .calls import CHAT, COMPLETIONS, OPENAI_ROUTES, Call, EndpointState, Flow, Token, text_messages  # routes re-exported

__all__ = ["Kind", "Tokenizer", "register", "kind_of", "tokenizer_of", "Query", "TokenLogprobs", "Lists", "optional",
           "unsupported", "readable", "entries", "count", "two_choices", "MAX_SLOTS", "MAX_CONTEXT",
           "MAX_TOP_LIMIT", "COMPLETIONS", "CHAT", "OPENAI_ROUTES", "text_next_tokens"]

log = logging.getLogger("capcal_integrations.endpoints.probe")  # what the probe found, under the probe's name

TokenLogprobs = dict[Token, float]  # wanted token -> logprob (missing = not in the top-k)

#: The servers (``Capabilities.server``) known to take ``user`` on the OpenAI routes (:data:`OPENAI_ROUTES`).
TAKES_USER = ("llama.cpp", "vllm", "sglang")


@dataclass(frozen=True)
class Query:
    """Next-token log-probabilities wanted after ``messages`` and an assistant ``prefix``, given as
    the served model's tokens (so a transport can send ids, or their text)."""

    messages: Prompt  # the template with its untrusted spans kept apart (untrusted.Prompt)
    prefix: tuple[Token, ...]
    want: tuple[Token, ...]
    render: str = "chat"  # "chat": the server's chat template; else rendered here (files.prompt_text)

    @property
    def text(self) -> str:
        return "".join(piece for _, piece in self.prefix)


class Kind:
    """One endpoint kind. Subclasses set the flags and override :meth:`send`; the defaults are a kind that
    continues no prefix (hosted APIs), whose identifiers are read from text prompts or answers."""

    name: ClassVar[str] = ""  # shown in logs and docs
    transport: ClassVar[str] = ""  # Capabilities.transport (kept for display and earlier callers)
    prompt_lists: ClassVar[bool] = False  # continues any prompt, client-side formats too, in prompt lists
    prefill: ClassVar[bool] = False  # continues a prefix in the server's chat template
    prefix_as_text: ClassVar[bool] = False  # sends the prefix as text (its tokens' pieces must be text)
    # each prompt of a step costs compute of its own: a forward pass (llama.cpp computes a list's prompts one after
    # another on its slot; Ollama) or its prefix's last partial cache block computed again (vLLM caches whole blocks
    # only; chat prefill: a request per prompt): vanilla's middle steps then ask only the nodes their choice needs, in
    # a few more requests (ranking.decoding); elsewhere (SGLang's prompt lists, a prefix cache by token) every node is
    # asked in one request a step
    costly_prompts: ClassVar[bool] = False
    server: ClassVar[str] = ""  # the server this kind proves (Capabilities.server, where the listing did not say)

    def __repr__(self) -> str:
        return f"<endpoint kind {self.name}>"

    def matches(self, caps: Capabilities) -> bool:
        """Whether ``caps``, built without a kind (by hand, or by an earlier version), name this kind."""
        return caps.transport == self.transport

    def route(self, caps: Capabilities, prompt: str = "chat") -> str:
        """How identifier probabilities are read for prompts in format ``prompt`` (``Options.prompt``): after
        any assistant prefix (``prefix``), after a prefix in a text prompt rendered here (``text``), or from
        the model's own answer (``generation``); a :class:`~..errors.CapabilityError` when not at all."""
        if self.prompt_lists or (self.prefill and prompt == "chat"):
            return "prefix"
        if caps.text_completions and prompt != "chat":
            return "text"
        if prompt != "chat":
            raise CapabilityError(f"prompt={prompt!r} is sent as text through /v1/completions, which this endpoint "
                                  "does not offer with log-probabilities; use prompt='chat'", missing="text completions")
        if caps.logprobs or caps.chat:  # without log-probabilities only answers can be parsed: vanilla, psc
            return "generation"
        raise CapabilityError("the endpoint returns no log-probabilities (chat completions with logprobs/top_logprobs, "
                              "or /v1/completions with logprobs); every method needs them", missing="logprobs")

    def prepare(self, state: EndpointState, texts: Sequence[str] = ()) -> Flow[None]:
        """What the kind learns before a ranking's prompts are counted or sent, from the endpoint and from the
        untrusted ``texts`` it will send (nothing here)."""
        return
        yield

    def send(self, state: EndpointState, queries: Sequence[Query], top: int) -> Flow[list[Any]]:
        """The spans of one decoding step sent: one answer's choice per query, in order."""
        if any(q.render != "chat" for q in queries):
            raise CapabilityError(f"prompt={queries[0].render!r} sends text through /v1/completions, which this "
                                  "endpoint does not offer with prompt lists; use prompt='chat'",
                                  missing="completions prompt lists")
        raise CapabilityError(
            "the endpoint cannot continue a prefilled assistant message (and has no templated prompt lists), "
            "so identifier probabilities after a ranking prefix cannot be read here (probe.route says how this "
            "endpoint is read instead)", missing="assistant prefill")
        yield

    def text_context(self, state: EndpointState, messages: Prompt, prompt: str) -> Any:
        """What the ``text`` route continues for ``messages`` (:mod:`...textlabels`): here the prompt rendered
        in format ``prompt`` as text, for a plain ``/v1/completions``."""
        return prompt_text(text_messages(state, messages, prompt), prompt)

    def next_tokens(self, state: EndpointState, reads: Sequence[tuple[Any, str]], top: int) -> Flow[list[Alternatives]]:
        """The ``text`` route's reads: the top-``top`` next token texts after each context
        (:meth:`text_context`) and the assistant text after it; here one text prompt each."""
        return (yield from text_next_tokens(state, [context + text for context, text in reads], top))


def text_next_tokens(state: EndpointState, prompts: Sequence[str], top: int) -> Flow[list[Alternatives]]:
    """The top-``top`` next tokens after each text prompt, from a plain ``/v1/completions``
    (``Capabilities.text_completions``: no template, no tokenizer, no ids): one request with the prompts
    as a list where the endpoint takes lists (``prompt_lists``), else one request per prompt."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    body = {"model": caps.model, "max_tokens": 1, "logprobs": min(top, caps.text_completions), "temperature": 0}
    groups = [list(prompts)] if caps.prompt_lists else [[p] for p in prompts]
    answers = yield [Call("POST", COMPLETIONS, {**body, "prompt": g if caps.prompt_lists else g[0]}) for g in groups]
    return [alternatives for group, answer in zip(groups, answers)
            for alternatives in completion_alternatives(answer, len(group))]


class Tokenizer:
    """A server's ``/tokenize`` dialect: the request for one text, and the served model's tokens of texts.
    This one is the endpoint without a tokenizer."""

    name: ClassVar[str] = ""  # Capabilities.tokenize

    def call(self, model: str, text: str) -> Call:
        raise NotImplementedError

    def tokenize(self, caps: Capabilities, texts: Sequence[str], *, text: bool = False) -> Flow[list[list[Token]]]:
        """Each text's ``(id, piece)`` tokens, no special tokens added (``text``: each piece as text)."""
        if not self.name:
            raise CapabilityError(
                "the endpoint has no /tokenize route, so identifier labels cannot be built from the served "
                "model's tokenizer (llama.cpp and vLLM have one)", missing="tokenize")
        answers = yield [self.call(caps.model, t) for t in texts]
        return [parse_tokens(a) for a in answers]

    def spans(self, caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]:
        """Each untrusted span's token ids, special tokens neither added nor parsed."""
        return [[i for i, _ in ts] for ts in (yield from self.tokenize(caps, texts))]


_KINDS: list[Kind] = []  # in the order they are tried when Capabilities name no kind object
_TOKENIZERS: dict[str, Tokenizer] = {}
_NO_TOKENIZER = Tokenizer()
K = TypeVar("K", Kind, Tokenizer)


def register(it: K) -> K:
    """A kind or tokenizer of this package, found by :func:`kind_of` and :func:`tokenizer_of`."""
    if isinstance(it, Kind):
        _KINDS.append(it)
    else:
        _TOKENIZERS[it.name] = it
    return it


def kind_of(caps: Capabilities) -> Kind:
    """The endpoint's kind: the one the probe chose (``caps.kind``), else the one ``caps`` names."""
    if isinstance(caps.kind, Kind):
        return caps.kind
    found = next((k for k in _KINDS if k.matches(caps)), None)
    if found is None:
        raise ValueError(f"no endpoint kind has transport {caps.transport!r}")
    return found


def tokenizer_of(caps: Capabilities) -> Tokenizer:
    """The endpoint's ``/tokenize`` dialect (one that raises :class:`~..errors.CapabilityError` when it has none)."""
    return _TOKENIZERS.get(caps.tokenize, _NO_TOKENIZER)


@dataclass(frozen=True)
class Lists:
    """What a prompt-list probe found: the kind (``None``: the route answered, but takes no prompt lists),
    whether it returns the logprobs of given token ids (vLLM's ``logprob_token_ids``), and its top-k limit."""

    kind: Kind | None = None
    logprob_token_ids: bool = False
    max_top_logprobs: int = 0


# --------------------------------------------------------------------------- probing

_UNSUPPORTED = (400, 404, 405, 422, 501)


#: how often a probe sends a call whose answer was unreadable (cut short, not JSON) before it raises
PROBE_TRIES = 3


def optional(call: Call) -> Flow[Any | None]:
    """The answer to ``call``, or ``None`` when the endpoint refuses it: an "unsupported" status, or a web page
    where a server extra (``/props``, ``/tokenize``) would be. An unreadable answer (cut short, not JSON) is a
    failure, not a refusal: the call is sent again, up to :data:`PROBE_TRIES` times, then the error propagates
    (one broken answer must not change the route for the reranker's life: nothing is cached from a probe that
    raised). Any other failure propagates."""
    for attempt in range(1, PROBE_TRIES + 1):
        try:
            [answer] = yield [call]
            return answer
        except ResponseError as err:
            if not err.unreadable:
                return None  # a JSON object of another shape: what the endpoint answers there (not this feature)
            if call.root and str(err.body or "").lstrip()[:1] == "<":
                return None  # a web page at the server's root: no such extra here
            if attempt == PROBE_TRIES:
                raise
            log.info("probe: %s; asked again (%d of %d)", err, attempt + 1, PROBE_TRIES)
        except EndpointError as err:
            if err.status in _UNSUPPORTED:
                return None
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def unsupported(err: EndpointError) -> bool:
    return err.status in _UNSUPPORTED


def readable(read: Any, *args: Any) -> Any:
    """What ``read`` makes of an optional probe's answer, or ``None`` when that answer is malformed."""
    try:
        return read(*args)
    except ResponseError as err:
        log.info("probe: %s; treated as unsupported", err)
        return None


def entries(choice: Any) -> list:
    return readable(top_entries, choice) or []


def two_choices(answer: Any, *, by_id: bool) -> bool:
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not (isinstance(choices, list) and len(choices) == 2):
        return False
    found = [entries(c) for c in choices]
    return all(found) and (not by_id or all(e[0] is not None for es in found for e in es))


#: The largest values an endpoint may report (:func:`count`): above them a report is not believed.
MAX_SLOTS = 4096
MAX_CONTEXT = 2**24  # tokens (16.8 M: ten times the longest context served today)
MAX_TOP_LIMIT = 100_000


def count(value: Any, what: str = "", bound: int | None = None, body: Any = None) -> int | None:
    """A positive integer an optional field reports (a context size, a slot count), else None; a
    :class:`~..errors.ResponseError` naming the ``bound`` when it is above it.

    >>> count(8), count("8"), count(0)
    (8, None, None)
    >>> count(10**12, "total_slots", MAX_SLOTS)
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
