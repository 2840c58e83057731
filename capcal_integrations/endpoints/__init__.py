"""The endpoint kinds, one module each, and the probe's choice among them.

* :mod:`.llamacpp`: llama.cpp's templated prompt lists (mixed text-and-id prompts, slots, ``/props``);
* :mod:`.vllm`: vLLM's token-id prompt lists (``logprob_token_ids``, control tokens checked by id);
* :mod:`.sglang`: SGLang's token-id prompt lists (answers keyed by token text);
* :mod:`.chat`: chat completions continuing a prefilled assistant message (and the chat probe every kind uses);
* :mod:`.ollama`: the same without a tokenizer (Ollama), read by token text;
* :mod:`.hosted_chat`: a hosted chat API, read from the model's answers;
* :mod:`.hosted_completions`: a hosted plain ``/v1/completions`` with text prompts rendered here.

:mod:`.base` says what a kind is (:class:`~.base.Kind`) and :mod:`.lists` what the prompt-list kinds share
(llama.cpp, vLLM, SGLang). :func:`choose` runs the probes of the kinds in order, the cheapest exact one first, and
returns the kind with what it found; the probe (:mod:`..probe`) stores it in ``Capabilities.kind``, and the rest of the
core calls its methods (:func:`kind_of`) instead of asking which kind it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Capabilities
from . import chat as chat_kind
from . import hosted_completions, llamacpp, ollama, sglang, vllm
from .answers import parse_tokens, wanted_logprobs
from .base import Kind, Lists, Query, TokenLogprobs, kind_of, optional, readable, tokenizer_of
from .calls import EndpointState, Flow, Token
from .chat import CHAT_PREFILL
from .hosted_chat import HOSTED_CHAT, generate
from .hosted_completions import HOSTED_COMPLETIONS, text_next_tokens
from .llamacpp import LLAMACPP, SPAN_SEPARATOR
from .ollama import OLLAMA
from .sglang import SGLANG
from .vllm import VLLM

__all__ = ["Kind", "Query", "TokenLogprobs", "kind_of", "tokenizer_of", "tokenize", "span_ids", "server_facts",
           "next_token_logprobs",
           "choose", "generate", "text_next_tokens", "SPAN_SEPARATOR", "LLAMACPP", "VLLM", "SGLANG", "CHAT_PREFILL", "OLLAMA",
           "HOSTED_CHAT", "HOSTED_COMPLETIONS"]


def tokenize(caps: Capabilities, texts: Sequence[str], *, text: bool = False) -> Flow[list[list[Token]]]:
    """Tokenize each text with the served model's own tokenizer (no special tokens); ``text=True``: each
    piece as the text it adds (vLLM's ``token_strs`` are the tokenizer's symbols, ``"Ġ["``, not text)."""
    return (yield from tokenizer_of(caps).tokenize(caps, texts, text=text))


def next_token_logprobs(state: EndpointState, queries: Sequence[Query], top: int
                        ) -> Flow[list[tuple[TokenLogprobs, float]]]:
    """For each query: the wanted tokens found in the top-``top`` and the smallest logprob returned
    (an upper bound for any token not returned), through the kind the probe chose (``kind.send``), read by
    :func:`~.answers.wanted_logprobs`. Queries on the same messages share one request where the endpoint takes prompt lists."""
    caps = state.caps
    assert caps is not None, "probe the endpoint first"
    choices = yield from kind_of(caps).send(state, queries, top)
    return wanted_logprobs(choices, [q.want for q in queries])


def span_ids(caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]:
    """Each untrusted span's token ids from the served model's tokenizer, special tokens neither added nor
    parsed (on llama.cpp all spans in one ``/tokenize``)."""
    return (yield from tokenizer_of(caps).spans(caps, texts))


def server_facts(model: str, entries: Sequence[Mapping[str, Any]]) -> Flow[tuple[str, str, Mapping[str, Any]]]:
    """The server the model listing shows (``Capabilities.server``), the ``/tokenize`` dialect that answers
    (``Capabilities.tokenize``) and the server's ``/props`` (``{}`` where it has none)."""
    server = llamacpp.server_of(entries) or sglang.server_of(entries) or ollama.server_of(entries)
    tokenize = ""
    # llama.cpp's shape first: vLLM refuses it (400); SGLang answers vLLM's shape too, so it is asked in its own
    tokenizers = (sglang.TOKENIZER,) if server == sglang.SERVER else (llamacpp.TOKENIZER, vllm.TOKENIZER)
    for tokenizer in tokenizers:
        answer = yield from optional(tokenizer.call(model, "[10]"))
        if answer is not None and readable(parse_tokens, answer):
            tokenize = tokenizer.name
            break
    props = yield from llamacpp.props(server)
    return server, tokenize, props


def choose(model: str, server: str, tokenize: str) -> Flow[dict[str, Any]]:
    """The endpoint's kind, the cheapest exact one that answers, and what its probes found, as
    :class:`~..types.Capabilities` fields: chat completions first (log-probabilities, prefill), then where
    they return log-probabilities llama.cpp's, vLLM's and SGLang's prompt lists; without them, chat prefill
    (read by token text where there is no tokenizer: Ollama); else a plain ``/v1/completions`` with text prompts
    (not Ollama's: it applies the chat template to them)."""
    chat = yield from chat_kind.detect(model, 100 if server else 20)
    lists = Lists()
    if chat.logprobs:
        lists = (yield from llamacpp.detect(model)) or (yield from vllm.detect(model, tokenize))
        lists = lists if lists.kind else (yield from sglang.detect(model, tokenize))
    kind = lists.kind or ((CHAT_PREFILL if tokenize else OLLAMA) if chat.prefill else None)
    raw = not lists.kind and server != ollama.SERVER
    text, text_lists = (yield from hosted_completions.detect(model)) if raw else (0, False)
    kind = kind or (HOSTED_COMPLETIONS if text else HOSTED_CHAT)
    server = server or kind.server
    top = llamacpp.TOP_LOGPROBS if server == llamacpp.SERVER else max(lists.max_top_logprobs, chat.max_top_logprobs)
    return dict(kind=kind, transport=kind.transport, logprobs=chat.logprobs, max_top_logprobs=top,
                chat_extra=dict(chat.extra), tokenize=tokenize, template=kind.prompt_lists,
                prompt_lists=kind.prompt_lists or text_lists, logprob_token_ids=lists.logprob_token_ids,
                server=server, text_completions=text, chat=chat.answers)
