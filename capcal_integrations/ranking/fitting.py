"""What the prompt shows of each passage: cleaned, and cut so that the widest window fits the context.

Untrusted text is cleaned of identifier look-alikes (:func:`~.prompts.clean_passage`; the ``release``
preset sends them verbatim, as the authors' code does), then cut by characters (at a space where there is one
near the cut, so text without spaces, CJK or base64, is cut as well as prose) until the prompt of the
longest passages fits the context. Every cut is said in the ranking's notes, and so is every passage whose
text the model reads rewritten (look-alikes, control-token text: :func:`rewritten_notes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..endpoints import kind_of, tokenize
from ..endpoints.calls import EndpointState, Flow, text_messages
from ..errors import InputError
from ..options import Options
from ..prompts.files import declared_tokens
from ..prompts.render import clean_passage, labels, passage_text, render_prompt
from ..prompts.untrusted import Prompt, clean_text, neutralise
from ..types import Document

__all__ = ["fit", "cleaned"]


def fit(state: EndpointState, opts: Options, query: str, docs: Sequence[Document]) -> Flow[tuple[list[str], list[str]]]:
    """Clean every passage and cut them so the widest window's prompt fits the context; and notes that
    say what was cut. Passages are cut by characters (at a space where there is one near the cut), so
    text without spaces (CJK, base64) is cut as well as prose."""
    caps = state.caps
    assert caps is not None
    n, context = len(docs), opts.max_context or caps.context or 4096
    width = min(opts.window, n)
    budget = context - (6 * width + 64)  # room for the chat template and a full ranking
    given = [passage_text(d, "release" if opts.preset == "release" else "rankgpt") for d in docs]
    whole = [cleaned(opts, t) for t in given]
    texts = [clean_passage(t, opts.max_passage_words) for t in whole] if opts.max_passage_words else list(whole)
    yield from kind_of(caps).prepare(state, [query, *whole])  # the served tokenizer's control tokens, before counting
    notes = rewritten_notes(opts, state.declared + declared_tokens(opts.prompt), query, given, whole)
    if cut := sum(a != b for a, b in zip(whole, texts)):
        notes.append(f"{cut} of {n} passages cut to max_passage_words={opts.max_passage_words} words")
    words_cut, ids, overhead = list(texts), labels(width, opts.labels), None
    for _ in range(8):
        longest = sorted(texts, key=len, reverse=True)[:width]
        size = yield from _size(state, opts, render_prompt(opts.template, query, longest, ids))
        if size <= budget:
            if cut := sum(a != b for a, b in zip(words_cut, texts)):
                notes.append(f"{cut} of {n} passages cut to {max(map(len, texts))} characters so that {width} fit the "
                             f"{context}-token context")
            return texts, notes
        if overhead is None:
            overhead = yield from _size(state, opts, render_prompt(opts.template, query, [""] * width, ids))
        room = budget - overhead
        if room < 4 * width:
            break
        chars = int(room / max(size - overhead, 1) * sum(map(len, longest)) / width * 0.9)
        texts = [_cut(t, chars) for t in texts]
    raise InputError(f"the query and {width} passages do not fit a {context}-token context (the prompt without "
                     f"passages takes {overhead} tokens); shorten the query, lower window or raise max_context")


def rewritten_notes(opts: Options, declared: Sequence[str], query: str, given: Sequence[str], shown: Sequence[str]
                    ) -> list[str]:
    """The note counting the passages whose text the model reads otherwise than it was given (beyond the
    whitespace collapsed by cleaning and the cuts, which have their own notes): identifier look-alikes written
    in parentheses (:func:`~.prompts.defuse_identifiers`) or control-token text defused
    (:func:`~.untrusted.neutralise`, with this endpoint's ``declared`` tokens); and one for the query.

    >>> from capcal_integrations.options import Options
    >>> given = ["a [1][2] citation", "plain text", "<s>strike</s>", "x <|im_end|>"]
    >>> [note] = rewritten_notes(Options(), (), "q", given, [cleaned(Options(), t) for t in given])
    >>> note.split(" (")[0]
    '3 of 4 passages were sent with identifier look-alikes or control-token text rewritten'

    """
    def plain(text: str) -> str:
        return clean_text(text) if opts.preset == "release" else " ".join(clean_text(text).split())

    count = sum(neutralise(s, declared) != plain(g) for g, s in zip(given, shown))
    notes = [f"{count} of {len(given)} passages were sent with identifier look-alikes or control-token text rewritten "
             "(the documents returned are the originals)"] if count else []
    if neutralise(query, declared) != query:
        notes.append("the query was sent with control-token text rewritten")
    return notes


def cleaned(opts: Options, text: str) -> str:
    """Untrusted text as the prompt shows it: :func:`~.prompts.clean_passage` d, or, for the ``release``
    preset, as the authors' code sends it (only the characters of the library's span markers removed)."""
    return clean_text(text) if opts.preset == "release" else clean_passage(text, None)


def _size(state: EndpointState, opts: Options, prompt: Prompt) -> Flow[int]:
    """The prompt's length in the served model's tokens (about a third of its characters without a
    tokenizer), measured on its text as text routes send it (neutralised)."""
    text = "\n".join(content for _, content in text_messages(state, prompt, opts.prompt))
    if not state.caps or not state.caps.tokenize:
        return len(text) // 3
    [tokens] = yield from tokenize(state.caps, [text])
    return len(tokens)


def _cut(text: str, chars: int) -> str:
    """``text`` cut to at most ``chars`` characters, at the last space in the last fifth if there is one.

    >>> _cut("one two three four", 9), _cut("一二三四五六", 4), _cut("short", 10)
    ('one two', '一二三四', 'short')
    """
    if len(text) <= chars:
        return text
    head = text[:max(chars, 1)]
    space = head.rfind(" ", int(chars * 0.8))
    return (head[:space] if space > 0 else head).rstrip()
