"""SGLang's server: token-id prompt lists over ``/v1/completions`` (``Capabilities.transport ==
"sglang-completions"``), its ``/tokenize`` and ``/detokenize``.

Tested against the documented dialect in :mod:`capcal_integrations.testing` only, never live (SGLang does
not install here). What it relies on, from ``sgl-project/sglang``'s ``python/sglang/srt/entrypoints/openai/``
(``protocol.py``, ``serving_tokenize.py``, ``utils.py``):

* ``/v1/models`` entries are ``owned_by: "sglang"`` with ``max_model_len`` (the probe reads the context there);
* ``/v1/completions`` takes ``prompt`` as token ids or a list of them, and its ``logprobs`` are the legacy
  shape, each position's ``top_logprobs`` a dict **keyed by token text** (no ids);
* ``/tokenize`` takes ``{"model", "prompt": text or texts, "add_special_tokens"}`` and answers ``{"tokens",
  "count", "max_model_len"}``; newer releases also take ``messages`` and render the chat template as a chat
  completion would; ``/detokenize`` takes ``{"tokens": ids or lists of ids, "skip_special_tokens"}`` and
  answers ``{"text": text or texts}``;
* chat completions take ``continue_final_message``.

So the chat template's ids come from ``/tokenize`` with ``messages``, and every prefix of one prompt goes in
one request as token ids (:class:`~.lists.PromptLists`). Answers are read by token text: each token's piece
is its id decoded alone (``/detokenize`` of ``[[id], ...]``), the text SGLang keys its alternatives by. An
SGLang whose ``/tokenize`` takes no ``messages`` (older releases) gets no prompt lists here: the probe falls
back to chat completions continuing the prefilled assistant message (``continue_final_message``, the
:mod:`.chat` kind), whose prefix pieces come from the same tokenizer. Untrusted spans go as neutralised
text (:func:`~..calls.text_messages`) against the control tokens learned from the served tokenizer, and each
prompt is checked by id, as on vLLM (:mod:`.controls`; SGLang's batch ``/tokenize`` and ``/detokenize`` make
each round of that test two requests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..prompts.files import prompt_text
from ..prompts.render import Messages
from ..types import Capabilities
from .answers import malformed
from .base import COMPLETIONS, Lists, Tokenizer, optional, register, two_choices
from .calls import Call, EndpointState, Flow, Token, chat_messages
from .controls import DIALECTS, checked_prompts, learn_template
from .lists import Key, PromptLists, top_limit

__all__ = ["SGLANG", "TOKENIZER", "SERVER", "server_of", "detect", "template_call"]

#: ``Capabilities.server`` of an SGLang server (its ``/v1/models`` entries are ``owned_by: sglang``).
SERVER = "sglang"


def server_of(entries: Sequence[Mapping[str, Any]]) -> str:
    """:data:`SERVER` when the model listing is SGLang's, else ``""``."""
    return SERVER if any(m.get("owned_by") == SERVER for m in entries) else ""


def template_call(model: str, messages: Messages) -> Call:
    """The request that renders the chat template as token ids (``/tokenize`` with ``messages``)."""
    return Call("POST", "/tokenize", {"model": model, "messages": chat_messages(messages),
                                      "add_special_tokens": False}, root=True)


class SglangTokenizer(Tokenizer):
    """SGLang's ``/tokenize`` (no special tokens added); each piece is the token decoded alone, whatever
    ``text`` asks: the key SGLang's ``top_logprobs`` give that token."""

    name: ClassVar[str] = "sglang"

    def call(self, model: str, text: str) -> Call:
        return Call("POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}, root=True)

    def tokenize(self, caps: Capabilities, texts: Sequence[str], *, text: bool = False) -> Flow[list[list[Token]]]:
        tokens = yield from super().tokenize(caps, texts)
        distinct = sorted({i for ts in tokens for i, _ in ts})
        if not distinct:
            return tokens
        [answer] = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": [[i] for i in distinct],
                                                        "skip_special_tokens": False}, root=True)]
        pieces = answer.get("text") if isinstance(answer, Mapping) else None
        if not (isinstance(pieces, list) and len(pieces) == len(distinct) and all(isinstance(p, str) for p in pieces)):
            raise malformed("a /detokenize answer's 'text' is not one string per list of ids", answer)
        piece = dict(zip(distinct, pieces))
        return [[(i, piece[i]) for i, _ in ts] for ts in tokens]


TOKENIZER = register(SglangTokenizer())


class _Dialect:
    """SGLang's side of the control-token test (:mod:`.controls`): every id's text in one ``/detokenize`` of
    ``[[id], ...]``, every text's ids in one ``/tokenize`` of a list of texts."""

    def template(self, caps: Capabilities) -> Call:
        return template_call(caps.model, (("user", "x"),))

    def call(self, caps: Capabilities, text: str) -> Call:
        return TOKENIZER.call(caps.model, text)

    def texts(self, caps: Capabilities, ids: Sequence[int]) -> Flow[dict[int, str]]:
        [answer] = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": [[i] for i in ids],
                                                        "skip_special_tokens": False}, root=True)]
        texts = answer.get("text") if isinstance(answer, Mapping) else None
        if not (isinstance(texts, list) and len(texts) == len(ids)):
            raise malformed("a /detokenize answer's 'text' is not one string per list of ids", answer)
        return dict(zip(ids, texts))

    def tokenized(self, caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]:
        [answer] = yield [Call("POST", "/tokenize", {"model": caps.model, "prompt": list(texts),
                                                      "add_special_tokens": False}, root=True)]
        lists = answer.get("tokens") if isinstance(answer, Mapping) else None
        if not (isinstance(lists, list) and len(lists) == len(texts) and all(isinstance(x, list) for x in lists)):
            raise malformed("a /tokenize answer for a list of texts is not one list of ids per text", answer)
        return [[i for i in x if isinstance(i, int)] for x in lists]


DIALECT = DIALECTS[TOKENIZER.name] = _Dialect()


def _render(caps: Capabilities, messages: Messages, style: str) -> Call:
    """The request that tokenizes ``messages`` in ``style``: the served chat template, or a client-side format."""
    return (template_call(caps.model, messages) if style == "chat"
            else TOKENIZER.call(caps.model, prompt_text(messages, style)))


class Sglang(PromptLists):
    name: ClassVar[str] = "SGLang token-id prompt lists"
    transport: ClassVar[str] = "sglang-completions"
    server: ClassVar[str] = SERVER

    def prepare(self, state: EndpointState, texts: Sequence[str] = ()) -> Flow[None]:
        """The served chat template's control tokens (:func:`~.controls.learn_template`), once per endpoint (the
        texts' own: learned from the rendered prompts)."""
        if state.caps is not None:
            yield from learn_template(state, state.caps, DIALECT)

    def render(self, state: EndpointState, caps: Capabilities, keys: Sequence[Key]) -> Flow[None]:
        """Each prompt's token ids: the served chat template from ``/tokenize`` with ``messages``, a client-side
        format rendered here and tokenized; the spans neutralised against the control tokens learned from the
        served tokenizer, and each prompt checked by id (:func:`~.controls.checked_prompts`), as on vLLM."""
        yield from self.prepare(state)
        yield from checked_prompts(state, caps, keys, DIALECT, _render)


SGLANG = register(Sglang())


def detect(model: str, tokenizer: str) -> Flow[Lists]:
    """SGLang's token-id prompt lists: the template's ids from ``/tokenize`` with ``messages``, and two
    token-id prompts answered with log-probabilities; then the top-k limit."""
    if tokenizer != TOKENIZER.name:
        return Lists()
    rendered = yield from optional(template_call(model, (("user", "x"),)))
    ids = rendered.get("tokens") if isinstance(rendered, Mapping) else None
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        return Lists()  # no messages in /tokenize: chat prefill, if continue_final_message continues
    answer = yield from optional(Call("POST", COMPLETIONS, {
        "model": model, "prompt": [ids, ids[:-1]], "max_tokens": 1, "logprobs": 5, "temperature": 0}))
    if not two_choices(answer, by_id=False):
        return Lists()
    return Lists(SGLANG, False, (yield from top_limit(model, ids)))
