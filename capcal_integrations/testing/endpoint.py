"""The fake endpoint's dialects: a request handler that answers as llama.cpp, vLLM, SGLang or a hosted API would.

:func:`make_handler` returns a function from an HTTP request to a response, for a ``MockTransport`` of
the installed openai's HTTP library (``httpx2`` for openai 3.x, ``httpx`` for 2.x:
:func:`capcal_integrations.transport.client.http_library`); :func:`clients` wraps it in a sync and an async
``openai`` client. The fake model (:mod:`.fake_model`) has a tiny tokenizer (``[``, `` [``, ``]``, ``>``,
digits, capital letters, Qwen's three control tokens; any other character is a token of its own) and its
next-token log-probabilities are pseudo-random but deterministic in the prompt: it reads nothing, so a ranking
against it exercises every request, parser and error path, never a model's judgement.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai

from ..transport.client import http_library
from .fake_model import (  # the fake model's; tests import them from here too
    PIECE,
    SPECIAL,
    VOCAB,
    content_logprobs,
    decode,
    distribution,
    piece_of,
    split_prompt,
    symbol,
    tokenize,
)

__all__ = ["make_handler", "hosted", "clients", "tokenize", "decode", "split_prompt", "tokenized_texts",
           "Handler", "VOCAB", "SPECIAL"]

httpx2: Any = http_library()  # the installed openai's HTTP library (tests import it from here, under this name)
#: A request handler: what :func:`make_handler` returns and ``MockTransport`` takes.
Handler = Callable[[Any], Any]


def vllm_completions(body: dict, max_logprobs: int) -> Any:
    """vLLM's ``/v1/completions`` on token-id prompt lists: legacy logprobs, keys ``token_id:N`` with
    ``return_tokens_as_token_ids``, exactly ``logprob_token_ids`` when given, a top-k limit."""
    top = body.get("logprobs") or 0
    if top > max_logprobs or top < 0:
        message = f"Requested sample logprobs of {top}, which is greater than max allowed: {max_logprobs}"
        return httpx2.Response(400, json={"error": {"message": message, "code": 400}})
    key = (lambda t: f"token_id:{t}") if body.get("return_tokens_as_token_ids") else (lambda t: PIECE[t])
    choices = []
    for i, ids in enumerate(body["prompt"]):
        dist = distribution(decode(ids))
        wanted = body.get("logprob_token_ids")
        known = dict(dist)  # vLLM returns any wanted id; ids outside the fake vocabulary are very unlikely
        shown = [(t, known.get(t, -30.0)) for t in wanted] + dist[:1] if wanted else dist[:top]
        choices.append({"index": i, "text": PIECE[dist[0][0]], "logprobs": {
            "tokens": [key(dist[0][0])], "top_logprobs": [{key(t): lp for t, lp in shown}]}})
    return httpx2.Response(200, json={"choices": choices, "usage": {"prompt_tokens": 10, "completion_tokens": 1}})


def make_handler(*, fault: Callable[[Any], Any] | None = None, legacy: bool = False, context: int = 4096,
                 slots: int = 0, calls: list | None = None, vllm: bool = False, max_logprobs: int = 20,
                 sglang: bool = False, ollama: bool = False) -> Handler:
    """A fake endpoint's request handler. By default it speaks llama.cpp's server: ``/v1/models`` (one
    model, ``fake``, owned by ``llamacpp``), ``/props`` (``context`` tokens, ``slots`` slots),
    ``/tokenize`` (text or a mixed list of text and ids, ``with_pieces``, ``parse_special``),
    ``/apply-template``, ``/v1/completions`` (prompt lists, mixed prompts; ``legacy=True``: the legacy
    logprobs shape) and ``/v1/chat/completions`` continuing a prefilled assistant message.

    ``vllm=True`` answers as vLLM does: no ``/apply-template`` or ``/props``, its ``/tokenize`` and
    ``/detokenize`` shapes, token-id prompts, ``logprob_token_ids``, a top-k limit of ``max_logprobs``.
    ``sglang=True`` answers as SGLang does (its documented shapes, never run here): ``/v1/models`` owned by
    ``sglang`` with ``max_model_len``, no ``/apply-template`` or ``/props``, ``/tokenize`` with ``prompt`` (a
    text or texts) or ``messages``, ``/detokenize`` of ids or lists of ids, token-id prompt lists answered
    with alternatives keyed by token text, chat completions that continue a final assistant message only
    with ``continue_final_message``. ``ollama=True`` answers as Ollama's OpenAI-compatible API does (its
    documented shapes, never run here): models ``owned_by: library``, no ``/tokenize``, ``/props`` or
    ``/apply-template``, chat completions continuing a final assistant message with ``logprobs.content``
    token texts and no ids (``top_logprobs`` above 20 refused), ``/v1/completions`` on one text prompt only,
    without log-probabilities.
    ``fault(request)`` may return a response to send instead (a 500, or :func:`hosted`'s answers) or None
    to proceed. ``calls``: every request is appended to it. A request the dialect cannot read (not JSON, a
    field missing or of the wrong type, a negative top-k) is answered 400 with an ``error`` object, as a server
    answers it, never raised into the client."""

    def handler(request: Any) -> Any:
        if calls is not None:
            calls.append(request)
        if fault is not None:
            forced = fault(request)
            if forced is not None:
                return forced
        try:
            return answer(request)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:  # json's errors are ValueErrors
            return httpx2.Response(400, json={"error": {"code": 400, "type": "invalid_request_error",
                                                        "message": f"malformed request: {type(exc).__name__}: {exc}"}})

    def answer(request: Any) -> Any:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        dialect = _vllm_only if vllm else _sglang_only if sglang else _ollama_only if ollama else None
        if dialect is not None:
            forced = dialect(path, body, context, max_logprobs)
            if forced is not None:
                return forced
        if path == "/v1/models":
            return httpx2.Response(200, json={"data": [{"id": "fake", "owned_by": "llamacpp"}]})
        if path == "/props":
            return httpx2.Response(200, json={"default_generation_settings": {"n_ctx": context}, "total_slots": slots})
        if path == "/tokenize":  # as llama.cpp: text, or a mixed list of text and token ids
            if not isinstance(body.get("content"), (str, list)):  # vLLM's shape ("prompt", "messages"): refused
                return httpx2.Response(400, json={"error": {"code": 400, "message": "\"content\" must be provided",
                                                            "type": "invalid_request_error"}})
            content = body["content"] if isinstance(body["content"], list) else [body["content"]]
            pieces = [p for x in content for p in ([(x, None)] if isinstance(x, int) else  # ids pass as given
                                                   tokenize(x, parse_special=body.get("parse_special", True)))]
            if not body.get("with_pieces"):
                return httpx2.Response(200, json={"tokens": [t for t, _ in pieces]})
            return httpx2.Response(200, json={"tokens": [{"id": t, "piece": piece_of(t) if p is None else p}
                                                         for t, p in pieces]})
        if path == "/apply-template":
            return httpx2.Response(200, json={"prompt": _template(body["messages"])})
        if path == "/v1/completions":
            asked = _top(body.get("logprobs"))
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            choices = []
            for i, prompt in enumerate(prompts):
                if isinstance(prompt, list):  # llama.cpp's mixed prompt: text and token ids
                    if not any(isinstance(x, int) for x in prompt):  # as llama.cpp: text alone is not a mixed prompt
                        message = '"prompt" elements must be a string, a list of tokens, ... or a list of mixed strings & tokens.'
                        return httpx2.Response(400, json={"error": {"code": 400, "message": message}})
                    prompt = decode(prompt)
                lp = content_logprobs(prompt, asked)
                if legacy:
                    top = lp["content"][0]["top_logprobs"]
                    lp = {"tokens": [top[0]["token"]], "top_logprobs": [{e["token"]: e["logprob"] for e in top}]}
                choices.append({"index": i, "text": "", "logprobs": lp})
            return httpx2.Response(200, json={"choices": choices, "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
        if path == "/v1/chat/completions":
            return httpx2.Response(200, json={"choices": [{"index": 0, "logprobs": chat_logprobs(body)}]})
        return httpx2.Response(404, json={"error": "not found"})

    return handler


def chat_logprobs(body: dict) -> dict:
    """A chat completion's ``logprobs`` continuing the final message: the prefill probe ("A B C ...") goes on
    with " Y"."""
    if body["messages"][-1]["content"].startswith("A B C"):  # the prefill probe: continue the alphabet
        return {"content": [{"id": 124, "token": " Y", "logprob": -0.01,
                             "top_logprobs": [{"id": 124, "token": " Y", "logprob": -0.01}]}]}
    return content_logprobs("".join(f"<{m['role']}>{m['content']}" for m in body["messages"]),
                            _top(body.get("top_logprobs")))


def _top(value: Any) -> int:
    """The number of alternatives asked (at least the chosen token's); a negative or non-integer count is refused."""
    if value is None or value is False:
        return 1
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"the number of log-probabilities must be a non-negative integer, got {value!r}")
    return max(value, 1)


def _vllm_only(path: str, body: dict, context: int, max_logprobs: int) -> Any:
    if path == "/v1/models":
        return httpx2.Response(200, json={"data": [{"id": "fake", "owned_by": "vllm", "max_model_len": context}]})
    if path in ("/props", "/apply-template"):
        return httpx2.Response(404, json={"detail": "Not Found"})
    if path == "/tokenize" and "messages" in body:
        pieces = tokenize(_template(body["messages"]))
        return httpx2.Response(200, json={"tokens": [t for t, _ in pieces], "token_strs": [symbol(p) for _, p in pieces]})
    if path == "/tokenize":
        if "prompt" not in body:  # llama.cpp's shape ({"content": ...}) is a validation error here
            return httpx2.Response(400, json={"error": {"message": "prompt: Field required", "code": 400}})
        pieces = tokenize(body["prompt"])
        return httpx2.Response(200, json={"tokens": [t for t, _ in pieces], "token_strs": [symbol(p) for _, p in pieces]})
    if path == "/detokenize":
        return httpx2.Response(200, json={"prompt": decode(body["tokens"])})
    if path == "/v1/completions" and body["prompt"] and isinstance(body["prompt"][0], list):
        return vllm_completions(body, max_logprobs)
    return None


def _sglang_only(path: str, body: dict, context: int, max_logprobs: int) -> Any:
    if path == "/v1/models":
        return httpx2.Response(200, json={"data": [{"id": "fake", "owned_by": "sglang", "max_model_len": context}]})
    if path in ("/props", "/apply-template"):
        return httpx2.Response(404, json={"detail": "Not Found"})
    if path == "/tokenize":
        if ("prompt" in body) == ("messages" in body):  # llama.cpp's shape ({"content": ...}) among them
            return httpx2.Response(400, json={"object": "error", "code": 400, "type": "BadRequestError",
                                              "message": "Exactly one of 'prompt' or 'messages' must be provided."})
        texts = _template(body["messages"]) if "messages" in body else body["prompt"]
        ids = [[t for t, _ in tokenize(x)] for x in ([texts] if isinstance(texts, str) else texts)]
        found = ids[0] if isinstance(texts, str) else ids
        return httpx2.Response(200, json={"tokens": found, "count": len(found), "max_model_len": context})
    if path == "/detokenize":
        tokens = body["tokens"]
        nested = bool(tokens) and isinstance(tokens[0], list)
        return httpx2.Response(200, json={"text": [decode(t) for t in tokens] if nested else decode(tokens)})
    if path == "/v1/completions" and body["prompt"] and isinstance(body["prompt"][0], list):
        return vllm_completions({**body, "return_tokens_as_token_ids": False}, 1 << 30)  # keyed by token text
    last = body.get("messages", [{}])[-1]
    if path == "/v1/chat/completions" and last.get("role") == "assistant" and not body.get("continue_final_message"):
        lp = content_logprobs(_template(body["messages"]), _top(body.get("top_logprobs")))
        return httpx2.Response(200, json={"choices": [{"index": 0, "logprobs": lp}]})  # a new turn: no prefill
    return None


def _ollama_only(path: str, body: dict, context: int, max_logprobs: int) -> Any:
    if path == "/v1/models":
        return httpx2.Response(200, json={"object": "list", "data": [
            {"id": "qwen2.5:0.5b", "object": "model", "created": 1700000000, "owned_by": "library"}]})
    if path in ("/props", "/apply-template", "/tokenize", "/detokenize"):
        return httpx2.Response(404, text="404 page not found")
    if path == "/v1/completions":  # one text prompt, templated by the server; no log-probabilities
        if not isinstance(body.get("prompt"), str):
            return httpx2.Response(400, json={"error": {"message": "json: cannot unmarshal array into Go struct field "
                                                        "CompletionRequest.prompt of type string",
                                                        "type": "invalid_request_error"}})
        return httpx2.Response(200, json={"object": "text_completion", "choices": [{"index": 0, "text": "x"}]})
    if path == "/v1/chat/completions":
        if not 0 <= (body.get("top_logprobs") or 0) <= 20:
            return httpx2.Response(400, json={"error": {"message": "top_logprobs must be between 0 and 20",
                                                        "type": "invalid_request_error"}})
        lp = chat_logprobs(body) if body.get("logprobs") else None
        content = [{k: v for k, v in e.items() if k != "id"} | {"top_logprobs": [
            {k: v for k, v in t.items() if k != "id"} for t in e["top_logprobs"]]} for e in (lp or {}).get("content", [])]
        choice = {"index": 0, "message": {"role": "assistant", "content": content[0]["token"] if content else "x"},
                  "finish_reason": "length", **({"logprobs": {"content": content}} if lp else {})}
        return httpx2.Response(200, json={"object": "chat.completion", "system_fingerprint": "fp_ollama",
                                          "choices": [choice]})
    return None


def _template(messages: list) -> str:
    """The fake model's chat template, with the generation prompt."""
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def hosted(answer: Callable[[], dict], *, completions: bool = False, owner: str = "openai") -> Callable[[Any], Any]:
    """A ``fault`` for :func:`make_handler` that makes it a hosted API: no tokenizer, templates or props
    (and no ``/v1/completions`` unless ``completions``), one model owned by ``owner``, and ``answer()``
    as every chat completion's JSON."""
    blocked = {"/tokenize", "/apply-template", "/props", "/detokenize"} | (set() if completions else {"/v1/completions"})

    def fault(request: Any) -> Any:
        if request.url.path in blocked:
            return httpx2.Response(404, json={"error": "not found"})
        if request.url.path == "/v1/models":
            return httpx2.Response(200, json={"data": [{"id": "hosted", "owned_by": owner}]})
        if request.url.path == "/v1/chat/completions":
            return httpx2.Response(200, json=answer())
        return None

    return fault


def clients(handler: Handler | None = None, *, max_retries: int = 0) -> tuple[openai.OpenAI, openai.AsyncOpenAI]:
    """A sync and an async ``openai`` client whose transport is ``handler`` (default: ``make_handler()``,
    the llama.cpp dialect), in memory: no socket, no server. Pass them as ``client=`` and
    ``async_client=`` to :class:`~capcal_integrations.CapCalReranker` or to either adapter."""
    handler = make_handler() if handler is None else handler

    async def ahandler(request: Any) -> Any:
        await request.aread()
        return handler(request)

    kw: dict[str, Any] = dict(base_url="http://fake.test/v1", api_key="x", max_retries=max_retries)
    return (openai.OpenAI(http_client=httpx2.Client(transport=httpx2.MockTransport(handler)), **kw),
            openai.AsyncOpenAI(http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(ahandler)), **kw))


def tokenized_texts(calls: list) -> list[str]:
    """Every text the recorded ``calls`` sent to ``/tokenize``: one per call, or each text of a mixed list (the
    untrusted spans go in one batch, between separator ids)."""
    sent = [json.loads(c.content)["content"] for c in calls if c.url.path == "/tokenize"]
    return [x for content in sent for x in (content if isinstance(content, list) else [content]) if isinstance(x, str)]
