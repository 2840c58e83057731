"""A simulated llama.cpp server, as an httpx transport: the library's whole path runs against it.

It answers what :mod:`capcal_integrations.endpoints.probe` and :mod:`~capcal_integrations.endpoints` ask of llama.cpp's
server (``/v1/models`` owned by ``llamacpp``, ``/tokenize`` with ``with_pieces`` and ``parse_special``,
``/detokenize``, ``/apply-template``, ``/props``, ``/v1/completions`` with prompt lists mixing text and
token ids, chat completions with a prefilled assistant turn), and reads every prompt back:

* its tokenizer is invertible, so any mix of text and ids decodes to the prompt's text (:mod:`.reading`);
* the passages are found after the identifiers and looked up by their text among the data's passages
  (:class:`~.reading.PassageIndex`); a prompt whose passages are all the same text is the empty
  (placeholder) prompt;
* the list a prompt belongs to (its key for :class:`~.model.SlotModel`'s per-list noise scale and shared slot
  effects) is the data's query it shows (:meth:`~.reading.PassageIndex.query_of`): the same for a list's real,
  reordered and empty prompts, and for the windows of one query;
* the text after the assistant marker is the decoding prefix: identifiers already written are out, and
  the partial identifier at its end (``[1``) is the trie node asked.

The next token's log-probabilities follow the label distribution of :class:`~.model.SlotModel`: at a
node, the mass of every remaining label that continues through each next token (a digit, a letter, or
``]``), so the joint probability of a label's tokens is its model probability; a little mass goes to
tokens that are no label. The usage reports prompt tokens and the tokens a llama.cpp slot would have
cached (the longest common prefix with that slot's previous prompt: :mod:`.prefix_cache`).

A test instrument: it shows what the library's rules do on a reranker whose signal and bias are known,
not what a real model does.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2

from ..errors import InputError
from ..prompts.render import QUERY_PLACEHOLDER
from .model import SlotModel
from .prefix_cache import PrefixCache
from .reading import (
    _KEY,
    ASSISTANT_MARKERS,
    Judged,
    PassageIndex,
    Prompt,
    Vocabulary,
    chatml,
    continuations,
    normalised,
    passages,
    pieces,
    tokenize,
)

__all__ = ["Judged", "PassageIndex", "SimulatedServer", "Stats", "tokenize", "pieces", "Vocabulary", "chatml"]

_PROBE = "A B C D E F G H I J K L M N O P Q R S T U V W X"


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
        self._prefix_cache = PrefixCache(slots)
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
                [(int(x), None)] if isinstance(x, int) else tokenize(self.vocab, str(x), special))]
            if body.get("with_pieces"):  # ids given pass as they are; only their pieces need them known
                return {"tokens": [{"id": t, "piece": self.vocab.piece(t) if p is None else p} for t, p in tokens]}
            return {"tokens": [t for t, _ in tokens]}
        if path == "/detokenize":
            return {"content": "".join(self.vocab.piece(int(t)) for t in body.get("tokens", []))}
        if path == "/apply-template":
            return {"prompt": chatml(body.get("messages", []))}
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
            text = chatml(messages[:-1]) + str(messages[-1].get("content", ""))
        else:
            text = chatml(messages)
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
            mass = continuations(read, text[at:])
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
        found = passages(head)
        if found is None:
            return None
        ids, texts = found
        empty = len(texts) > 1 and len(set(texts)) == 1
        grades: list[int] = []
        key = self.index.query_of(head) if self.model.noise_scale or self.model.shared_slots else ""
        if empty:
            logits = self.model.logits(None, head, texts, list_key=key)
        else:
            free = QUERY_PLACEHOLDER in head  # a query-free reading: no query to be relevant to (its own taste stays)
            for j, t in enumerate(texts):
                g = self.index.grade(t, head)
                if g is None:
                    raise InputError(f"passage {ids[j]} of the prompt is not in the testbed's data: {t[:80]!r}")
                grades.append(0 if free else g)
            logits = self.model.logits(grades, head, [normalised(t)[:_KEY] for t in texts], list_key=key)
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
        """Prompt tokens of a prompt, and how many a llama.cpp slot would have cached (:mod:`.prefix_cache`)."""
        with self._lock:
            tokens, hit = self._prefix_cache.use(segments, slot)
            self.stats.prompt_tokens += tokens
            self.stats.cached_tokens += hit
        return tokens, hit


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
