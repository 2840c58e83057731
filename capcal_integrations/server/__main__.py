"""``python -m capcal_integrations.server``: serve an embedded model at http://HOST:PORT/v1 until stopped.

``python -m capcal_integrations.server --model 0.5b --port 8080`` serves http://127.0.0.1:8080/v1.
Errors are one line, ``capcal: error: ...``, and exit code 1.

The API key, if any, is read from ``$CAPCAL_API_KEY`` and never taken as a flag: any user can read a
process's command line, only its owner its environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..errors import CapCalError
from .launcher import vllm_browser_flags
from .llamacpp import serve
from .models import MODELS
from .net import ENGINES


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m capcal_integrations.server", description=__doc__)
    ap.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                    help="llamacpp (default: the xllamacpp wheel) or vllm (whatever vLLM $CAPCAL_VLLM_PYTHON has)")
    ap.add_argument("--model", choices=list(MODELS), default="0.5b",
                    help="; ".join(f"{k}: {v.description}" for k, v in MODELS.items()))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--n-parallel", type=int, default=8, help="server slots (default 8)")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="context tokens per slot (default 4096)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--alias", default="local", help='model name shown by /v1/models (default "local")')
    ap.add_argument("--no-prefill", action="store_true",
                    help="do not continue a final assistant message (behave as hosted APIs do)")
    ap.add_argument("--allow-origin", default=None, metavar="ORIGIN",
                    help="the one web origin (e.g. http://localhost:3000) whose pages may read answers (default none)")
    ap.add_argument("--parent-fd", type=int, default=None,
                    help="read end of a pipe held open by the parent; stop when it reads EOF (set by EmbeddedServer)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="capcal: %(message)s")
    api_key = os.environ.get("CAPCAL_API_KEY") or None
    try:
        if a.engine == "vllm":
            from . import vllm

            keyed = {"api_key": api_key} if api_key else {}
            sys.exit(vllm.serve(a.model, a.host, a.port, alias=a.alias, max_model_len=a.ctx_per_slot,
                                parent_fd=a.parent_fd, extra=vllm_browser_flags(a.allow_origin), **keyed))
        serve(a.model, a.host, a.port, n_ctx_per_slot=a.ctx_per_slot, n_parallel=a.n_parallel,
              threads=a.threads, alias=a.alias, parent_fd=a.parent_fd, prefill=not a.no_prefill,
              api_key=api_key, allow_origin=a.allow_origin)
    except CapCalError as e:
        sys.stderr.write(f"capcal: error: {e}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
