"""A packaged model and a "vLLM Python" for tests of the vLLM engine that need neither vLLM nor a download.

:func:`fake_model` registers model "fake", made of two small files of the installed pytest
distribution. :func:`fake_python` writes a shell script that stands for the Python that has vLLM:
check_vllm's probe finds every module; ``-m vllm.entrypoints.openai.api_server`` runs a tiny HTTP
server that answers /health and writes its command line and API key to ``<dir>/vllm.json``; anything
else is a conversion, by a converter that logs its pid to ``<dir>/conversions`` and writes three files
and one named after itself, 0.2 s apart (exit 3 after them with ``FAKE_CONVERT_FAIL=1``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import pathlib
import re
import sys
import textwrap

import httpx2
import pytest

from capcal_integrations.server import MODELS, ModelSpec

PARTS = (("pytest", "pytest/__init__.py"), ("pytest", "pytest/__main__.py"))

_CONVERTER = """\
import os, pathlib, sys, time
out, tag = pathlib.Path(sys.argv[3]), str(os.getpid())
with open({log!r}, "a") as f:
    f.write(tag + "\\n")
out.mkdir(parents=True, exist_ok=True)
for name in ("config.json", "model.safetensors", "tokenizer.json", "only-" + tag):
    time.sleep(0.2)
    (out / name).write_text(tag)
sys.exit(3 if os.environ.get("FAKE_CONVERT_FAIL") else 0)
"""

_SERVER = """\
import http.server, json, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as vLLM: a clean exit on SIGTERM
with open({info!r}, "w") as f:
    json.dump({{"argv": sys.argv, "key": os.environ.get("VLLM_API_KEY")}}, f)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Health).serve_forever()
"""


def fake_model(monkeypatch: pytest.MonkeyPatch, cache: pathlib.Path) -> bytes:
    """Register model "fake" (cached in ``cache``); return the bytes its GGUF must have."""
    data = b"".join(next(f for f in md.files(d) if f.as_posix() == rel).locate().read_bytes() for d, rel in PARTS)
    spec = ModelSpec("fake", "test", ("pytest",), PARTS, hashlib.sha256(data).hexdigest(), len(data), "fake.gguf")
    monkeypatch.setitem(MODELS, "fake", spec)
    monkeypatch.setenv("CAPCAL_CACHE_DIR", str(cache))
    return data


def fake_python(folder: pathlib.Path) -> pathlib.Path:
    """The fake "vLLM Python" (see the module docstring), written into ``folder``."""
    converter, server = folder / "fake_convert.py", folder / "fake_vllm.py"
    converter.write_text(_CONVERTER.format(log=str(folder / "conversions")))
    server.write_text(textwrap.dedent(_SERVER.format(info=str(folder / "vllm.json"))))
    python = folder / "fake-python"
    python.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\n'
                      f'[ "$1" = "-m" ] && shift 2 && exec "{sys.executable}" "{server}" "$@"\n'
                      f'exec "{sys.executable}" "{converter}" "$@"\n')
    python.chmod(0o755)
    return python


# --------------------------------------------------------------------------- an endpoint: vLLM with other control tokens

#: Control tokens shaped like no family the deny-list knows (MiniMax's, GLM's), with ids past the fake vocabulary.
OTHER_CONTROLS = {"]~b]": 1_000_000 + 0xF0000, "[e~[": 1_000_000 + 0xF0001, "[gMASK]": 1_000_000 + 0xF0002}
#: Control tokens of the same tokenizers that their chat templates do not use (GLM's ``[sMASK]``, MiniMax's
#: ``]!d~[``, Qwen's ``<tool_call>``): learned from the prompts, not from the template (issue 36).
UNUSED_CONTROLS = {"[sMASK]": 1_000_000 + 0xF0003, "]!d~[": 1_000_000 + 0xF0004, "<tool_call>": 1_000_000 + 0xF0005}


def other_controls_handler(calls: list | None = None, *, sglang: bool = False, unused: bool = False):
    """A fake vLLM endpoint (``tests.fake_endpoint.make_handler(vllm=True)``; ``sglang``: SGLang's dialect) whose
    tokenizer treats :data:`OTHER_CONTROLS` (and, with ``unused``, :data:`UNUSED_CONTROLS`) as control tokens,
    matched in any text as vLLM's tokenizer does, and whose chat template (MiniMax-like) is made of the first
    ones only: ``[gMASK]]~b]user\\n...[e~[\\n]~b]ai\\n``."""
    from tests.fake_endpoint import decode, make_handler, symbol, tokenize

    controls = {**OTHER_CONTROLS, **(UNUSED_CONTROLS if unused else {})}
    pattern = re.compile("(" + "|".join(re.escape(t) for t in sorted(controls, key=len, reverse=True)) + ")")
    text_of = {v: k for k, v in controls.items()}

    def tokens(text: str) -> list[tuple[int, str]]:
        return [token for part in pattern.split(text) if part
                for token in ([(controls[part], part)] if part in controls else tokenize(part))]

    def text(ids: list[int]) -> str:
        return "".join(text_of.get(t) or decode([t]) for t in ids)

    def answer(pieces: list[tuple[int, str]]) -> httpx2.Response:
        if sglang:
            return httpx2.Response(200, json={"tokens": [t for t, _ in pieces], "count": len(pieces)})
        return httpx2.Response(200, json={"tokens": [t for t, _ in pieces], "token_strs": [symbol(p) for _, p in pieces]})

    def fault(request: httpx2.Request) -> httpx2.Response | None:
        body = json.loads(request.content) if request.content else {}
        if request.url.path == "/tokenize" and "messages" in body:
            rendered = "[gMASK]" + "".join(f"]~b]{m['role']}\n{m['content']}[e~[\n" for m in body["messages"]) + "]~b]ai\n"
            return answer(tokens(rendered))
        if request.url.path == "/tokenize" and isinstance(body.get("prompt"), list) and sglang:
            found = [[t for t, _ in tokens(x)] for x in body["prompt"]]
            return httpx2.Response(200, json={"tokens": found, "count": len(found)})
        if request.url.path == "/tokenize" and "prompt" in body:
            return answer(tokens(body["prompt"]))
        if request.url.path == "/detokenize" and sglang:
            ids = body["tokens"]
            nested = bool(ids) and isinstance(ids[0], list)
            return httpx2.Response(200, json={"text": [text(x) for x in ids] if nested else text(ids)})
        if request.url.path == "/detokenize":
            return httpx2.Response(200, json={"prompt": text(body["tokens"])})
        return None

    return make_handler(vllm=not sglang, sglang=sglang, fault=fault, calls=calls)
