"""What a method costs per reranking, from stored records: HTTP requests, prompt tokens (and those the server
found cached), completion tokens and wall time, and the wall time a reranking would have taken on its own
(:func:`standalone_seconds`). Read from a :class:`~.store.Store`; :mod:`.analysis` re-exports it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..options import CALIBRATED_METHODS
from .metrics import mean
from .store import Store, record_key

__all__ = ["Cost", "cost", "standalone_seconds"]


@dataclass
class Cost:
    """Mean per reranking: HTTP requests, prompt tokens (and those the server found cached), completion
    tokens and wall seconds, over ``n`` rerankings; also the median wall time, which a shared, noisy
    machine moves less than the mean."""

    n: int
    requests: float
    prompt_tokens: float
    cached_tokens: float
    completion_tokens: float
    seconds: float
    median_seconds: float
    median_standalone: float  # median of :func:`standalone_seconds`

    @property
    def uncached_tokens(self) -> float:
        return self.prompt_tokens - self.cached_tokens


def cost(store: Store, key: str, qids: Sequence[str] | None = None, kind: str = "rank") -> Cost | None:
    recs = [r for r in store.select(kind, key) if qids is None or r["qid"] in qids]
    if not recs:
        return None
    u = [r["usage"] for r in recs]
    return Cost(len(recs), mean([x["requests"] for x in u]), mean([x["prompt_tokens"] for x in u]),
                mean([x["cached_tokens"] for x in u]), mean([x["completion_tokens"] for x in u]),
                mean([r["seconds"] for r in recs]), statistics.median(r["seconds"] for r in recs),
                statistics.median(standalone_seconds(store, r) for r in recs))


def _uncached(rec: dict[str, Any]) -> int:
    return rec["usage"]["prompt_tokens"] - rec["usage"]["cached_tokens"]


def standalone_seconds(store: Store, rec: dict[str, Any]) -> float:
    """Wall time a reranking would have taken on its own, estimated: methods run back to back per
    query, so a method that found the real prompt already prefilled (its uncached prompt tokens are
    under half of what ``first-token``, run earlier on the same list, had to prefill) is charged
    ``first-token``'s time, i.e. one cold prefill of the real prompt; a calibrated method with the
    default placeholder that also ran after ``first-token-capcal`` is charged that one's time too
    (the empty prompt's prefill). PSC's shuffled prompts are always cold: it is charged nothing."""
    def earlier(method: str) -> dict[str, Any] | None:
        other = store.get(record_key(rec["kind"], method, rec["qid"], rec.get("variant", "")))
        ok = other and other.get("time") and rec.get("time") and other["time"] <= rec["time"]
        return other if ok and other["input"] == rec["input"] else None

    seconds = rec["seconds"]
    method = rec["method"]
    ft = earlier("first-token")
    if method == "first-token" or ft is None or _uncached(rec) >= _uncached(ft) / 2:
        return seconds
    seconds += ft["seconds"]
    ftc = earlier("first-token-capcal")
    base, _, options = method.partition(":")
    calibrated = base in CALIBRATED_METHODS and "placeholder=" not in options
    if calibrated and method != "first-token-capcal" and ftc is not None:
        seconds += ftc["seconds"]
    return seconds
