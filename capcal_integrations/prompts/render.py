"""Listwise prompts: the RankZephyr/RankGPT single-turn template, identifiers, passage cleaning.

A prompt is a tuple of chat messages; the *empty* prompt is the same template with every passage
body replaced by a placeholder (same query, same identifiers, same length of list).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError
from ..types import Document
from .untrusted import Prompt, clean_text, marker

__all__ = ["PromptTemplate", "RANK_ZEPHYR", "RANK_GPT", "CAPCAL", "NO_EXAMPLE", "DEFAULT_PLACEHOLDER",
           "RELEASE_PLACEHOLDER", "QUERY_PLACEHOLDER", "labels", "clean_passage",
           "defuse_identifiers", "render", "render_prompt", "raw_text", "PROMPT_FORMATS", "Messages"]

#: The content-free passage of the reference release's configuration (``ExpConfig``).
DEFAULT_PLACEHOLDER = "This is a placeholder passage for bias testing."
#: The same, as the release's command line passes it (no final period): the ``release`` preset's.
RELEASE_PLACEHOLDER = "This is a placeholder passage for bias testing"
#: The query of a query-free reading (:mod:`.query_contrast`): the passage placeholder's counterpart.
QUERY_PLACEHOLDER = "This is a placeholder query for bias testing."

Messages = tuple[tuple[str, str], ...]  # (role, content) pairs; hashable so they can key caches


@dataclass(frozen=True)
class PromptTemplate:
    """A single-turn listwise template. Fields may use ``{num}`` and ``{query}``; ``passage`` also
    ``{label}`` (e.g. ``[3]``) and ``{text}``."""

    system: str
    head: str
    passage: str
    tail: str
    name: str = "custom"


RANK_ZEPHYR = PromptTemplate(
    name="rank_zephyr",
    system="You are RankLLM, an intelligent assistant that can rank passages based on their relevancy to the query.",
    head=(
        "I will provide you with {num} passages, each indicated by a numerical identifier []. "
        "Rank the passages based on their relevance to the search query: {query}.\n\n"
    ),
    passage="{label} {text}\n",
    tail=(
        "\nSearch Query: {query}.\n"
        "Rank the {num} passages above based on their relevance to the search query. All the passages "
        "should be included and listed using identifiers, in descending order of relevance. The output "
        "format should be [] > [], e.g., [2] > [1], Answer concisely and directly and only respond with "
        "the ranking results, do not say any word or explain."
    ),
)

RANK_GPT = PromptTemplate(
    name="rank_gpt",
    system="You are RankGPT, an intelligent assistant that can rank passages based on their relevancy to the query.",
    head=(
        "I will provide you with {num} passages, each indicated by number identifier []. \n"
        "Rank the passages based on their relevance to query: {query}.\n\n"
    ),
    passage="{label} {text}\n",
    tail=(
        "\nSearch Query: {query}. \n"
        "Rank the {num} passages above based on their relevance to the search query. The passages should "
        "be listed in descending order using identifiers. The most relevant passages should be listed "
        "first. The output format should be [] > [], e.g., [1] > [2]. Only response the ranking results, "
        "do not say any word or explain."
    ),
)

#: The CapCal release's own prompt (``code/src/BaseConfig.py``, ``ModelConfig.prompt_format``): RankZephyr's
#: wording without its blank lines, a missing space after "query." and the example ``[4] > [2]``. The
#: release sends it as raw text with plain tags (``prompt="raw"``, :func:`raw_text`), not through the
#: model's chat template.
CAPCAL = PromptTemplate(
    name="capcal",
    system="You are RankLLM, an intelligent assistant that can rank passages based on their relevancy to the query.",
    head=(
        "I will provide you with {num} passages, each indicated by a numerical identifier [].\n"
        "Rank the passages based on their relevance to the search query: {query}.\n"
    ),
    passage="{label} {text}\n",
    tail=(
        "Search Query: {query}.\n"
        "Rank the {num} passages above based on their relevance to the search query.All the passages should "
        "be included and listed using identifiers, in descending order of relevance. The output format "
        "should be [] > [], e.g., [4] > [2]. Only respond with the ranking results, do not say any word or explain."
    ),
)

#: RankZephyr's prompt without its example ranking: it names no concrete identifier, so a model that
#: cannot read the passages has no ``[2] > [1]`` to copy.
NO_EXAMPLE = PromptTemplate(
    name="no_example",
    system=RANK_ZEPHYR.system,
    head=RANK_ZEPHYR.head,
    passage=RANK_ZEPHYR.passage,
    tail=(
        "\nSearch Query: {query}.\n"
        "Rank the {num} passages above based on their relevance to the search query. All the passages "
        "should be included and listed using identifiers, in descending order of relevance, each exactly "
        "once, separated by >. Answer concisely and directly and only respond with the ranking results, "
        "do not say any word or explain."
    ),
)

TEMPLATES = {t.name: t for t in (RANK_ZEPHYR, RANK_GPT, CAPCAL, NO_EXAMPLE)}


def resolve_template(template: PromptTemplate | str) -> PromptTemplate:
    """A template object, or one of :data:`TEMPLATES` by name."""
    if isinstance(template, PromptTemplate):
        return template
    if template not in TEMPLATES:
        raise InputError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)} or pass a PromptTemplate")
    return TEMPLATES[template]

#: Brackets a reader (or a tokenizer after NFKC) could take for an identifier's: ASCII, full-width, CJK
#: lenticular and tortoise-shell, white square, vertical and small presentation forms, quill and tick forms,
#: angle, light tortoise-shell and black tortoise-shell ornaments (``⟨7⟩``, ``❲7❳``, ``⦗7⦘``, ``〈7〉``).
_OPENING = "[［【〔〖〘〚⟦⟬⦋⦍⦏⁅﹇﹝︹︻︗⸢⸤⟨❲⦗〈⟪❬❮❰〈⦑⧼"
_CLOSING = "]］】〕〗〙〛⟧⟭⦌⦎⦐⁆﹈﹞︺︼︘⸣⸥⟩❳⦘〉⟫❭❯❱〉⦒⧽"
#: Characters that show as blank but are letters or symbols to Unicode (Hangul and braille fillers, Khmer and
#: Mongolian invisible vowels): dropped inside a bracket like spaces (``[ㅤ7]``, ``[ᅠ7]``, ``[⠀7]``).
_BLANK = frozenset("\u3164\uffa0\u2800\u115f\u1160\u17b4\u17b5\u180e")
#: A candidate: an opening bracket, a few characters (spaces, zero-width characters, digits of any form),
#: a closing bracket; :func:`_identifier` decides whether it is one.
_BRACKETED = re.compile(f"[{re.escape(_OPENING)}]([^{re.escape(_OPENING + _CLOSING)}\\n]{{1,24}})[{re.escape(_CLOSING)}]")
_IDENTIFIER = re.compile(r"\d{1,6}|[A-Za-z]")

def labels(n: int, style: str = "numeric") -> list[str]:
    """Identifiers for ``n`` passages: ``[1]``..``[n]`` or ``[A]``..; alphabetic allows at most 26.

    >>> labels(3), labels(2, "alpha")
    (['[1]', '[2]', '[3]'], ['[A]', '[B]'])
    """
    if style == "numeric":
        return [f"[{i}]" for i in range(1, n + 1)]
    if style == "alpha":
        if n > 26:
            raise InputError(f"alphabetic identifiers allow at most 26 passages per window, got {n}")
        return [f"[{c}]" for c in string.ascii_uppercase[:n]]
    raise InputError(f"unknown identifier style {style!r}; use 'numeric' or 'alpha'")


def _identifier(inside: str) -> str | None:
    """What the inside of a bracket reads as once normalised (NFKC; zero-width characters, combining marks and
    spaces dropped; circled, superscript and other digit forms as ASCII digits), if that is an identifier.

    >>> [_identifier(x) for x in ("7", " 7 ", "⑦", "⁷", "\\u200b7", "Ｂ", "❼", "a b", "12345678", "note")]
    ['7', '7', '7', '7', '7', 'B', '7', None, None, None]
    """
    text = "".join(c for c in unicodedata.normalize("NFKC", inside)
                   if unicodedata.category(c) not in ("Cf", "Mn", "Me", "Zs", "Zl", "Zp", "Cc") and not c.isspace()
                   and c not in _BLANK)
    text = "".join(str(unicodedata.digit(c)) if unicodedata.digit(c, None) is not None else c for c in text)
    return text if _IDENTIFIER.fullmatch(text) else None


def defuse_identifiers(text: str) -> str:
    """``text`` with every identifier look-alike written in parentheses: ``[12]``, ``[ 7 ]``, ``［7］``,
    ``【7】``, ``﹇7﹈``, ``⟦7⟧``, ``〚7〛``, ``[⑦]``, ``[⁷]``, ``[`` + zero-width space + ``7]`` all become ``(7)``
    (as rank_llm does for the plain form), so that passage text cannot pose as an identifier. Nothing else changes.

    >>> defuse_identifiers("see [3], ﹇7﹈, ⟦7⟧, 〚7〛, [⑦], [⁷], [\\u200b7] and [1][2]; keep [note] and [a b]")
    'see (3), (7), (7), (7), (7), (7), (7) and (1)(2); keep [note] and [a b]'
    >>> defuse_identifiers("[\\u31647], [\\uffa07], [\\u28007], ⟨7⟩, ❲7❳, ⦗7⦘")
    '(7), (7), (7), (7), (7), (7)'
    """
    def rewrite(m: re.Match[str]) -> str:
        inside = _identifier(m.group(1))
        return m.group(0) if inside is None else f"({inside})"

    return _BRACKETED.sub(rewrite, text)


def clean_passage(text: str, max_words: int | None) -> str:
    """Collapse whitespace, cut to ``max_words`` words, and neutralise look-alike identifiers
    (:func:`defuse_identifiers`: ``[12]``, ``[ 7 ]``, ``［7］``, ``[⑦]`` become ``(12)``, ``(7)``, as rank_llm
    does). Control tokens are not this function's business: untrusted text reaches the model as plain-text
    token ids, or neutralised (:mod:`.untrusted`).

    >>> clean_passage("see  [3] and\\n[B] [ 7 ] > ［1］ [1000]", None)
    'see (3) and (B) (7) > (1) (1000)'
    >>> clean_passage("one two three", 2)
    'one two'
    """
    words = clean_text(defuse_identifiers(text)).split()
    if max_words is not None:
        words = words[:max_words]
    return defuse_identifiers(" ".join(words))


def passage_text(doc: Document, style: str = "rankgpt") -> str:
    """Document text as RankGPT shows it (``Title: ... Content: ...`` when there is a title), or as the
    CapCal release's data loader does (``style="release"``: the title, a newline, the text).

    >>> passage_text(Document("t", title="T")), passage_text(Document("t", title="T"), "release")
    ('Title: T Content: t', 'T\\nt')
    """
    if style == "release":
        return f"{doc.title}\n{doc.text}".strip() if doc.title else doc.text
    return f"Title: {doc.title} Content: {doc.text}" if doc.title else doc.text


def render_prompt(template: PromptTemplate, query: str, passages: Sequence[str], ids: Sequence[str]) -> Prompt:
    """One window's prompt, its untrusted text (the query, span 0, and the passages, already cleaned)
    kept apart from the template (:class:`~.untrusted.Prompt`).

    >>> p = render_prompt(RANK_ZEPHYR, "q", ["a", "b"], ["[1]", "[2]"])
    >>> [role for role, _ in p.skeleton], p.spans, "[2] b" in p.text()[1][1]
    (['system', 'user'], ('q', 'a', 'b'), True)
    """
    fields = {"num": len(passages), "query": marker(0)}
    body = "".join(template.passage.format(label=i, text=marker(k + 1), **fields) for k, i in enumerate(ids))
    user = template.head.format(**fields) + body + template.tail.format(**fields)
    messages: list[tuple[str, str]] = []
    if template.system:
        messages.append(("system", template.system.format(**fields)))
    messages.append(("user", user))
    return Prompt(tuple(messages), (query, *passages))


def render(template: PromptTemplate, query: str, passages: Sequence[str], ids: Sequence[str]) -> Messages:
    """The chat messages for one window as plain text (passages already cleaned), for inspection and
    tests; what is sent goes through :func:`render_prompt`.

    >>> msgs = render(RANK_ZEPHYR, "q", ["a", "b"], ["[1]", "[2]"])
    >>> [role for role, _ in msgs], "[2] b" in msgs[1][1]
    (['system', 'user'], True)
    """
    p = render_prompt(template, query, passages, ids)
    return p.fill(p.spans)


def raw_text(messages: Messages) -> str:
    """The messages as one plain text with ``<|role|>`` tags, as the CapCal release sends its prompt
    (no chat template; the tags are ordinary text to the model).

    >>> raw_text((("system", "S"), ("user", "U")))
    '\\n<|system|>\\nS\\n<|user|>\\nU\\n<|assistant|>\\n'
    """
    return "\n" + "".join(f"<|{role}|>\n{content}\n" for role, content in messages) + "<|assistant|>\n"


def _chatml(messages: Messages) -> str:
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages) + "<|im_start|>assistant\n"


def _llama3(messages: Messages) -> str:
    turns = "".join(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>" for role, content in messages)
    return turns + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def _gemma(messages: Messages) -> str:
    system = "\n\n".join(c for r, c in messages if r == "system")
    turns = [(r, c) for r, c in messages if r != "system"]
    if system and turns:  # Gemma has no system role: its template puts the system text before the first turn
        turns[0] = (turns[0][0], f"{system}\n\n{turns[0][1]}")
    body = "".join(f"<start_of_turn>{'model' if r == 'assistant' else r}\n{c}<end_of_turn>\n" for r, c in turns)
    return body + "<start_of_turn>model\n"


#: Prompts rendered on the client, for ``/v1/completions`` endpoints that render no chat template
#: (``Options.prompt``): the release's plain tags (``raw``), or a model family's chat format. The server
#: adds the BOS token, as it does for any text prompt.
PROMPT_FORMATS = {"raw": raw_text, "chatml": _chatml, "llama3": _llama3, "gemma": _gemma}
