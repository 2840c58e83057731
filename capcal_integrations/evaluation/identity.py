"""Which model an evaluation ran, so that a resumed run never files one model's results under another's.

Every embedded model is served under the name ``local``, so the served name alone says nothing. The
identity (``model_id``, in meta.json and in every record that used a model) is:

* the embedded model's name (``0.5b``) when ``capcal eval`` chose the server (no ``--base-url``);
* the endpoint's model id and host (``gpt-4o-mini@api.openai.com``) for an endpoint given by URL.

Where the server says which weights it loaded (llama.cpp's ``/props``, vLLM's ``/v1/models``), their
file name is recorded too (``weights``), and a server chosen for an embedded model must serve that
model's weights. :func:`check_resume` refuses to add records to an output folder whose records or
meta.json name another model.
"""

from __future__ import annotations

import logging
import os
import pathlib
import urllib.parse
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import InputError
from .store import Store

log = logging.getLogger(__name__)

__all__ = ["embedded_model", "planned_model_id", "model_id", "endpoint_host", "served_weights", "check_weights",
           "recorded_models", "check_resume", "check_fingerprint", "set_aside"]


def embedded_model(base_url: str | None, model: str | None) -> str | None:
    """The embedded model ``capcal eval`` will run (as :func:`~..server.endpoint` chooses it), or None
    when it uses an endpoint given by URL (``--base-url``, else ``$CAPCAL_BASE_URL``)."""
    return None if (base_url or os.environ.get("CAPCAL_BASE_URL")) else (model or "0.5b")


def endpoint_host(base_url: str) -> str:
    """``host[:port]`` of ``base_url``, without any credentials it carries.

    >>> endpoint_host("https://user:secret@api.example.com/v1")
    'api.example.com'
    >>> endpoint_host("http://127.0.0.1:8091/v1")
    '127.0.0.1:8091'
    """
    return urllib.parse.urlsplit(base_url).netloc.rpartition("@")[2]


def model_id(embedded: str | None, served: str | None, base_url: str) -> str:
    """The identity of the model: the embedded model's name, else ``served@host``.

    >>> model_id("1.5b", "local", "http://127.0.0.1:40123/v1")
    '1.5b'
    >>> model_id(None, "gpt-4o-mini", "https://api.openai.com/v1")
    'gpt-4o-mini@api.openai.com'
    """
    return embedded if embedded else f"{served or '?'}@{endpoint_host(base_url)}"


def planned_model_id(base_url: str | None, model: str | None) -> str | None:
    """The identity known before connecting: the embedded model, or a named model at a given URL;
    None when only the endpoint can say (a URL without ``--model``, or with an embedded model's name,
    which :func:`~..server.endpoint` does not send)."""
    from ..server import MODELS

    if (embedded := embedded_model(base_url, model)) is not None:
        return embedded
    url = base_url or os.environ["CAPCAL_BASE_URL"]
    return model_id(None, model, url) if model and model not in MODELS else None


def served_weights(reranker: Any, server: str | None, base_url: str) -> str | None:
    """The file name of the weights the server loaded, where it says (llama.cpp: ``/props``
    ``model_path``; vLLM: ``/v1/models`` ``root``); None elsewhere or on any failure."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        if server == "llama.cpp":
            path = reranker.client.get(root + "/props", cast_to=object).get("model_path")
        elif server == "vllm":
            path = reranker.client.get(root + "/v1/models", cast_to=object)["data"][0].get("root")
        else:
            return None
    except Exception as err:  # a report detail: never a reason to fail the run
        log.info("the server did not say which weights it loaded (%s)", err)
        return None
    return pathlib.PurePath(path).name if isinstance(path, str) and path else None


def check_weights(embedded: str | None, weights: str | None, base_url: str) -> None:
    """Raise :class:`InputError` when the server chosen for embedded model ``embedded`` says it loaded
    other weights (a server found running on ``--port`` may serve another model)."""
    from ..server import MODELS

    if not embedded or not weights or embedded not in MODELS:
        return
    stem = MODELS[embedded].filename.removesuffix(".gguf")
    if not weights.startswith(stem):  # the GGUF itself (llama.cpp), or its "-hf" conversion (vLLM)
        raise InputError(f"the server at {endpoint_host(base_url)} serves {weights}, not the embedded model "
                         f"{embedded!r} ({MODELS[embedded].filename}): stop it, or choose another --port")


def recorded_models(store: Store, meta: Mapping[str, Any]) -> set[str]:
    """The models the folder's results name: meta.json's ``model_id`` and every model record's ``model``
    (records written before records named their model say ``local``, or nothing)."""
    names = {str(meta["model_id"])} if meta.get("model_id") else set()
    for kind in ("rank", "shuffle", "needle"):
        names.update(str(r.get("model") or "an unnamed model") for r in store.select(kind) if "model" in r)
    return names


def check_resume(out: pathlib.Path, store: Store, meta: Mapping[str, Any], current: str) -> None:
    """Raise :class:`InputError` if ``out`` holds results of a model other than ``current``: resuming
    would reuse them as if ``current`` had made them."""
    others = sorted(recorded_models(store, meta) - {current})
    if others:
        raise InputError(f"{out} holds results of model {', '.join(repr(o) for o in others)}, not {current!r}; "
                         "resuming there would report them as this model's. Pass another --out, or --fresh to set "
                         "that folder's records aside and start over")


def check_fingerprint(out: pathlib.Path, meta: Mapping[str, Any], current: str) -> None:
    """Raise :class:`InputError` if ``out``'s meta.json recorded other served weights than ``current`` (the probe's
    fingerprint of what the server reports: :func:`~..probe.fingerprint`), whatever the served name: two models
    served under one name by one server are not the same model. Nothing is said where either is unknown.

    >>> check_fingerprint(pathlib.Path("out"), {"fingerprint": "sha256:a"}, "sha256:a")
    >>> try:
    ...     check_fingerprint(pathlib.Path("out"), {"fingerprint": "sha256:a"}, "sha256:b")
    ... except InputError as err:
    ...     print(str(err)[:72])
    out holds results of other weights served under the same name (sha256:a,
    """
    recorded = meta.get("fingerprint")
    if recorded and current and recorded != current:
        raise InputError(f"{out} holds results of other weights served under the same name ({recorded}, now {current}); "
                         "resuming there would report them as this model's. Pass another --out, or --fresh to set "
                         "that folder's records aside and start over")


def set_aside(out: pathlib.Path) -> list[pathlib.Path]:
    """``--fresh``: rename ``out``'s records.jsonl and meta.json to ``*.<UTC time>.old`` (kept, never read
    again) and remove the run files made from them; returns the new names."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    moved = []
    for name in ("records.jsonl", "meta.json"):
        path = out / name
        if path.exists():
            moved.append(path.rename(out / f"{name}.{stamp}.old"))
    for run in (out / "runs").glob("*.txt"):
        run.unlink()
    return moved
