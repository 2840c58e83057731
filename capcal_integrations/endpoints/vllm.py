"""vLLM's server: token-id prompt lists over ``/v1/completions`` (``Capabilities.transport ==
"token-completions"``), its ``/tokenize`` and ``/detokenize``, and its control tokens checked by id.

The same prompt lists as llama.cpp's (:class:`~.lists.PromptLists`), in token ids: the chat template's ids
from ``/tokenize`` with ``messages``, the assistant prefix as the served model's own label token ids, answers
keyed by token id (``return_tokens_as_token_ids``), and where the server has it, ``logprob_token_ids``
returns exactly the tokens wanted (no top-k, no upper bounds).

vLLM's tokenizer matches control tokens in any text it is given and has no switch to stop it, so here
untrusted spans go as neutralised text (:func:`~..calls.text_messages`). Which tokens to neutralise is not
guessed from their spelling (MiniMax's ``]~b]``, GLM's ``[gMASK]`` look like no other family's): it is
learned once per endpoint (:func:`learn_controls`) from how the served tokenizer treats the tokens of its
own chat template. A control token is *atomic*: the tokenizer matches its text wherever it stands, so it
survives a space or a letter glued to either side (`` ]~b] `` and ``a]~b]a`` still hold ``]~b]``), where an
ordinary multi-character token merges with its neighbours (`` user`` is another token than ``user``).
Those tokens' texts are neutralised in every span, and each prompt is then checked by id
(:func:`token_prompts`): it must hold no more control tokens than its skeleton (the template with no user
text) does. A prompt that holds more (a tokenizer that normalises text before matching, say) is sent with
its spans NFKC-folded and neutralised again, and refused with a :class:`~..errors.ResponseError` if that
does not hold either. Endpoints that expose no tokenizer keep the deny-list
(:data:`~..untrusted.KNOWN_CONTROL`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..answers import parse_tokens, template_of
from ..calls import Call, EndpointState, Flow, Token, chat_messages, text_messages
from ..errors import ResponseError
from ..files import prompt_text
from ..prompts import Messages
from ..types import Capabilities
from ..untrusted import Prompt
from .base import COMPLETIONS, Lists, Tokenizer, entries, optional, register, two_choices
from .lists import Key, PromptLists, top_limit

__all__ = ["VLLM", "TOKENIZER", "detect", "template_call", "learn_controls", "token_prompts", "atomic",
           "control_count"]


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

    def prepare(self, state: EndpointState) -> Flow[None]:
        yield from learn_controls(state)

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

#: A token string that looks like a control token (``<|im_end|>``, ``<start_of_turn>``, ``[INST]``): kept
#: beside the learned tokens, for the template's tokens the atomicity test cannot reach.
_CONTROL_LIKE = re.compile(r"<[|｜]?[^\s<>]{1,40}[|｜]?>|\[/?[A-Z_]{2,30}\]")
_PROBE = (("user", "x"),)
_SKELETON = "control count of the skeleton"  # the rendered-prompt cache's key: (_SKELETON, skeleton, style)


def atomic(token: int, glued: Sequence[Sequence[int]]) -> bool:
    """Whether ``token`` is still there in each tokenization of its text with neighbours glued on.

    >>> atomic(7, [[1, 7, 1], [2, 7, 2]]), atomic(7, [[1, 7, 1], [9, 2]])
    (True, False)
    """
    return all(token in ids for ids in glued)


def control_count(ids: Sequence[int], controls: frozenset[int]) -> int:
    """How many of ``ids`` are control tokens.

    >>> control_count([5, 1, 5, 2], frozenset({5}))
    2
    """
    return sum(i in controls for i in ids)


def _candidate(text: str) -> bool:
    """A template token worth the atomicity test: two characters or more, no surrounding whitespace, not a
    plain word (a word is an ordinary token: it merges with a space before it)."""
    return len(text) >= 2 and text == text.strip() and not text.isalnum()


def learn_controls(state: EndpointState) -> Flow[None]:
    """Once per endpoint: the control tokens of the served tokenizer (``state.controls``, ids) and their
    texts, with any token of the template spelled like one (``state.declared``), neutralised in every span.
    Nothing without vLLM's tokenizer."""
    caps = state.caps
    if caps is None or caps.tokenize != TOKENIZER.name or state.controls is not None:
        return
    [shown] = yield [template_call(caps.model, _PROBE)]
    ids = list(template_of(shown, True))
    strs = shown.get("token_strs") if isinstance(shown, Mapping) else None
    like = {s for s in strs or () if isinstance(s, str) and _CONTROL_LIKE.fullmatch(s)}
    distinct = list(dict.fromkeys(ids))
    decoded = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": [i]}, root=True) for i in distinct]
    texts = {i: d.get("prompt") for i, d in zip(distinct, decoded) if isinstance(d, Mapping)}
    candidates = [(i, t) for i, t in texts.items() if isinstance(t, str) and _candidate(t)]
    variants = [v for _, t in candidates for v in (f" {t} ", f"a{t}a")]
    answers = (yield [TOKENIZER.call(caps.model, v) for v in variants]) if variants else []
    glued = [[i for i, _ in parse_tokens(a)] for a in answers]
    found = {(i, t) for k, (i, t) in enumerate(candidates) if atomic(i, glued[2 * k:2 * k + 2])}
    state.controls = frozenset(i for i, _ in found)
    state.declared = tuple(sorted(like | {t for _, t in found})) or ("",)


def _folded(prompt: Prompt) -> Prompt:
    """``prompt`` with its spans NFKC-folded, so that a tokenizer that normalises text before matching its
    control tokens finds their texts as they will be matched (and neutralised)."""
    return Prompt(prompt.skeleton, tuple(unicodedata.normalize("NFKC", s) for s in prompt.spans))


def _render(caps: Capabilities, messages: Messages, style: str) -> Call:
    """The request that tokenizes ``messages`` in ``style``: the served chat template, or a client-side format."""
    return (template_call(caps.model, messages) if style == "chat"
            else TOKENIZER.call(caps.model, prompt_text(messages, style)))


def _renders(state: EndpointState, caps: Capabilities, prompts: Sequence[tuple[Prompt, str]]) -> list[Call]:
    return [_render(caps, text_messages(state, p, style), style) for p, style in prompts]


def token_prompts(state: EndpointState, caps: Capabilities, keys: Sequence[tuple[Prompt, str]]) -> Flow[None]:
    """vLLM: each prompt as token ids, the chat template from ``/tokenize`` with ``messages`` (a client-side
    format rendered here and tokenized), the spans neutralised against the learned control tokens; each
    prompt checked by id against its skeleton (see the module docstring)."""
    yield from learn_controls(state)
    controls = state.controls or frozenset()
    shapes = [s for s in dict.fromkeys((p.skeleton, style) for p, style in keys) if (_SKELETON, *s) not in state.templates]
    answers = yield [_render(caps, sk, style) for sk, style in shapes] + _renders(state, caps, keys)
    for shape, answer in zip(shapes, answers):
        state.templates[(_SKELETON, *shape)] = control_count(template_of(answer, True), controls)
    rendered = {key: list(template_of(a, True)) for key, a in zip(keys, answers[len(shapes):])}
    allowed = {key: state.templates[(_SKELETON, key[0].skeleton, key[1])] for key in keys}
    over = [key for key in keys if control_count(rendered[key], controls) > allowed[key]]
    if over:
        again = yield _renders(state, caps, [(_folded(p), style) for p, style in over])
        for key, answer in zip(over, again):
            rendered[key] = list(template_of(answer, True))
            if control_count(rendered[key], controls) > allowed[key]:
                raise ResponseError("the served tokenizer makes control tokens of the passages' or the query's text even "
                                    "once it is neutralised; the prompt was not sent")
    for key in keys:
        state.templates[key] = rendered[key]

