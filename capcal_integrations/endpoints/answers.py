"""Reading the endpoints' JSON answers: every shape checked, anything malformed a typed error.

Answers come from any OpenAI-compatible server (llama.cpp, vLLM, SGLang, hosted APIs, and proxies in
between). Their shapes differ (two log-probability shapes, token ids or token texts) and sometimes
break: a string where a number belongs, an object where a list does, a proxy's own JSON. Every reader
here checks what it relies on and raises a :class:`~.errors.ResponseError` that names what was
malformed, with a short excerpt of the answer. None of them lets an ``AttributeError``,
``TypeError``, ``KeyError`` or ``ValueError`` escape (``tests/test_fuzz.py`` feeds them generated
shapes). An *absent* optional part (no ``usage``, no ``logprobs``) is not malformed: it reads as zero
or empty, and the caller says whether that is an error.

A log-probability is a number <= 0 (a rounding margin of ``1e-3`` is read as 0); ``-inf`` and anything
below :data:`LOGPROB_FLOOR` read as the floor, so that sums and renormalisations stay finite (the
probability is 0.0 either way). NaN, ``+inf`` and positive values are malformed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ResponseError, excerpt  # noqa: F401 - excerpt: re-exported (its users import it here)
from ..types import Usage

__all__ = ["LOGPROB_FLOOR", "MAX_ALTERNATIVES", "malformed", "excerpt", "usage_of", "parse_tokens", "wanted_logprobs",
           "top_entries", "choices_of", "first_choice", "template_of", "completion_alternatives", "generated", "Entry",
           "Alternatives", "Generated"]

#: The most alternatives read at one position (the library asks for at most 1000; llama.cpp answers as many).
MAX_ALTERNATIVES = 4096
#: The lowest log-probability kept (exp(-1e4) is 0.0 in floating point).
LOGPROB_FLOOR = -1e4
_ROUNDING = 1e-3

Entry = tuple[int | None, str, float]  # (token id if the server gave one, token text, log-probability)
Alternatives = tuple[tuple[str, float], ...]  # (token text, logprob) at one position, best first
Generated = tuple[tuple[str, Alternatives], ...]  # per generated position: the token chosen, its alternatives




def malformed(what: str, body: Any) -> ResponseError:
    """The error for an answer whose shape is not what the endpoint's API promises.

    >>> str(malformed("'usage' is not an object", {"usage": "n/a"}))
    'malformed answer from the endpoint: \\'usage\\' is not an object; got {"usage": "n/a"}'
    """
    return ResponseError(f"malformed answer from the endpoint: {what}; got {excerpt(body)}", body=body)


def _object(value: Any, what: str, body: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise malformed(f"{what} is not an object", body)
    return value


def _list(value: Any, what: str, body: Any) -> list[Any]:
    if not isinstance(value, list):
        raise malformed(f"{what} is not a list", body)
    return value


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any, what: str, body: Any) -> int:
    """A token count: a non-negative integer (an integral float accepted); absent is 0."""
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if not _integer(value) or value < 0:
        raise malformed(f"{what} is not a non-negative integer", body)
    return value


def _token_id_value(value: Any, what: str, body: Any) -> int:
    if not _integer(value) or value < 0:
        raise malformed(f"{what} is not a token id (an integer >= 0)", body)
    return value


def logprob(value: Any, what: str, body: Any) -> float:
    """A log-probability (see the module docstring): clamped into ``[LOGPROB_FLOOR, 0]``.

    >>> logprob(-0.5, "x", None), logprob(float("-inf"), "x", None), logprob(1e-6, "x", None)
    (-0.5, -10000.0, 0.0)
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise malformed(f"{what} is not a number", body)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        raise malformed(f"{what} is not a log-probability (a number <= 0)", body) from None
    if math.isnan(number) or number > _ROUNDING:
        raise malformed(f"{what} is not a log-probability (a number <= 0)", body)
    return min(max(number, LOGPROB_FLOOR), 0.0)


def usage_of(answer: Any) -> Usage:
    """Token counts a server reported in one answer (zeros when it reported none)."""
    usage = answer.get("usage") if isinstance(answer, Mapping) else None
    if usage is None:
        return Usage(requests=1)
    usage = _object(usage, "'usage'", answer)
    details = usage.get("prompt_tokens_details")
    cached = _count(_object(details, "'usage.prompt_tokens_details'", answer).get("cached_tokens"),
                    "'usage.prompt_tokens_details.cached_tokens'", answer) if details is not None else 0
    return Usage(1, _count(usage.get("prompt_tokens"), "'usage.prompt_tokens'", answer),
                 _count(usage.get("completion_tokens"), "'usage.completion_tokens'", answer), cached)


def parse_tokens(answer: Any) -> list[tuple[int, str]]:
    """``(id, piece)`` pairs from llama.cpp's (``with_pieces``: objects, a piece as text or as a list of
    bytes) or vLLM's (ids, and ``token_strs`` when asked) ``/tokenize`` answer."""
    tokens = _list(answer.get("tokens") if isinstance(answer, Mapping) else None, "a /tokenize answer's 'tokens'",
                   answer)
    if tokens and isinstance(tokens[0], Mapping):  # llama.cpp with_pieces
        out = []
        for t in tokens:
            t = _object(t, "a /tokenize token", answer)
            out.append((_token_id_value(t.get("id"), "a /tokenize token's 'id'", answer), _piece(t.get("piece"), answer)))
        return out
    ids = [_token_id_value(t, "a /tokenize token", answer) for t in tokens]
    pieces = answer.get("token_strs")
    if pieces is None:
        return [(i, "") for i in ids]
    if not (isinstance(pieces, list) and len(pieces) == len(ids) and all(isinstance(p, str) for p in pieces)):
        raise malformed("a /tokenize answer's 'token_strs' is not one string per token", answer)
    return list(zip(ids, pieces))


def _piece(piece: Any, body: Any) -> str:
    """llama.cpp gives a piece that is not valid UTF-8 on its own as its list of bytes."""
    if isinstance(piece, str):
        return piece
    if isinstance(piece, list) and all(_integer(b) and 0 <= b < 256 for b in piece):
        return bytes(piece).decode("utf-8", "replace")
    raise malformed("a /tokenize token's 'piece' is neither text nor a list of bytes", body)


def wanted_logprobs(choices: Sequence[Any], wants: Sequence[Sequence[tuple[int, str]]]
                    ) -> list[tuple[dict[tuple[int, str], float], float]]:
    """Per choice, the wanted ``(id, piece)`` tokens among its first-position alternatives (by id where the
    server gave ids, else by text) with their logprobs, and the smallest logprob returned (an upper bound for
    any token not returned); a :class:`~..errors.ResponseError` for a choice without top log-probabilities."""
    out = []
    for choice, want in zip(choices, wants):
        entries = top_entries(choice)
        if not entries:
            raise ResponseError("the answer carries no top log-probabilities", body=choice)
        by_id = {i: v for i, _, v in entries if i is not None}
        by_piece: dict[str, float] = {}
        for _, piece, value in entries:
            by_piece[piece] = max(value, by_piece.get(piece, float("-inf")))
        values = [(token, by_id.get(token[0]) if by_id else by_piece.get(token[1])) for token in want]
        out.append(({token: v for token, v in values if v is not None}, min(v for _, _, v in entries)))
    return out


def top_entries(choice: Any) -> list[Entry]:
    """``(id, piece, logprob)`` of the first generated position, from either logprob shape (``content``
    lists, legacy ``top_logprobs`` dicts keyed by text or vLLM's ``"token_id:N"``); ``[]`` when the
    choice carries no log-probabilities."""
    if choice is None:
        return []
    choice = _object(choice, "a choice", choice)
    lp = choice.get("logprobs")
    if lp is None:
        return []
    lp = _object(lp, "a choice's 'logprobs'", choice)
    content = lp.get("content")
    if content is not None and _list(content, "'logprobs.content'", choice):
        return position_entries(content[0], choice)
    legacy = lp.get("top_logprobs")
    if legacy is None or not _list(legacy, "'logprobs.top_logprobs'", choice) or legacy[0] is None:
        return []
    first = _bounded(_object(legacy[0], "'logprobs.top_logprobs[0]'", choice), choice)
    return [(_token_id(_text(piece, "a 'top_logprobs' key", choice)), piece,
             logprob(value, f"the logprob of {piece!r}", choice)) for piece, value in first.items() if value is not None]


def position_entries(position: Any, body: Any) -> list[Entry]:
    """The alternatives of one position of a ``content`` list (entries without a logprob skipped)."""
    position = _object(position, "a 'logprobs.content' position", body)
    tops = position.get("top_logprobs")
    if tops is None:
        return []
    out = []
    for e in _bounded(_list(tops, "a position's 'top_logprobs'", body), body):
        e = _object(e, "a 'top_logprobs' entry", body)
        if e.get("logprob") is None:
            continue
        token_id = e.get("id")
        out.append((None if token_id is None else _token_id_value(token_id, "a 'top_logprobs' entry's 'id'", body),
                    _text(e.get("token", ""), "a 'top_logprobs' entry's 'token'", body),
                    logprob(e["logprob"], "a 'top_logprobs' entry's 'logprob'", body)))
    return out


def _bounded(alternatives: Any, body: Any) -> Any:
    """``alternatives`` of one position, refused when there are more than :data:`MAX_ALTERNATIVES`."""
    if len(alternatives) > MAX_ALTERNATIVES:
        raise ResponseError(f"malformed answer from the endpoint: {len(alternatives)} alternatives at one position, "
                            f"above the bound of {MAX_ALTERNATIVES} (MAX_ALTERNATIVES); got {excerpt(body)}", body=None)
    return alternatives


def _text(value: Any, what: str, body: Any) -> str:
    if not isinstance(value, str):
        raise malformed(f"{what} is not text", body)
    return value


def _token_id(key: str) -> int | None:
    """vLLM's ``return_tokens_as_token_ids`` keys are ``"token_id:123"`` (ASCII digits only).

    >>> _token_id("token_id:508"), _token_id(" ["), _token_id("token_id:²")
    (508, None, None)
    """
    digits = key[9:]
    return int(digits) if key.startswith("token_id:") and digits.isascii() and digits.isdigit() else None


def choices_of(answer: Any, asked: int) -> list[Mapping[str, Any]]:
    """The choices of a completions answer to ``asked`` prompts, in prompt order (by ``index``, which
    must number them ``0..n-1``; without indices, in the order given)."""
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    choices = [] if choices is None else _list(choices, "'choices'", answer)
    for c in choices:
        _object(c, "a choice", answer)
    indices = [c.get("index", k) for k, c in enumerate(choices)]
    if not all(_integer(i) for i in indices) or sorted(indices) != list(range(len(choices))):
        raise malformed("the choices' indices do not number them 0..n-1", answer)
    if len(choices) != asked:
        raise ResponseError(f"asked for {asked} completions, got {len(choices)}: {excerpt(answer)}", body=answer)
    return [c for _, c in sorted(zip(indices, choices), key=lambda e: e[0])]


def first_choice(answer: Any) -> Mapping[str, Any] | None:
    """The first choice of a chat answer, or ``None`` when it has none."""
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if choices is None:
        return None
    choices = _list(choices, "'choices'", answer)
    return _object(choices[0], "a choice", answer) if choices else None


def template_of(answer: Any, tokens: bool) -> Any:
    """The rendered chat template: token ids (vLLM's ``/tokenize`` with ``messages``) or text
    (llama.cpp's ``/apply-template``)."""
    if tokens:
        ids = answer.get("tokens") if isinstance(answer, Mapping) else None
        if isinstance(ids, list) and ids and all(_integer(i) and i >= 0 for i in ids):
            return tuple(ids)
        raise malformed("the chat template's /tokenize answer has no list of token ids", answer)
    prompt = answer.get("prompt") if isinstance(answer, Mapping) else None
    if not isinstance(prompt, str):
        raise malformed("the /apply-template answer has no 'prompt' text", answer)
    return prompt


def alternatives(entries: Sequence[Entry]) -> Alternatives:
    return tuple(sorted(((piece, value) for _, piece, value in entries), key=lambda e: -e[1]))


def completion_alternatives(answer: Any, asked: int) -> list[Alternatives]:
    """The top next tokens of each of the ``asked`` prompts of a text ``/v1/completions`` answer."""
    out = [alternatives(top_entries(c)) for c in choices_of(answer, asked)]
    if not all(out):
        raise ResponseError(f"a completion carries no top log-probabilities: {excerpt(answer)}", body=answer)
    return out


def generated(answer: Any, logprobs: bool) -> Generated:
    """An ordinary chat completion: per generated position, the token and its alternatives (read from
    ``logprobs.content``), or without ``logprobs`` the answer's text as one position."""
    choice = first_choice(answer)
    if not logprobs:
        message = None if choice is None else choice.get("message")
        text = None if message is None else _object(message, "a choice's 'message'", answer).get("content")
        if not isinstance(text, str):
            raise ResponseError(f"the chat completion carries no answer: {excerpt(answer)}", body=answer)
        return ((text, ()),)
    lp = None if choice is None else choice.get("logprobs")
    content = None if lp is None else _object(lp, "a choice's 'logprobs'", answer).get("content")
    if content is not None:
        _list(content, "'logprobs.content'", answer)
    if not content:
        raise ResponseError(f"the chat completion carries no per-token log-probabilities: {excerpt(answer)}",
                            body=answer)
    out = []
    for position in content:
        entries = position_entries(position, answer)
        out.append((_text(position.get("token", ""), "a position's 'token'", answer), alternatives(entries)))
    return tuple(out)
