"""A testbed with known signal and known bias: a simulated reranker endpoint for measuring the library's rules.

**A test instrument.** It shows what the library's decision rules (calibration strength, content
check, guard) do on a reranker whose content signal and slot bias are known, not what a real model
does: the model behind it is a formula (:mod:`.model`), fitted to two small models' first steps.

:func:`simulated_endpoint` serves your lists (query, passages, relevance grades) through a simulated
llama.cpp server (:mod:`.endpoint`), an in-process httpx transport, so the whole path of
:class:`~capcal_integrations.CapCalReranker` runs (probe, tokenize, prompt lists, constrained decoding,
windows). Each identifier's logit is ``s * grade + b(slot) + delta(slot) + preference + noise`` in a
real prompt and ``b(slot) + noise`` in the empty one::

    from capcal_integrations.testbed import simulated_endpoint
    lists = [("how long do fleas live", ["Fleas live ...", "Cats ..."], [3, 0])]
    endpoint = simulated_endpoint(lists, s=1.0, scenario="delta-0.5b", seed=0)
    ranking = endpoint.reranker(method="capcal", alpha=1.0).rerank(*lists[0][:2])

``capcal testbed --data DIR`` measures every method on a data folder (:mod:`.measure`, :mod:`.command`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from ..errors import InputError
from ..transport.client import http_library
from .endpoint import Judged, PassageIndex, SimulatedServer
from .model import SCENARIOS, SlotModel, scenario

__all__ = ["simulated_endpoint", "SimulatedEndpoint", "SlotModel", "SCENARIOS", "scenario", "judged_lists"]

BASE_URL = "http://testbed.invalid/v1"


class SimulatedEndpoint:
    """A simulated llama.cpp server: its ``base_url``, sync and async HTTP clients (``httpx2``, or ``httpx``
    under openai 2.x) whose transport it is (``http_client``, ``async_http_client``), the ``server`` (what it
    was asked: ``server.stats``) and :meth:`reranker`."""

    def __init__(self, server: SimulatedServer) -> None:
        self.server = server
        self.base_url = BASE_URL

        async def handle(request: Any) -> Any:
            await request.aread()
            return server(request)

        http = http_library()  # the installed openai's: httpx2 (openai 3.x) or httpx (2.x)
        self.http_client = http.Client(transport=http.MockTransport(server))
        self.async_http_client = http.AsyncClient(transport=http.MockTransport(handle))

    @property
    def model(self) -> SlotModel:
        return self.server.model

    def reranker(self, **options: Any):
        """A :class:`~capcal_integrations.CapCalReranker` on this endpoint (no retries), with ``options``."""
        from ..reranker import CapCalReranker

        return CapCalReranker(base_url=self.base_url, api_key="testbed", http_client=self.http_client,
                              async_http_client=self.async_http_client, max_retries=0, **options)


def judged_lists(data: Any, top: int | None = None) -> list[Judged]:
    """``(query, passages, grades)`` lists from a dataset directory in the shared format (a path), an
    :class:`~capcal_integrations.evaluation.data.Dataset`, or such triples (returned as they are);
    ``top`` keeps each list's first candidates. Passages without a judgement have grade 0."""
    if isinstance(data, (str, pathlib.Path)):
        from ..evaluation.data import load_dataset

        data = load_dataset(data)
    if hasattr(data, "topics") and hasattr(data, "grades"):
        grades = data.grades()
        return [(t.query, [c.text if not c.title else f"Title: {c.title} Content: {c.text}" for c in t.candidates[:top]],
                 [grades.get(t.qid, {}).get(c.docid, 0) for c in t.candidates[:top]]) for t in data.topics]
    lists = [(str(q), list(p), [int(g) for g in gs]) for q, p, gs in data]
    return [(q, p[:top], g[:top]) for q, p, g in lists]


def simulated_endpoint(data: Any, *, s: float = 1.0, scenario: str | None = None, prior: Sequence[float] | None = None,
                       delta: Sequence[float] | None = None, preference: float | None = None, noise: float | None = None,
                       noise_empty: float | None = None, tie: int | None = None, seed: int = 0, context: int = 32768,
                       slots: int = 8, model: SlotModel | None = None, noise_scale: float | None = None,
                       tails: float | None = None, shared_slots: float | None = None) -> SimulatedEndpoint:
    """A simulated llama.cpp reranker serving ``data`` (a dataset directory, a ``Dataset``, or
    ``(query, passages, grades)`` triples: see :func:`judged_lists`).

    The reranker: content slope ``s`` per relevance grade; the slot prior ``prior`` (``b``, logits per slot)
    and the real-vs-empty mismatch ``delta`` (real prompts only); per-passage ``preference`` (SD, unrelated to
    relevance); Gaussian ``noise`` (real prompt) and ``noise_empty`` (empty prompt) per slot and prompt,
    seeded by ``seed``; ``tie`` lowest labels tied at a floor; per list (its query), the noise multiplied by
    ``exp(N(0, noise_scale))``, Student-t noise with ``tails`` degrees of freedom, slot effects of SD
    ``shared_slots`` shared by every real prompt of the list (:class:`~.model.SlotModel`). Unset parameters come from ``scenario``
    (:data:`~.model.SCENARIOS`, default ``"no-delta"``: the 0.5B model's fitted prior and noise, no
    mismatch) or from a whole ``model``. A passage the server cannot find in ``data`` is an HTTP 400.
    """
    if model is None:
        model = SCENARIOS.get(scenario or "no-delta")
        if model is None:
            raise InputError(f"unknown testbed scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    changes = {k: v for k, v in (("prior", prior), ("delta", delta), ("preference", preference), ("noise", noise),
                                 ("noise_empty", noise_empty), ("tie", tie), ("noise_scale", noise_scale),
                                 ("tails", tails), ("shared_slots", shared_slots)) if v is not None}
    for k in ("prior", "delta"):
        if k in changes:
            changes[k] = tuple(float(x) for x in changes[k])
    model = model.replace(s=float(s), seed=int(seed), **changes)
    return SimulatedEndpoint(SimulatedServer(PassageIndex(judged_lists(data)), model, context=context, slots=slots))


