"""What the prompt-list kinds (:mod:`.llamacpp`, :mod:`.vllm`, :mod:`.sglang`) share: every assistant prefix of one
prompt as a list of prompts in **one** ``/v1/completions`` request (every prompt's in one where the kind says
``one_request``), the prompt as the kind renders it and the prefix as the served model's token ids, pinned to a
llama.cpp slot where the server has several (not when ``state.routed``: a slot number means nothing across
servers)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import EndpointError
from ..prompts.untrusted import Prompt
from ..types import Capabilities
from .answers import choices_of, excerpt
from .base import COMPLETIONS, MAX_TOP_LIMIT, Kind, Query, count, unsupported
from .calls import SLOT, Call, EndpointState, Flow, Token

__all__ = ["PromptLists", "top_limit"]

Key = tuple[Prompt, str]  # a rendered prompt: its messages and its format (two formats are two prompts)


class PromptLists(Kind):
    """A kind that continues any prompt in prompt lists; subclasses render the prompts (:meth:`render`)."""

    prompt_lists: ClassVar[bool] = True
    #: every rendered prompt's prompts of a round in one request (both streams of a calibrated step): the server
    #: schedules them into the same engine steps (vLLM); not llama.cpp, whose slots hold one prompt each
    one_request: ClassVar[bool] = False

    def render(self, state: EndpointState, caps: Capabilities, keys: Sequence[Key]) -> Flow[None]:
        """Each prompt as sent, into ``state.templates[key]``: a list of text and ids, or of ids."""
        raise NotImplementedError

    def templates(self, state: EndpointState, keys: Sequence[Key]) -> Flow[dict[Key, list[Any]]]:
        """The rendered prompts the requests carry (llama.cpp behind a router: as ids only)."""
        return {key: state.templates[key] for key in keys}
        yield

    def body(self, caps: Capabilities, wanted: Sequence[Token]) -> dict[str, Any]:
        """What the kind adds to a request's body, given the tokens its prompts want."""
        return {}

    def delivery(self, caps: Capabilities, calls: list[Call]) -> Flow[list[Any]] | None:
        """A flow that gets the answers to ``calls`` another way than sending them as they are, or None."""
        return None

    def send(self, state: EndpointState, queries: Sequence[Query], top: int) -> Flow[list[Any]]:
        caps = state.caps
        assert caps is not None, "probe the endpoint first"
        keyed = [(q.messages, q.render) for q in queries]  # each query's Key
        keys = list(dict.fromkeys(keyed))
        missing = [key for key in keys if key not in state.templates]
        if missing:
            yield from self.render(state, caps, missing)
        templates = yield from self.templates(state, keys)
        groups: dict[Key, list[int]] = {}
        for i, key in enumerate(keyed):
            groups.setdefault(key, []).append(i)
        # one request a rendered prompt (a llama.cpp slot holds one), or all in one where the server batches them
        batches = [list(groups)] if self.one_request else [[key] for key in groups]
        members = [[j for key in batch for j in groups[key]] for batch in batches]  # each request's queries, in order
        calls, pinned = [], []
        for batch, these in zip(batches, members):
            prompts = [[*templates[keyed[j]], *(i for i, _ in queries[j].prefix)] for j in these]
            body = {"model": caps.model, "prompt": prompts, "max_tokens": 1, "logprobs": top, "temperature": 0,
                    **self.body(caps, [t for j in these for t in queries[j].want])}
            if (len(batch) == 1 and caps.slots > 1 and not state.routed
                    and (slot := state.slots.pin(batch[0], caps.slots)) is not None):
                body[SLOT] = slot
                pinned.append(slot)
            calls.append(Call("POST", COMPLETIONS, body))
        try:
            other = self.delivery(caps, calls)
            answers = (yield from other) if other is not None else (yield calls)
        finally:
            state.slots.release(*pinned)
        choices: list[Any] = [None] * len(queries)
        for these, answer in zip(members, answers):
            for i, choice in zip(these, choices_of(answer, len(these))):
                choices[i] = choice
        return choices


def top_limit(model: str, ids: list[int]) -> Flow[int]:
    """The largest top-k a token-id prompt list is answered with: vLLM refuses more than its ``--max-logprobs``
    (default 20) with "... greater than max allowed: N"; a refusal that names no limit reads as 20; a server
    that answers 1001 has enough for any re-ask."""
    try:
        yield [Call("POST", COMPLETIONS, {"model": model, "prompt": [ids], "max_tokens": 1, "logprobs": 1001,
                                          "temperature": 0})]
    except EndpointError as err:
        if not unsupported(err):
            raise
        found = re.search(r"max allowed: (\d{1,30})\b", excerpt(err.body, 2000))
        return count(int(found.group(1)), "a top-k limit", MAX_TOP_LIMIT, err.body) or 20 if found else 20
    return 1000
