"""vLLM's server: token-id prompt lists over ``/v1/completions`` (``Capabilities.transport ==
"token-completions"``), its ``/tokenize`` and ``/detokenize``, and its control tokens checked by id.

The same prompt lists as llama.cpp's (:class:`~.lists.PromptLists`), in token ids: the chat template's ids
from ``/tokenize`` with ``messages``, the assistant prefix as the served model's own label token ids, answers
keyed by token id (``return_tokens_as_token_ids``), and where the server has it, ``logprob_token_ids``
returns exactly the tokens wanted (no top-k, no upper bounds).

vLLM's tokenizer matches control tokens in any text it is given and has no switch to stop it, so here
untrusted spans go as neutralised text (:func:`~..calls.text_messages`). Which tokens to neutralise is not
guessed from their spelling (MiniMax's ``]~b]``, GLM's ``[gMASK]`` look like no other family's): it is
learned from the served tokenizer (:mod:`.controls`): the tokens of its chat template once per endpoint
(:func:`learn_controls`), and every token of the rendered prompts not tested before (a control the template
does not use, GLM's ``[sMASK]``, that a passage spells). Each prompt is then checked by id
(:func:`token_prompts`): no more control tokens than its skeleton; refused with a
:class:`~..errors.ResponseError` otherwise. Endpoints that expose no tokenizer keep the deny-list
(:data:`~..untrusted.KNOWN_CONTROL`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..errors import ResponseError
from ..prompts.files import prompt_text
from ..prompts.render import Messages
from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .answers import parse_tokens
from .base import COMPLETIONS, Lists, Tokenizer, entries, optional, register, two_choices
from .calls import Call, EndpointState, Flow, Token, chat_messages
from .controls import DIALECTS, checked_prompts, learn_template
from .lists import Key, PromptLists, top_limit

_PROBE = (("user", "x"),)  # the messages whose rendering shows the template's own tokens
MAX_TEXT_TOKENS = 64  # tokens of a text read piece by piece (identifiers, prefixes: a few): each costs a request

__all__ = ["VLLM", "TOKENIZER", "DIALECT", "detect", "template_call", "learn_controls", "token_prompts"]


def template_call(model: str, messages: Messages) -> Call:
    """The request that renders the chat template as token ids (``/tokenize`` with ``messages``)."""
    return Call("POST", "/tokenize", {"model": model, "messages": chat_messages(messages),
                                      "add_generation_prompt": True, "add_special_tokens": False,
                                      "return_token_strs": True}, root=True)


class VllmTokenizer(Tokenizer):
    """vLLM's ``/tokenize``: no special tokens added (it has no switch against parsing them: see the module
    docstring); its ``token_strs`` are the tokenizer's own symbols (``"Ġ["``, ``"▁["``), not text."""

    name: ClassVar[str] = "vllm"

    def call(self, model: str, text: str) -> Call:
        return Call("POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False,
                                          "return_token_strs": True}, root=True)

    def tokenize(self, caps: Capabilities, texts: Sequence[str], *, text: bool = False) -> Flow[list[list[Token]]]:
        """With ``text=True`` each piece is recovered from ``/detokenize`` of the growing id prefixes (a piece
        is what its token adds to the decoded text)."""
        tokens = yield from super().tokenize(caps, texts)
        if not text:
            return tokens
        if any(len(ts) > MAX_TEXT_TOKENS for ts in tokens):  # the work below is quadratic in a text's tokens
            raise ResponseError(f"a /tokenize answer holds {max(len(ts) for ts in tokens)} tokens for a short text "
                                f"(an identifier or a prefix), more than the bound of {MAX_TEXT_TOKENS} (MAX_TEXT_TOKENS)")
        prefixes = sorted({tuple(i for i, _ in ts[:j]) for ts in tokens for j in range(1, len(ts) + 1)})
        decoded = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": list(p)}, root=True)
                         for p in prefixes]
        text_of = {p: str(d.get("prompt", "")) if isinstance(d, Mapping) else "" for p, d in zip(prefixes, decoded)}
        out = []
        for original, ts in zip(texts, tokens):
            ids = tuple(i for i, _ in ts)
            pieces = [text_of[ids[:j + 1]][len(text_of[ids[:j]]) if j else 0:] for j in range(len(ids))]
            if pieces and original.startswith(" ") and not pieces[0].startswith(" "):
                pieces[0] = " " + pieces[0]  # SentencePiece decoders drop a leading space
            out.append([(i, p) for i, p in zip(ids, pieces)])
        return out


TOKENIZER = register(VllmTokenizer())


class Vllm(PromptLists):
    name: ClassVar[str] = "vLLM token-id prompt lists"
    transport: ClassVar[str] = "token-completions"
    server: ClassVar[str] = "vllm"
    costly_prompts: ClassVar[bool] = True  # whole cache blocks only: each prompt computes its prefix's last one again
    one_request: ClassVar[bool] = True  # a round's real and empty prompts in the same engine steps

    def prepare(self, state: EndpointState, texts: Sequence[str] = ()) -> Flow[None]:
        yield from learn_controls(state)  # the texts' controls: learned from the rendered prompts

    def render(self, state: EndpointState, caps: Capabilities, keys: Sequence[Key]) -> Flow[None]:
        yield from token_prompts(state, caps, keys)

    def body(self, caps: Capabilities, wanted: Sequence[Token]) -> dict[str, Any]:
        if caps.logprob_token_ids:  # exactly the wanted tokens, whatever their rank
            return {"return_tokens_as_token_ids": True, "logprobs": 1,
                    "logprob_token_ids": sorted({i for i, _ in wanted})}
        return {"return_tokens_as_token_ids": True}


VLLM = register(Vllm())


def detect(model: str, tokenizer: str) -> Flow[Lists]:
    """vLLM's token-id prompt lists: the template's ids from ``/tokenize``, two prompts answered by id; then
    whether ``logprob_token_ids`` returns exactly the ids asked for, and the top-k limit."""
    if tokenizer != TOKENIZER.name:
        return Lists()
    rendered = yield from optional(template_call(model, (("user", "x"),)))
    ids = rendered.get("tokens") if isinstance(rendered, Mapping) else None
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        return Lists()
    body = {"model": model, "prompt": [ids, ids[:-1]], "max_tokens": 1, "temperature": 0,
            "return_tokens_as_token_ids": True}
    answer = yield from optional(Call("POST", COMPLETIONS, {**body, "logprobs": 5}))
    if not two_choices(answer, by_id=True):
        return Lists()
    wanted = sorted({ids[-1], ids[0]})
    answer = yield from optional(Call("POST", COMPLETIONS, {**body, "logprobs": 1, "logprob_token_ids": wanted}))
    exact = two_choices(answer, by_id=True) and all(
        set(wanted) <= {e[0] for e in entries(c)} for c in answer["choices"])
    return Lists(VLLM, exact, (yield from top_limit(model, ids)))


# --------------------------------------------------------------------------- control tokens, checked by id


class _Dialect:
    """vLLM's side of the control-token test (:mod:`.controls`): an id's text from ``/detokenize`` (one request
    per id), a text's ids from ``/tokenize`` (one request per text)."""

    def template(self, caps: Capabilities) -> Call:
        return template_call(caps.model, _PROBE)

    def call(self, caps: Capabilities, text: str) -> Call:
        return TOKENIZER.call(caps.model, text)

    def texts(self, caps: Capabilities, ids: Sequence[int]) -> Flow[dict[int, str]]:
        decoded = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": [i]}, root=True) for i in ids]
        return {i: d.get("prompt") for i, d in zip(ids, decoded) if isinstance(d, Mapping)}

    def tokenized(self, caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]:
        answers = yield [TOKENIZER.call(caps.model, t) for t in texts]
        return [[i for i, _ in parse_tokens(a)] for a in answers]


DIALECT = DIALECTS[TOKENIZER.name] = _Dialect()


def learn_controls(state: EndpointState) -> Flow[None]:
    """Once per endpoint: the control tokens of the served chat template (:func:`~.controls.learn_template`);
    nothing without vLLM's tokenizer. Those the template does not use are learned from the prompts
    (:func:`token_prompts`)."""
    caps = state.caps
    if caps is None or caps.tokenize != TOKENIZER.name:
        return
    yield from learn_template(state, caps, DIALECT)


def _render(caps: Capabilities, messages: Messages, style: str) -> Call:
    """The request that tokenizes ``messages`` in ``style``: the served chat template, or a client-side format."""
    return (template_call(caps.model, messages) if style == "chat"
            else TOKENIZER.call(caps.model, prompt_text(messages, style)))


def token_prompts(state: EndpointState, caps: Capabilities, keys: Sequence[tuple[Prompt, str]]) -> Flow[None]:
    """vLLM: each prompt as token ids, the chat template from ``/tokenize`` with ``messages`` (a client-side
    format rendered here and tokenized), checked by id (:func:`~.controls.checked_prompts`)."""
    yield from learn_controls(state)
    yield from checked_prompts(state, caps, keys, DIALECT, _render)
