"""A simulated llama.cpp server, as an httpx transport: the library's whole path runs against it.

It answers what :mod:`capcal_integrations.probe` and :mod:`~capcal_integrations.protocol` ask of llama.cpp's
server (``/v1/models`` owned by ``llamacpp``, ``/tokenize`` with ``with_pieces`` and ``parse_special``,
``/detokenize``, ``/apply-template``, ``/props``, ``/v1/completions`` with prompt lists mixing text and
token ids, chat completions with a prefilled assistant turn), and reads every prompt back:

* its tokenizer is invertible (a word, a digit, a punctuation mark, a run of white space is a token;
  ``[``, `` [``, ``]`` and every digit are tokens of their own; chat markers are special tokens), so any
  mix of text and ids decodes to the prompt's text;
* the passages are found after the identifiers (``[1] ...``), each looked up by its text among the
  data's passages (a normalised prefix: letters and digits only, lower case, chat markup removed, so it
  survives the library's cleaning and cutting), the query disambiguating a passage listed for several;
  a prompt whose passages are all the same text is the empty (placeholder) prompt;
* the text after the assistant marker is the decoding prefix: identifiers already written are out, and
  the partial identifier at its end (``[1``) is the trie node asked.

The next token's log-probabilities follow the label distribution of :class:`~.model.SlotModel`: at a
node, the mass of every remaining label that continues through each next token (a digit, a letter, or
``]``), so the joint probability of a label's tokens is its model probability; a little mass goes to
tokens that are no label. The usage reports prompt tokens and the tokens a llama.cpp slot would have
cached (the longest common prefix with that slot's previous prompt).

A test instrument: it shows what the library's rules do on a reranker whose signal and bias are known,
not what a real model does.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2

from ..errors import InputError
from .model import SlotModel

__all__ = ["Judged", "PassageIndex", "SimulatedServer", "tokenize", "CHATML"]

Judged = tuple[str, Sequence[str], Sequence[int]]  # (query, passages, their relevance grades)

SPECIAL = ("<|im_start|>", "<|im_end|>")
#: Where the assistant's turn starts in the prompt formats the library may send (the server's template,
#: and the client-side ones of :data:`~capcal_integrations.prompts.PROMPT_FORMATS`).
ASSISTANT_MARKERS = ("<|im_start|>assistant\n", "\n<|assistant|>\n", "<|start_header_id|>assistant<|end_header_id|>\n\n",
                     "<start_of_turn>model\n")
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d| ?[^\w\s]| ?_|\s+")
_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")
_MARKUP = re.compile(r"<\|[^|<>]{0,40}\|>|</?s>")
_NOT_ALNUM = re.compile(r"[\W_]+")
_PROBE = "A B C D E F G H I J K L M N O P Q R S T U V W X"
#: Next tokens that are no identifier, and the mass they take at each node.
_OTHER = ("\n", " The", "<|im_end|>")
_LEAK = 1e-3
_KEY = 40  # characters of a normalised passage that index it


def CHATML(messages: Sequence[Mapping[str, str]]) -> str:  # noqa: N802 (a constant-like renderer)
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
        for query, passages, grades in lists:
            self.lists += 1
            if len(passages) != len(grades):
                raise InputError(f"list {query!r}: {len(passages)} passages but {len(grades)} grades")
            for text, grade in zip(passages, grades):
                norm = normalised(text)
                self._by_key.setdefault(norm[:_KEY], []).append((norm, query.strip(), int(grade)))

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


@dataclass
class Stats:
    """What the server was asked: requests by path, prompts scored, prompt tokens and cached ones."""

    requests: dict[str, int] = field(default_factory=dict)
    prompts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class SimulatedServer:
    """The handler of the simulated llama.cpp server (see the module docstring)."""

    def __init__(self, index: PassageIndex, model: SlotModel, *, context: int = 32768, slots: int = 8,
                 name: str = "testbed") -> None:
        self.index, self.model, self.context, self.slots, self.name = index, model, context, slots, name
        self.vocab = Vocabulary()
        self.stats = Stats()
        self._prompts: OrderedDict[str, Prompt] = OrderedDict()
        self._offsets: OrderedDict[str, list[int]] = OrderedDict()
        self._cache: list[list[str | int]] = [[] for _ in range(max(1, slots))]
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ HTTP

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        with self._lock:
            self.stats.requests[path] = self.stats.requests.get(path, 0) + 1
        try:
            body = json.loads(request.content) if request.content else {}
            answer = self._route(request.method, path, body)
        except InputError as err:
            error = {"code": 400, "message": f"testbed: {err}", "type": "invalid_request_error"}
            return httpx2.Response(400, json={"error": error})
        if answer is None:
            return httpx2.Response(404, json={"error": {"code": 404, "message": "File Not Found"}})
        return httpx2.Response(200, json=answer)

    def _route(self, method: str, path: str, body: Any) -> Any:
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "llamacpp"}]}
        if path == "/props":
            return {"default_generation_settings": {"n_ctx": self.context}, "total_slots": self.slots}
        if path == "/tokenize":  # as llama.cpp: text, or a list mixing text and token ids
            content = body.get("content", "")
            special = bool(body.get("parse_special", True))
            tokens = [t for x in (content if isinstance(content, list) else [content]) for t in (
                [(int(x), self.vocab.piece(int(x)))] if isinstance(x, int) else tokenize(self.vocab, str(x), special))]
            if body.get("with_pieces"):
                return {"tokens": [{"id": t, "piece": p} for t, p in tokens]}
            return {"tokens": [t for t, _ in tokens]}
        if path == "/detokenize":
            return {"content": "".join(self.vocab.piece(int(t)) for t in body.get("tokens", []))}
        if path == "/apply-template":
            return {"prompt": CHATML(body.get("messages", []))}
        if path == "/v1/completions" and method == "POST":
            return self._completions(body)
        if path == "/v1/chat/completions" and method == "POST":
            return self._chat(body)
        return None

    def _completions(self, body: Mapping[str, Any]) -> dict:
        raw = body.get("prompt")
        top = int(body.get("logprobs") or 1)
        choices, used, cached = [], 0, 0
        for i, prompt in enumerate(_prompt_list(raw)):
            segments = self.segments(prompt)
            tokens, hit = self._cached(segments, body.get("id_slot"))
            used, cached = used + tokens, cached + hit
            table = self.vocab._pieces
            dist = self.next_tokens("".join(x if type(x) is str else table[x] for x in segments))
            choices.append({"index": i, "text": dist[0][1], "finish_reason": "length",
                            "logprobs": {"content": [self._entry(dist, top)]}})
        return {"object": "text_completion", "model": self.name, "choices": choices,
                "usage": {"prompt_tokens": used, "completion_tokens": len(choices), "total_tokens": used + len(choices),
                          "prompt_tokens_details": {"cached_tokens": cached}}}

    def _chat(self, body: Mapping[str, Any]) -> dict:
        messages = list(body.get("messages") or [])
        top = int(body.get("top_logprobs") or 1)
        if messages and messages[-1].get("role") == "assistant":  # a prefilled turn is continued
            text = CHATML(messages[:-1]) + str(messages[-1].get("content", ""))
        else:
            text = CHATML(messages)
        if text.endswith(_PROBE):  # the prefill probe: the alphabet goes on
            dist = [(self.vocab.id(" Y"), " Y", -0.01), (self.vocab.id(" Z"), " Z", -5.0)]
        else:
            dist = self.next_tokens(text)
        tokens, hit = self._cached([text], None)
        entry = self._entry(dist, top) if body.get("logprobs") else None
        return {"object": "chat.completion", "model": self.name, "choices": [{
            "index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": dist[0][1]},
            "logprobs": {"content": [entry]} if entry else None}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1,
                      "prompt_tokens_details": {"cached_tokens": hit}}}

    @staticmethod
    def _entry(dist: Sequence[tuple[int, str, float]], top: int) -> dict:
        shown = [{"id": t, "token": p, "bytes": list(p.encode()), "logprob": lp} for t, p, lp in dist[:max(1, top)]]
        return {**shown[0], "top_logprobs": shown}

    # ------------------------------------------------------------------ reading prompts

    def segments(self, prompt: Any) -> list[str | int]:
        """A prompt as text and token-id segments: a string, token ids, or a list mixing both."""
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt, list):
            known = len(self.vocab._pieces)
            for x in prompt:
                if type(x) is int:
                    if not 0 < x < known:
                        raise InputError(f"unknown token id {x}")
                elif type(x) is not str:
                    break
            else:
                return prompt
        raise InputError(f"unreadable prompt {str(prompt)[:80]!r}")

    def next_tokens(self, text: str) -> list[tuple[int, str, float]]:
        """``(id, piece, logprob)`` of the next token after ``text``, best first."""
        at = max((i + len(m) if (i := text.rfind(m)) >= 0 else -1) for m in ASSISTANT_MARKERS)
        read = self.read(text[:at]) if at > 0 else None
        if read is None:  # no ranking prompt (the probes): some ordinary text
            mass = {" the": 0.5, "\n": 0.3, " a": 0.2}
        else:
            mass = _continuations(read, text[at:])
        total = math.fsum(mass.values())
        out = [(self.vocab.id(p), p, math.log(m / total)) for p, m in mass.items() if m > 0]
        return sorted(out, key=lambda e: -e[2])

    def read(self, head: str) -> Prompt | None:
        """The passages, grades and label logits of a prompt's text before the assistant's turn (cached)."""
        with self._lock:
            got = self._prompts.get(head)
            if got is not None:
                self._prompts.move_to_end(head)
                return got
        found = _passages(head)
        if found is None:
            return None
        ids, texts = found
        empty = len(texts) > 1 and len(set(texts)) == 1
        grades: list[int] = []
        if empty:
            logits = self.model.logits(None, head, texts)
        else:
            for j, t in enumerate(texts):
                g = self.index.grade(t, head)
                if g is None:
                    raise InputError(f"passage {ids[j]} of the prompt is not in the testbed's data: {t[:80]!r}")
                grades.append(g)
            logits = self.model.logits(grades, head, [normalised(t)[:_KEY] for t in texts])
        got = Prompt(tuple(ids), tuple(logits), None if empty else tuple(grades))
        with self._lock:
            self._prompts[head] = got
            self.stats.prompts += 1
            while len(self._prompts) > 4096:
                self._prompts.popitem(last=False)
        return got

    def readings(self) -> list[Prompt]:
        """The prompts read so far (the latest 4096), oldest first."""
        with self._lock:
            return list(self._prompts.values())

    def _cached(self, segments: Sequence[str | int], slot: Any) -> tuple[int, int]:
        """Prompt tokens of a prompt, and how many a llama.cpp slot would have cached: the common prefix
        with the previous prompt of the pinned slot (else of the slot that shares most)."""
        with self._lock:
            tokens = sum(len(self._offsets_of(x)) - 1 if isinstance(x, str) else 1 for x in segments)
            slots = [slot] if isinstance(slot, int) and 0 <= slot < len(self._cache) else range(len(self._cache))
            hits = {k: self._shared(self._cache[k], segments) for k in slots}
            best = max(hits, key=lambda k: hits[k])
            self._cache[best] = list(segments)
            self.stats.prompt_tokens += tokens
            self.stats.cached_tokens += hits[best]
        return tokens, hits[best]

    def _offsets_of(self, text: str) -> list[int]:
        offsets = self._offsets.get(text)
        if offsets is None:
            offsets = self._offsets[text] = [0, *_cumulative(pieces(text))]
            while len(self._offsets) > 256:
                self._offsets.popitem(last=False)
        return offsets

    def _shared(self, before: Sequence[str | int], now: Sequence[str | int]) -> int:
        """Tokens at the start of ``now`` that ``before`` had too."""
        hit = 0
        for a, b in zip(before, now):
            if a == b:
                hit += len(self._offsets_of(a)) - 1 if isinstance(a, str) else 1
                continue
            if isinstance(a, str) and isinstance(b, str):
                hit += bisect.bisect_right(self._offsets_of(b), _common(a, b)) - 1
            break
        return hit


def _prompt_list(raw: Any) -> list[Any]:
    """The prompts of a completions request, as llama.cpp reads ``prompt``: a string, token ids or a
    list mixing strings and ids is one prompt; any other list is a list of prompts, each of which must
    be a string, token ids or a mixed list (strings alone are not)."""
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw)):
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise InputError('"prompt" must be a string, a list of tokens, a list of mixed strings & tokens, or a list of prompts')
    if any(isinstance(x, int) for x in raw):
        return [raw]
    for x in raw:
        if isinstance(x, list) and not any(isinstance(v, int) for v in x):
            raise InputError('"prompt" elements must be a string, a list of tokens, or a list of mixed strings & tokens')
    return list(raw)


def _common(a: str, b: str) -> int:
    """Length of the common prefix of two strings (bisection on slices: fast for long prompts).

    >>> _common("abcdef", "abcxyz"), _common("", "a"), _common("same", "same")
    (3, 0, 4)
    """
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cumulative(parts: Sequence[str]) -> list[int]:
    out, total = [], 0
    for p in parts:
        total += len(p)
        out.append(total)
    return out


_NUMERIC = re.compile(r"(?:^|\n)\[(1)\] ")
_ALPHA = re.compile(r"(?:^|\n)\[(A)\] ")


def _passages(head: str) -> tuple[list[str], list[str]] | None:
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


def _continuations(read: Prompt, written: str) -> dict[str, float]:
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
