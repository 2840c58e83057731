"""A fake OpenAI-compatible endpoint, for testing a pipeline built on this library without a model.

In the spirit of httpx's ``MockTransport``: the endpoint is a function from a request to a response
(:func:`make_handler`), run in memory by the ``openai`` clients :func:`clients` returns, or on a real
socket by :class:`Loopback`. It needs nothing beyond the library's own dependencies: no server, no
weights, no network.

What you get: the library's whole path (the probe, ``/tokenize``, rendered templates, prompt lists,
constrained decoding, calibration, the errors) runs against it, and every ranking is a valid permutation
with the fields of a real one. What you do not get: judgement. The fake model's next-token
log-probabilities are pseudo-random, deterministic in the prompt; it reads nothing, so test *that* your
pipeline reranks and what it does with the result, not *how well*. Pass ``guard=None`` (calibrate
unconditionally): with the default ``guard="query"`` the content check would, rightly, keep the given
order while it decides whether this model reads.

The dialects it speaks (each the shape the library's tests check against the real server):

* llama.cpp's server, the default: ``/v1/models``, ``/props``, ``/tokenize`` (text or mixed lists),
  ``/apply-template``, ``/v1/completions`` with prompt lists and mixed text-and-id prompts, chat
  completions continuing a prefilled assistant message; ``legacy=True``: the legacy logprobs shape;
* vLLM's, ``make_handler(vllm=True)``: token-id prompts, its ``/tokenize``/``/detokenize``,
  ``logprob_token_ids``, a top-k limit (``max_logprobs``);
* SGLang's, ``make_handler(sglang=True)`` (its documented shapes; no SGLang ran here): token-id prompt lists
  answered by token text, ``/tokenize`` with ``prompt`` or ``messages``, ``/detokenize``,
  ``continue_final_message``;
* Ollama's OpenAI-compatible API, ``make_handler(ollama=True)`` (its documented shapes; no Ollama ran here):
  chat completions continuing a final assistant message, token texts without ids, ``top_logprobs`` at
  most 20, no ``/tokenize``;
* a hosted chat API, ``make_handler(fault=hosted(answer))``: no tokenizer, ``answer()`` as every chat
  completion (``completions=True``: with a plain ``/v1/completions`` too);
* faults: ``fault(request)`` returns a response to send instead (a 500, a timeout raised, ...) or None;
  ``calls=[]`` records every request.

Pointing the library at it:

>>> from capcal_integrations import CapCalReranker
>>> from capcal_integrations.testing import clients, make_handler
>>> sync, async_ = clients(make_handler())  # in memory
>>> rr = CapCalReranker(client=sync, async_client=async_, guard=None)
>>> ranking = rr.rerank("which is about fleas?", ["Fleas live 2-3 months.", "Bananas.", "Paris."])
>>> sorted(ranking.order), ranking.method, ranking.kept_given_order
([0, 1, 2], 'capcal', False)

The adapters take the same clients: ``llamaindex_ext.CapCalRerank(client=sync, async_client=async_,
guard=None)`` and ``langchain_ext.CapCalRerank(client=sync, async_client=async_, guard=None)``. Where only a
URL will do (another process, the ``capcal`` command, a pickled adapter): ``with Loopback() as fake:`` and
``base_url=fake.base_url`` (``Loopback(key=...)`` checks a key as ``capcal serve`` does).

:mod:`capcal_integrations.testing.router` (two real llama.cpp servers behind vllm-router) is a measuring rig,
not a double, and is not imported here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..endpoints import kind_of
from .endpoint import (
    SPECIAL,
    VOCAB,
    Handler,
    clients,
    decode,
    hosted,
    make_handler,
    split_prompt,
    tokenize,
    tokenized_texts,
)
from .loopback import Loopback, Seen

__all__ = ["make_handler", "clients", "hosted", "Loopback", "Seen", "Handler", "tokenize", "decode",
           "split_prompt", "tokenized_texts", "VOCAB", "SPECIAL", "every_node"]


@contextlib.contextmanager
def every_node(reranker: Any) -> Iterator[Any]:
    """``reranker`` reading every identifier-trie node at every step while in the block: the whole reading a lazy one
    (vanilla's and capcal's middle steps, which ask only the nodes their choice needs) is compared with. The endpoint's
    kind is read as one whose prompts cost nothing of their own (``Kind.costly_prompts`` off), as
    the "every node" rows of ``python -m benchmarks.cost`` do; restored after the block."""
    kind = kind_of(reranker.capabilities())
    kind.costly_prompts = False
    try:
        yield reranker
    finally:
        del kind.costly_prompts
