"""Control tokens learned from the served tokenizer, not from the chat template alone (vLLM, SGLang).

A tokenizer matches its control tokens (special and added tokens) in any text it is given: ``[sMASK]`` in a
passage reaches a GLM model as its control token. Which tokens those are is learned here, once per token id,
from how the served tokenizer treats the id's text: a control token is *atomic*: it survives a space or a letter
glued to either side (`` [sMASK] `` and ``a[sMASK]a`` still hold it), where an ordinary multi-character token
merges with its neighbours. Two sources of ids are tested:

* the chat template's tokens (:func:`learn_template`, once per endpoint): the controls the template uses;
* every id found in the rendered prompts that was not tested before (:func:`learn_found`): the controls the
  template does not use (GLM's ``[sMASK]``, ``<eop>``; MiniMax's ``]!d~[``; Qwen's ``<tool_call>``), which a
  passage can spell. Each id is tested once per endpoint (``state.tested``, bounded).

What is found goes to ``state.controls`` (ids: every prompt is checked by them, :mod:`.vllm`'s
``token_prompts``) and ``state.declared`` (texts: neutralised in every span, :func:`~..calls.text_messages`).

**Bounded work**: what one answer set may cost does not grow with what the server answers: at most
:data:`MAX_IDS` distinct ids are read and :data:`MAX_CANDIDATES` tested (a :class:`~..errors.ResponseError`
naming the bound past it), each with a constant number of requests (the dialect's: vLLM one ``/detokenize``
and two ``/tokenize`` per candidate, SGLang two requests in all).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..errors import ResponseError
from ..prompts.render import Messages
from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .answers import template_of
from .base import optional
from .calls import Call, EndpointState, Flow, text_messages

__all__ = ["MAX_IDS", "MAX_CANDIDATES", "TESTED_MAX", "Dialect", "atomic", "candidate", "plausible", "learn",
           "found_in", "control_count", "learn_template", "learn_texts", "checked_prompts", "DIALECTS"]

MAX_IDS = 4096  # distinct token ids read from one answer set (a chat template of one word has tens)
MAX_CANDIDATES = 256  # ids tested for atomicity per answer set
TESTED_MAX = 1 << 16  # ids remembered as tested per endpoint (then forgotten, and tested again when seen)
_MARKS = ("Ġ", "▁", "Ċ", "ĉ")  # a byte-level or SentencePiece token that starts with a space, newline or tab mark


class Dialect(Protocol):
    """What a tokenizer dialect provides to the test: the request that renders the chat template as ids and
    the one that tokenizes a text (its answer with ``tokens``, and ``token_strs`` where the server has them),
    each id's text, and the ids of texts."""

    def template(self, caps: Capabilities) -> Call: ...

    def call(self, caps: Capabilities, text: str) -> Call: ...

    def texts(self, caps: Capabilities, ids: Sequence[int]) -> Flow[dict[int, str]]: ...

    def tokenized(self, caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]: ...


#: The dialects by tokenizer name (``Capabilities.tokenize``), registered by their endpoint kinds' modules.
DIALECTS: dict[str, Dialect] = {}


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


def candidate(text: Any) -> bool:
    """A token text worth the atomicity test: two characters or more, no surrounding whitespace, not a plain
    word (a word is an ordinary token: it merges with a space before it).

    >>> [candidate(t) for t in ("[sMASK]", "]!d~[", "<eop>", "user", " x", "a", "()")]
    [True, True, True, False, False, False, True]
    """
    return isinstance(text, str) and len(text) >= 2 and text == text.strip() and not text.isalnum()


def plausible(symbol: Any) -> bool:
    """Whether a token's symbol (vLLM's ``token_strs``: the tokenizer's own spelling) may be a control token's:
    ``None`` (not known) or a :func:`candidate` that does not start with a space, newline or tab mark.

    >>> [plausible(s) for s in (None, "[sMASK]", "<｜begin▁of▁sentence｜>", "Ġ[", "▁the", "hello")]
    [True, True, True, False, False, False]
    """
    return symbol is None or (candidate(symbol) and not symbol.startswith(_MARKS))


def found_in(answers: Sequence[Any]) -> dict[int, str | None]:
    """Each distinct id of ``/tokenize`` answers (``tokens``, and ``token_strs`` where given), with its symbol."""
    out: dict[int, str | None] = {}
    for answer in answers:
        ids = answer.get("tokens") if isinstance(answer, Mapping) else None
        strs = answer.get("token_strs") if isinstance(answer, Mapping) else None
        if not isinstance(ids, list):
            continue
        strs = strs if isinstance(strs, list) and len(strs) == len(ids) else [None] * len(ids)
        for i, s in zip(ids, strs):
            if isinstance(i, int) and i not in out:
                out[i] = s if isinstance(s, str) else None
    return out


def learn(state: EndpointState, caps: Capabilities, dialect: Dialect, found: Mapping[int, str | None],
          where: str) -> Flow[bool]:
    """Test the ids of ``found`` (id -> symbol) not tested yet on this endpoint; add the atomic ones to
    ``state.controls`` and their texts to ``state.declared``. Whether any was added. ``where`` names the
    answers in a bound's error."""
    tested = state.tested
    fresh = {i: s for i, s in found.items() if i not in tested and i not in (state.controls or ())}
    if len(fresh) > MAX_IDS:
        raise ResponseError(f"{where}: {len(fresh)} distinct token ids, more than the bound of {MAX_IDS} (MAX_IDS) "
                            "tested for control tokens")
    ids = [i for i, s in fresh.items() if plausible(s)]
    if len(ids) > MAX_CANDIDATES:
        raise ResponseError(f"{where}: {len(ids)} token kinds to test for control tokens, more than the bound of "
                            f"{MAX_CANDIDATES} (MAX_CANDIDATES) per answer")
    texts = (yield from dialect.texts(caps, ids)) if ids else {}
    candidates = [(i, t) for i, t in texts.items() if candidate(t)]
    variants = [v for _, t in candidates for v in (f" {t} ", f"a{t}a")]
    glued = (yield from dialect.tokenized(caps, variants)) if variants else []
    new = [(i, t) for k, (i, t) in enumerate(candidates) if atomic(i, glued[2 * k:2 * k + 2])]
    if len(tested) + len(fresh) > TESTED_MAX:
        tested.clear()
    tested.update(fresh)
    if not new:
        return False
    state.learned(controls=frozenset(state.controls or ()) | {i for i, _ in new},
                  declared=tuple(sorted({*state.declared, *(t for _, t in new)} - {""})) or ("",))
    return True


#: A token symbol that looks like a control token (``<|im_end|>``, ``<start_of_turn>``, ``[INST]``): declared
#: beside the learned ones, for the template's tokens the atomicity test cannot reach.
_CONTROL_LIKE = re.compile(r"<[|｜]?[^\s<>]{1,40}[|｜]?>|\[/?[A-Z_]{2,30}\]")
_SKELETON = "control count of the skeleton"  # the rendered-prompt cache's key: (_SKELETON, skeleton, style, k)
_ROUNDS = 3  # renderings of one set of prompts at most: what is learned from one may show more in the next


def learn_template(state: EndpointState, caps: Capabilities, dialect: Dialect) -> Flow[None]:
    """Once per endpoint: the control tokens of the served chat template (``/tokenize`` with ``messages``), with
    any of its symbols spelled like one, neutralised in every span from then on."""
    if state.controls is not None:
        return
    shown = yield from optional(dialect.template(caps))
    if shown is None:  # a server that renders no template as ids (SGLang without messages in /tokenize)
        state.learned(controls=frozenset())
        return
    template_of(shown, True)  # a list of ids, or a ResponseError
    strs = shown.get("token_strs") if isinstance(shown, Mapping) else None
    like = {s for s in strs or () if isinstance(s, str) and _CONTROL_LIKE.fullmatch(s)}
    yield from learn(state, caps, dialect, found_in([shown]), "the chat template's /tokenize answer")
    state.learned(controls=state.controls or frozenset(),
                  declared=tuple(sorted({*state.declared, *like} - {""})) or ("",))


def learn_texts(state: EndpointState, caps: Capabilities, texts: Sequence[str]) -> Flow[None]:
    """Where untrusted text goes to the server as text and no prompt comes back as ids (chat routes on a server
    with vLLM's or SGLang's tokenizer): the template's controls, then each text tokenized by the served
    tokenizer and its ids not tested before tested (:func:`learn`), so that a control the template does not use
    is neutralised too. Nothing where the server has no such tokenizer (the deny-list alone)."""
    dialect = DIALECTS.get(caps.tokenize or "")
    if dialect is None:
        return
    yield from learn_template(state, caps, dialect)
    distinct = [t for t in dict.fromkeys(texts) if t]
    answers = (yield [dialect.call(caps, t) for t in distinct]) if distinct else []
    yield from learn(state, caps, dialect, found_in(answers), "the passages' /tokenize answers")


def _folded(prompt: Prompt) -> Prompt:
    """``prompt`` with its spans NFKC-folded, so that a tokenizer that normalises text before matching its
    control tokens finds their texts as they will be matched (and neutralised)."""
    return Prompt(prompt.skeleton, tuple(unicodedata.normalize("NFKC", s) for s in prompt.spans))


Render = Callable[[Capabilities, Messages, str], Call]  # the request that tokenizes messages in a prompt format


def checked_prompts(state: EndpointState, caps: Capabilities, keys: Sequence[tuple[Prompt, str]], dialect: Dialect,
                    render: Render) -> Flow[None]:
    """Each prompt of ``keys`` as token ids in ``state.templates``, its spans neutralised against the control
    tokens learned so far; the ids of the rendered prompts not tested before are tested (:func:`learn`), and
    the prompts rendered again when that found more. Each prompt is then checked by id: it must hold no more
    control tokens than its skeleton (the template with no user text); one that holds more (a tokenizer that
    normalises text before matching) is rendered with its spans NFKC-folded, and refused with a
    :class:`~..errors.ResponseError` if that does not hold either."""
    def renders(prompts: Sequence[tuple[Prompt, str]]) -> list[Call]:
        return [render(caps, text_messages(state, p, style), style) for p, style in prompts]

    for _ in range(_ROUNDS):
        answers = yield renders(keys)
        if not (yield from learn(state, caps, dialect, found_in(answers), "the prompts' /tokenize answers")):
            break
    controls = state.controls or frozenset()
    shapes = [s for s in dict.fromkeys((p.skeleton, style) for p, style in keys)
              if (_SKELETON, *s, len(controls)) not in state.templates]
    skeletons = (yield [render(caps, sk, style) for sk, style in shapes]) if shapes else []
    for shape, answer in zip(shapes, skeletons):
        state.templates[(_SKELETON, *shape, len(controls))] = control_count(template_of(answer, True), controls)
    rendered = {key: list(template_of(a, True)) for key, a in zip(keys, answers)}
    allowed = {key: state.templates[(_SKELETON, key[0].skeleton, key[1], len(controls))] for key in keys}
    over = [key for key in keys if control_count(rendered[key], controls) > allowed[key]]
    if over:
        again = yield renders([(_folded(p), style) for p, style in over])
        for key, answer in zip(over, again):
            rendered[key] = list(template_of(answer, True))
            if control_count(rendered[key], controls) > allowed[key]:
                raise ResponseError("the served tokenizer makes control tokens of the passages' or the query's text even "
                                    "once it is neutralised; the prompt was not sent")
    for key in keys:
        state.templates[key] = rendered[key]
