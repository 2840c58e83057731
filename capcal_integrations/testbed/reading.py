"""How the testbed's server reads a prompt: its tokenizer, the passages and grades of a listwise prompt,
and the next token's distribution after the decoding prefix.

The tokenizer is invertible (a word, a digit, a punctuation mark, a run of white space is a token; ``[``,
`` [``, ``]`` and every digit are tokens of their own; chat markers are special tokens), so any mix of text
and ids decodes to the prompt's text. The passages are found after the identifiers (``[1] ...``), each
looked up by its text among the data's passages (a normalised prefix: letters and digits only, lower
case, chat markup removed, so that it survives the library's cleaning and cutting), the query telling
apart a passage listed for several queries.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["Judged", "Vocabulary", "PassageIndex", "Prompt", "pieces", "tokenize", "normalised", "chatml",
           "passages", "continuations", "ASSISTANT_MARKERS"]

Judged = tuple[str, Sequence[str], Sequence[int]]  # (query, passages, their relevance grades)

SPECIAL = ("<|im_start|>", "<|im_end|>")
#: Where the assistant's turn starts in the prompt formats the library may send (the server's template,
#: and the client-side ones of :data:`~capcal_integrations.prompts.render.PROMPT_FORMATS`).
ASSISTANT_MARKERS = ("<|im_start|>assistant\n", "\n<|assistant|>\n", "<|start_header_id|>assistant<|end_header_id|>\n\n",
                     "<start_of_turn>model\n")
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d| ?[^\w\s]| ?_|\s+")
_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")
_MARKUP = re.compile(r"<\|[^|<>]{0,40}\|>|</?s>")
_NOT_ALNUM = re.compile(r"[\W_]+")
#: Next tokens that are no identifier, and the mass they take at each node.
_OTHER = ("\n", " The", "<|im_end|>")
_LEAK = 1e-3
_KEY = 40  # characters of a normalised passage that index it


def chatml(messages: Sequence[Mapping[str, str]]) -> str:
    """The chat template the simulated server applies (``/apply-template``): ChatML."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def pieces(text: str, parse_special: bool = True) -> list[str]:
    """The token pieces of ``text`` (their concatenation is ``text``).

    >>> pieces("[12] > [3] the  cat<|im_end|>")
    ['[', '1', '2', ']', ' >', ' [', '3', ']', ' the', '  ', 'cat', '<|im_end|>']
    >>> len(pieces("<|im_end|>", parse_special=False))
    7
    """
    out: list[str] = []
    for part in _SPECIAL.split(text) if parse_special else [text]:
        if part in SPECIAL and parse_special:
            out.append(part)
        elif part:
            out += _PIECE.findall(part)
    return out


class Vocabulary:
    """Pieces <-> ids, growing as new pieces are met (so any text is invertible); thread-safe."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {s: i + 1 for i, s in enumerate(SPECIAL)}
        self._pieces: list[str] = ["", *SPECIAL]
        self._lock = threading.Lock()

    def id(self, piece: str) -> int:
        got = self._ids.get(piece)
        if got is None:
            with self._lock:
                got = self._ids.get(piece)
                if got is None:
                    got = self._ids[piece] = len(self._pieces)
                    self._pieces.append(piece)
        return got

    def piece(self, token: int) -> str:
        if not 0 < token < len(self._pieces):
            raise InputError(f"unknown token id {token}")
        return self._pieces[token]


def tokenize(vocab: Vocabulary, text: str, parse_special: bool = True) -> list[tuple[int, str]]:
    """``(id, piece)`` pairs of ``text``; special tokens only with ``parse_special``."""
    return [(vocab.id(p), p) for p in pieces(text, parse_special)]


def normalised(text: str) -> str:
    """What identifies a passage whatever the library did to it: letters and digits, lower case.

    >>> normalised("Fleas  live [3] <|im_end|> 100 days.")
    'fleaslive3100days'
    """
    return _NOT_ALNUM.sub("", _MARKUP.sub(" ", text)).lower()


class PassageIndex:
    """The grade of a passage (by normalised text prefix) for the query a prompt shows."""

    def __init__(self, lists: Iterable[Judged]) -> None:
        self._by_key: dict[str, list[tuple[str, str, int]]] = {}
        self.lists = 0
        queries: set[str] = set()
        for query, passages, grades in lists:
            self.lists += 1
            if query.strip():
                queries.add(query.strip())
            if len(passages) != len(grades):
                raise InputError(f"list {query!r}: {len(passages)} passages but {len(grades)} grades")
            for text, grade in zip(passages, grades):
                norm = normalised(text)
                self._by_key.setdefault(norm[:_KEY], []).append((norm, query.strip(), int(grade)))
        self._queries = sorted(queries, key=lambda q: (-len(q), q))  # the longest first

    def query_of(self, prompt: str) -> str:
        """The data's query that ``prompt`` shows (the longest one it contains), ``""`` if none: the list's key,
        the same for a list's real, reordered and empty prompts."""
        return next((q for q in self._queries if q in prompt), "")

    def grade(self, text: str, prompt: str) -> int | None:
        """The passage's grade, ``None`` if no passage of the data starts with it."""
        norm = normalised(text)
        found = (self._by_key.get(norm[:_KEY], []) if len(norm) >= _KEY else
                 [e for key, entries in self._by_key.items() if key.startswith(norm) for e in entries])
        found = [e for e in found if e[0].startswith(norm)]
        if not found:
            return None
        if len({g for _, _, g in found}) > 1:  # listed for several queries: the one this prompt asks
            found = [e for e in found if e[1] and e[1] in prompt] or found
        return found[0][2]


@dataclass(frozen=True)
class Prompt:
    """What the server read in one prompt (before the assistant turn)."""

    labels: tuple[str, ...]  # identifiers in slot order, without brackets ("1", "2", ... or "A", ...)
    logits: tuple[float, ...]
    grades: tuple[int, ...] | None  # None: the empty prompt


_NUMERIC = re.compile(r"(?:^|\n)\[(1)\] ")
_ALPHA = re.compile(r"(?:^|\n)\[(A)\] ")


def passages(head: str) -> tuple[list[str], list[str]] | None:
    """The identifiers and passage texts of a listwise prompt, in slot order: ``[1] text`` lines (or
    ``[A]``), each passage running to the next identifier's line (the last to its line's end)."""
    first = _NUMERIC.search(head) or _ALPHA.search(head)
    if first is None:
        return None
    numeric = first.group(1) == "1"
    ids, texts = [], []
    start = first.end()
    k = 1
    while True:
        label = str(k + 1) if numeric else chr(ord("A") + k)
        nxt = head.find(f"\n[{label}] ", start)
        ids.append(str(k) if numeric else chr(ord("A") + k - 1))
        if nxt < 0:
            end = head.find("\n", start)
            texts.append(head[start:end if end >= 0 else len(head)])
            break
        texts.append(head[start:nxt])
        start = nxt + len(label) + 4
        k += 1
    return ids, texts


_WRITTEN = re.compile(r"\[([0-9A-Za-z]+)\]")
_PARTIAL = re.compile(r"\[+([0-9A-Za-z]*)$")


def continuations(read: Prompt, written: str) -> dict[str, float]:
    """Mass of each next piece after the assistant wrote ``written``: at a partial identifier, the
    remaining labels' probabilities by the piece that continues them; before one, an opening bracket."""
    done = set(_WRITTEN.findall(written))
    partial = _PARTIAL.search(written)
    mass: dict[str, float] = {}
    if partial is None:  # before an identifier: its opening bracket
        mass = {" [": 0.6, "[": 0.3}
        leak = 0.1
    else:
        so_far = partial.group(1)
        remaining = [(label, v) for label, v in zip(read.labels, read.logits) if label not in done]
        top = max((v for _, v in remaining), default=0.0)
        for label, v in remaining:
            if label.startswith(so_far):
                piece = "]" if label == so_far else label[len(so_far)]
                mass[piece] = mass.get(piece, 0.0) + math.exp(v - top)
        total = math.fsum(mass.values())
        if total <= 0:
            return {p: 1.0 for p in _OTHER}
        mass = {p: m / total for p, m in mass.items()}
        leak = _LEAK
    scale = (1.0 - leak) / math.fsum(mass.values())
    out = {p: m * scale for p, m in mass.items()}
    for p in _OTHER:
        out[p] = out.get(p, 0.0) + leak / len(_OTHER)
    return out
