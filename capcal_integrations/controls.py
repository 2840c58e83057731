"""vLLM's control tokens, learned from the served tokenizer, and the prompts checked against them by id.

vLLM's tokenizer matches control tokens in any text it is given and has no switch to stop it, so on its
token-id route (``token-completions``) untrusted spans go as neutralised text (:func:`~.protocol.text_messages`).
Which tokens to neutralise is not guessed from their spelling (MiniMax's ``]~b]``, GLM's ``[gMASK]`` look like
no other family's): it is learned once per endpoint (:func:`learn_controls`) from how the served tokenizer
treats the tokens of its own chat template. A control token is *atomic*: the tokenizer matches its text
wherever it stands, so it survives a space or a letter glued to either side (`` ]~b] `` and ``a]~b]a`` still
hold ``]~b]``), where an ordinary multi-character token merges with its neighbours (`` user`` is another
token than ``user``). Those tokens' texts are neutralised in every span, and each prompt is then checked by
id (:func:`token_prompts`): it must hold no more control tokens than its skeleton (the template with no user
text) does. A prompt that holds more (a tokenizer that normalises text before matching, say) is sent with its
spans NFKC-folded and neutralised again, and refused with a :class:`~.errors.ResponseError` if that does not
hold either. Endpoints that expose no tokenizer keep the deny-list (:data:`~.untrusted.KNOWN_CONTROL`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence

from .answers import parse_tokens
from .answers import template_of as _template_of
from .calls import Call, EndpointState, Flow, template_call, text_messages, tokenize_call
from .errors import ResponseError
from .prompts import Messages, prompt_text
from .types import Capabilities
from .untrusted import Prompt

__all__ = ["learn_controls", "token_prompts", "atomic", "control_count"]

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
    """On vLLM's token-id route, once per endpoint: the control tokens of the served tokenizer
    (``state.controls``, ids) and their texts, with any token of the template spelled like one
    (``state.declared``), neutralised in every span. Nothing on other routes."""
    caps = state.caps
    if caps is None or caps.transport != "token-completions" or caps.tokenize != "vllm" or state.controls is not None:
        return
    [shown] = yield [template_call(caps.model, _PROBE, tokens=True)]
    ids = list(_template_of(shown, True))
    strs = shown.get("token_strs") if isinstance(shown, Mapping) else None
    like = {s for s in strs or () if isinstance(s, str) and _CONTROL_LIKE.fullmatch(s)}
    distinct = list(dict.fromkeys(ids))
    decoded = yield [Call("POST", "/detokenize", {"model": caps.model, "tokens": [i]}, root=True) for i in distinct]
    texts = {i: d.get("prompt") for i, d in zip(distinct, decoded) if isinstance(d, Mapping)}
    candidates = [(i, t) for i, t in texts.items() if isinstance(t, str) and _candidate(t)]
    variants = [v for _, t in candidates for v in (f" {t} ", f"a{t}a")]
    answers = (yield [tokenize_call("vllm", caps.model, v) for v in variants]) if variants else []
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
    return (template_call(caps.model, messages, tokens=True) if style == "chat"
            else tokenize_call("vllm", caps.model, prompt_text(messages, style)))


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
        state.templates[(_SKELETON, *shape)] = control_count(_template_of(answer, True), controls)
    rendered = {key: list(_template_of(a, True)) for key, a in zip(keys, answers[len(shapes):])}
    allowed = {key: state.templates[(_SKELETON, key[0].skeleton, key[1])] for key in keys}
    over = [key for key in keys if control_count(rendered[key], controls) > allowed[key]]
    if over:
        again = yield _renders(state, caps, [(_folded(p), style) for p, style in over])
        for key, answer in zip(over, again):
            rendered[key] = list(_template_of(answer, True))
            if control_count(rendered[key], controls) > allowed[key]:
                raise ResponseError("the served tokenizer makes control tokens of the passages' or the query's text even "
                                    "once it is neutralised; the prompt was not sent")
    for key in keys:
        state.templates[key] = rendered[key]

