"""llama.cpp's server: templated prompt lists over ``/v1/completions`` (``Capabilities.transport ==
"completions"``), its ``/tokenize`` and ``/props``.

The chat template is rendered as text (``/apply-template``) once per shape, with markers where the untrusted
spans go; every prompt is then a *mixed* prompt, the template's own text (which the server tokenizes, its
control tokens included) around the spans as token ids from ``/tokenize`` with ``parse_special: false``, so
that no passage or query text can become a control token; every assistant prefix follows as token ids, all
of a prompt's prefixes in one request (:class:`~.lists.PromptLists`), pinned to one of the server's slots.
Behind a router (``state.routed``) the prompts go as token ids only, one by one (:meth:`LlamaCpp.templates`,
:meth:`LlamaCpp.delivery`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from ..errors import EndpointError, ResponseError
from ..prompts.files import declared_tokens, prompt_text
from ..prompts.render import Messages
from ..types import Capabilities
from .answers import choices_of, malformed, parse_tokens, template_of
from .base import COMPLETIONS, Lists, Tokenizer, optional, register, tokenizer_of, two_choices
from .calls import Call, EndpointState, Flow, chat_messages
from .lists import Key, PromptLists

__all__ = ["LLAMACPP", "TOKENIZER", "SPAN_SEPARATOR", "SERVER", "server_of", "props", "detect", "template_call"]

#: ``Capabilities.server`` of a llama.cpp server (its ``/v1/models`` entries are ``owned_by: llamacpp``).
SERVER = "llama.cpp"
#: How many alternatives llama.cpp returns per position (it answers as many as asked).
TOP_LOGPROBS = 1000
#: Between the spans of one batched ``/tokenize`` (:meth:`LlamaCppTokenizer.spans`): an id past any vocabulary,
#: which llama.cpp passes through as given in a mixed list, so that no text can produce it.
SPAN_SEPARATOR = 2**30 - 1
_IDS = "ids only"  # the rendered-prompt cache's key of a prompt as token ids only: (_IDS, key)


def server_of(entries: Sequence[Mapping[str, Any]]) -> str:
    """:data:`SERVER` when the model listing is llama.cpp's, else ``""``."""
    return SERVER if any(m.get("owned_by") == "llamacpp" for m in entries) else ""


def props(server: str) -> Flow[Mapping[str, Any]]:
    """llama.cpp's ``/props`` (context size, slots, model path); ``{}`` elsewhere or when unreadable."""
    found = (yield from optional(Call("GET", "/props", root=True))) if server == SERVER else None
    return found if isinstance(found, Mapping) else {}


def template_call(messages: Messages) -> Call:
    """The request that renders the chat template as text."""
    return Call("POST", "/apply-template", {"messages": chat_messages(messages)}, root=True)


class LlamaCppTokenizer(Tokenizer):
    """llama.cpp's ``/tokenize``: pieces as text (``with_pieces``), special tokens neither added nor parsed."""

    name: ClassVar[str] = "llamacpp"

    def call(self, model: str, text: str) -> Call:
        return Call("POST", "/tokenize", {"content": text, "with_pieces": True, "add_special": False,
                                          "parse_special": False}, root=True)

    def spans(self, caps: Capabilities, texts: Sequence[str]) -> Flow[list[list[int]]]:
        """All spans in one ``/tokenize``: its mixed content tokenizes each text on its own, exactly as one
        request per text would, and the spans come back between :data:`SPAN_SEPARATOR` ids. Should the answer
        not split into one run per text (a server that checks or drops ids), or the server refuse the list
        (a 4xx), one request per text."""
        if len(texts) > 1:
            content: list[str | int] = [x for t in texts for x in (SPAN_SEPARATOR, t)][1:]
            runs: list[list[int]] = [[]]
            try:
                [answer] = yield [Call("POST", "/tokenize", {"content": content, "add_special": False,
                                                             "parse_special": False}, root=True)]
                for i, _ in parse_tokens(answer):
                    if i == SPAN_SEPARATOR:
                        runs.append([])
                    else:
                        runs[-1].append(i)
            except EndpointError as err:
                if not isinstance(err, ResponseError) and not (err.status and 400 <= err.status < 500):
                    raise
                runs = []
            if len(runs) == len(texts):
                return runs
        return (yield from super().spans(caps, texts))


TOKENIZER = register(LlamaCppTokenizer())


class LlamaCpp(PromptLists):
    name: ClassVar[str] = "llama.cpp prompt lists"
    transport: ClassVar[str] = "completions"
    costly_prompts: ClassVar[bool] = True

    def render(self, state: EndpointState, caps: Capabilities, keys: Sequence[Key]) -> Flow[None]:
        """Each prompt as a mixed prompt (see the module docstring). The template is rendered with markers in
        place of the spans (``/apply-template``, or here for a client-side format), once per shape: the
        rendered skeletons hold no user text."""
        shapes = [s for s in dict.fromkeys((p.skeleton, style) for p, style in keys) if s not in state.templates]
        served = [s for s in shapes if s[1] == "chat"]
        answers = (yield [template_call(skeleton) for skeleton, _ in served]) if served else []
        for shape in shapes:
            state.templates[shape] = (template_of(answers[served.index(shape)], False) if shape in served
                                      else prompt_text(*shape))
        try:
            parts = {key: key[0].parts(state.templates[(key[0].skeleton, key[1])]) for key in keys}
        except ValueError as err:  # the server's rendering lost the markers: a malformed answer, not cached
            for shape in shapes:
                state.templates.pop(shape, None)
            raise malformed(f"/apply-template: {err}", answers) from None
        declared = state.declared + declared_tokens(keys[0][1])
        spelt = {key: [x if isinstance(x, str) else (key[0].spelling(x, declared),) for x in xs]
                 for key, xs in parts.items()}
        spellings = list(dict.fromkeys(x[0] for xs in spelt.values() for x in xs if isinstance(x, tuple)))
        ids = dict(zip(spellings, (yield from tokenizer_of(caps).spans(caps, spellings))))
        for key, xs in spelt.items():  # the template's text as text, each span's text as its ids
            state.templates[key] = [y for x in xs for y in ([x] if isinstance(x, str) else ids[x[0]])]

    def templates(self, state: EndpointState, keys: Sequence[Key]) -> Flow[dict[Key, list[Any]]]:
        """Behind a router, the mixed prompts as token ids only (:func:`_ids_only`)."""
        if not state.routed:
            return (yield from super().templates(state, keys))
        yield from _ids_only(state, keys)
        return {key: state.templates[(_IDS, key)] for key in keys}

    def delivery(self, caps: Capabilities, calls: list[Call]) -> Flow[list[Any]] | None:
        if caps.slots > 1 and any(len(call.body["prompt"]) > 1 and call.slot is None for call in calls):
            return _prompt_by_prompt(calls)  # routed, or more prompts than free slots
        return None


LLAMACPP = register(LlamaCpp())


def _ids_only(state: EndpointState, keys: Iterable[Key]) -> Flow[None]:
    """The mixed prompts as token ids only, for routers, which accept a prompt as text or as ids but not both
    (vllm-router answers 422). llama.cpp's ``/tokenize`` takes the same mixed list and tokenizes it with the
    same function as ``/v1/completions`` (its text with control tokens parsed, special tokens added to a first
    text piece), so the ids are the ones it would run: one request per prompt, once per ranking."""
    todo = [key for key in keys if (_IDS, key) not in state.templates]
    if not todo:
        return
    answers = yield [Call("POST", "/tokenize", {"content": list(state.templates[key]), "add_special": True,
                                                "parse_special": True}, root=True) for key in todo]
    for key, answer in zip(todo, answers):
        state.templates[(_IDS, key)] = [i for i, _ in parse_tokens(answer)]


def _prompt_by_prompt(calls: list[Call]) -> Flow[list[Any]]:
    """The answers to ``calls`` (prompt lists), those without a slot pin (``routed``, or more prompts at once than
    free slots) sent prompt by prompt. llama.cpp runs the prompts of one unpinned prompt list in all its idle slots at
    once, each slot computing the whole prompt; sent one by one instead (each list's prompts in turn, the lists side
    by side), each prompt goes to the idle slot most like it, the one that holds its prefix, and costs only its last
    tokens. A pinned list goes whole, in the first round: its slot holds its prefix."""
    bodies = [dict(call.body or {}) for call in calls]
    whole = [call.slot is not None for call in calls]
    parts: list[list[Any]] = [[] for _ in calls]
    for r in range(max(1 if w else len(body["prompt"]) for w, body in zip(whole, bodies))):
        live = [k for k, body in enumerate(bodies) if (r == 0 if whole[k] else r < len(body["prompt"]))]
        answers = yield [Call("POST", COMPLETIONS, bodies[k] if whole[k] else {**bodies[k], "prompt": [bodies[k]["prompt"][r]]})
                         for k in live]
        for k, answer in zip(live, answers):
            parts[k].extend(choices_of(answer, len(bodies[k]["prompt"]) if whole[k] else 1))
    return [{"choices": [{**choice, "index": i} for i, choice in enumerate(choices)]} for choices in parts]


def detect(model: str) -> Flow[Lists | None]:
    """llama.cpp's templated prompt lists: ``/apply-template`` renders text, and ``/v1/completions`` answers
    a list of prompts. ``None`` when there is no ``/apply-template`` (another kind may fit);
    ``Lists(None)`` when there is one but no prompt lists."""
    rendered = yield from optional(template_call((("user", "x"),)))
    if not (isinstance(rendered, Mapping) and isinstance(rendered.get("prompt"), str)):
        return None
    answer = yield from optional(Call("POST", COMPLETIONS, {
        "model": model, "prompt": ["A B C", "1 2 3"], "max_tokens": 1, "logprobs": 5, "temperature": 0}))
    return Lists(LLAMACPP if two_choices(answer, by_id=False) else None)

