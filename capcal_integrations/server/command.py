"""``capcal serve``: the embedded model behind llama.cpp's (or vLLM's) OpenAI-compatible server, always
with a key (``--api-key``, ``$CAPCAL_API_KEY``, else a random one) recorded in a file only this user can
read, where this user's ``capcal`` commands find the server and check it is this one
(:mod:`.ownership`); no web origin may read its answers unless ``--allow-origin`` names one.

Imports nothing heavy until the command runs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from .net import ENGINES

__all__ = ["add_serve_parser", "serve_command"]


def _origin(text: str) -> str:
    if text == "*" or re.fullmatch(r"https?://[^/\s,*]+", text):
        return text
    raise argparse.ArgumentTypeError(f"expected one origin such as http://localhost:3000 (or *), got {text!r}")


def add_serve_parser(sub: Any) -> None:
    """The ``serve`` subcommand's arguments, on ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("serve", help="serve the embedded model with llama.cpp's (or vLLM's) OpenAI-compatible server")
    p.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                   help="llamacpp (default; the xllamacpp wheel) or vllm (the installed vLLM, or $CAPCAL_VLLM_PYTHON's; "
                        "the model is converted to Hugging Face format once)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", default="0.5b", help="0.5b (default), 1.5b or smollm2")
    p.add_argument("--n-parallel", type=int, default=8, help="server slots (real and empty prompts keep one each)")
    p.add_argument("--api-key", default=None,
                   help="the key clients must send (default: $CAPCAL_API_KEY, else a random one); either way it is "
                        "written to a file only you can read, where capcal commands on this machine find it. "
                        "Prefer $CAPCAL_API_KEY: other users can read a command line")
    p.add_argument("--allow-origin", type=_origin, default=None, metavar="ORIGIN",
                   help="the one web origin (e.g. http://localhost:3000) whose pages may read answers "
                        "(default: none; pages still need the key)")


def serve_command(args: argparse.Namespace) -> int:
    """Serve with a key always: ``--api-key``, ``$CAPCAL_API_KEY``, else a random one. The state file
    (mode 0600) holds it, and lets this user's commands find the server and check it is this one."""
    from .ownership import new_key

    api_key = args.api_key or os.environ.get("CAPCAL_API_KEY") or new_key()
    if args.engine == "vllm":
        return _serve_vllm(args, api_key)
    from . import serve

    serve(args.model, args.host, args.port, n_parallel=args.n_parallel, api_key=api_key,
          allow_origin=args.allow_origin, record=True)
    return 0


def _serve_vllm(args: argparse.Namespace, api_key: str) -> int:
    from . import vllm
    from .launcher import vllm_browser_flags
    from .llamacpp import check_port
    from .ownership import forget_server, record_server

    vllm.check_vllm()
    check_port(args.host, args.port)  # before the state file: a busy port may hold another server of ours
    state = record_server(args.host, args.port, api_key, engine="vllm", model=args.model)
    sys.stderr.write(f"capcal: the API key is in {state} (readable by you only; `capcal key` prints it); capcal "
                     "rerank, tune and demo on this machine find it there\n")
    sys.stderr.flush()
    try:
        return vllm.serve(args.model, args.host, args.port, api_key=api_key,
                          extra=vllm_browser_flags(args.allow_origin))
    finally:
        forget_server(state)
