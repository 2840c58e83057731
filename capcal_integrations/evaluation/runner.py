"""Plan and run the rerankings of an evaluation, resumably.

Three kinds of job, each one reranking of one list of candidates by one method:

* ``rank``: the first-stage top-``k`` in first-stage order (quality, cost);
* ``shuffle``: the same top-``k`` in a fixed random order (variant = shuffle index; position bias);
* ``needle``: one highly relevant passage among ``k - 1`` judged non-relevant ones from the same
  candidate list, at position ``variant`` (1-based).

Jobs are grouped per query and a group's jobs run back to back, so the server's prompt cache is
reused across methods. Wall time is measured per reranking, in that order: the first model method of
a group pays the cold prompt that later methods then find cached (the report says so).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import CapCalError, EndpointUnreachable
from ..types import Ranking
from .bias import needle_list, pick_needle, shuffle_of
from .data import Dataset, Topic
from .specs import MethodSpec
from .store import Store, record_key

log = logging.getLogger(__name__)

__all__ = ["Job", "rank_jobs", "shuffle_jobs", "needle_jobs", "Runner", "RunSummary"]

_MAX_CONSECUTIVE_FAILURES = 3


@dataclass(frozen=True)
class Job:
    kind: str
    spec: MethodSpec
    topic: Topic
    docids: tuple[str, ...]  # the input list, in prompt order
    variant: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return record_key(self.kind, self.spec.key, self.topic.qid, self.variant)


Group = tuple[Topic, list[Job]]


def _top(topic: Topic, k: int) -> tuple[str, ...]:
    return tuple(c.docid for c in topic.candidates[:k])


def rank_jobs(topics: Sequence[Topic], specs: Sequence[MethodSpec], top: int) -> list[Group]:
    return [(t, [Job("rank", s, t, _top(t, top)) for s in specs]) for t in topics]


def shuffle_jobs(topics: Sequence[Topic], specs: Sequence[MethodSpec], top: int, shuffles: int) -> list[Group]:
    """``shuffles`` fixed random orders of each topic's top-``k``; per shuffle, all methods back to back."""
    groups = []
    for t in topics:
        base = _top(t, top)
        jobs = []
        for s in range(shuffles):
            perm = shuffle_of(len(base), f"{t.qid}/{s}")
            jobs += [Job("shuffle", spec, t, tuple(base[i] for i in perm), str(s)) for spec in specs]
        groups.append((t, jobs))
    return groups


def needle_jobs(dataset: Dataset, topics: Sequence[Topic], specs: Sequence[MethodSpec], top: int, queries: int,
                positions: Sequence[int] | None = None) -> list[Group]:
    """The needle test on the first ``queries`` topics that have a grade >= 2 passage (>= 1 for binary
    judgements) and ``top - 1`` judged non-relevant candidates."""
    grades = dataset.grades()
    min_grade = dataset.rel_threshold
    groups = []
    for t in topics:
        if len(groups) >= queries:
            break
        picked = pick_needle([c.docid for c in t.candidates], grades.get(t.qid, {}), top, min_grade)
        if picked is None:
            continue
        needle, distractors = picked
        jobs = []
        for p in positions or range(1, top + 1):
            docids = tuple(needle_list(needle, distractors, p))
            info = {"needle": needle, "position": p, "grade": grades[t.qid][needle]}
            jobs += [Job("needle", spec, t, docids, str(p), info) for spec in specs]
        groups.append((t, jobs))
    return groups


@dataclass
class RunSummary:
    done: int = 0
    cached: int = 0
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # (method, qid, error)
    seconds: float = 0.0


def _r(values: Sequence[float] | None, digits: int = 6) -> list[float] | None:
    return None if values is None else [round(float(v), digits) for v in values]


def make_record(job: Job, ranking: Ranking | None, seconds: float, model: str = "") -> dict[str, Any]:
    """The stored form of one reranking (``ranking`` None for the first-stage order: bm25)."""
    docids = list(job.docids)
    rec: dict[str, Any] = {"kind": job.kind, "method": job.spec.key, "label": job.spec.label, "qid": job.topic.qid,
                           "variant": job.variant, "input": docids, **job.extra}
    if ranking is None:
        bm25 = {c.docid: c.bm25_rank for c in job.topic.candidates}
        order = sorted(docids, key=lambda d: bm25[d])
        rec.update(order=order, scores=[float(len(docids) - order.index(d)) for d in docids], seconds=0.0,
                   usage={"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0})
        return rec
    u = ranking.usage
    rec.update(
        order=[docids[i] for i in ranking.order],
        scores=_r(ranking.scores),
        prior=_r(ranking.prior),
        usage={"requests": u.requests, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
               "cached_tokens": u.cached_tokens},
        seconds=round(seconds, 3),
        upper_bounds=ranking.upper_bounds,
        alphas=_r([s.alpha for s in ranking.steps], 4),
        entropies=_r([s.entropy for s in ranking.steps], 4),
        model=model,
        time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    if ranking.steps:
        first = ranking.steps[0]
        rec["first_step"] = {"candidates": list(first.candidates), "p": _r(first.p), "q": _r(first.q),
                             "s": _r(first.scores)}
    if ranking.notes:
        rec["notes"] = list(ranking.notes)
    kept = ranking.kept_given_order
    rec.update(guarded=[0] if kept else [], checked=list(ranking.checked), kept_given_order=kept, ran=ranking.method)
    return rec


class Runner:
    """Runs jobs through one reranker (``None`` if every method is bm25), storing each result.

    ``model_id`` names the model in every record (:mod:`.identity`); without it, the served name.
    """

    def __init__(self, store: Store, reranker: Any | None, *, progress: bool = True, model_id: str | None = None) -> None:
        self.store, self.reranker, self.progress, self.model_id = store, reranker, progress, model_id
        self._variants: dict[str, Any] = {}

    def _for(self, spec: MethodSpec) -> Any:
        if spec.key not in self._variants:
            # an evaluation waits for the content check's readings: every list is ranked in order, reproducibly
            self._variants[spec.key] = self.reranker.with_options(**{"check_wait": True, **spec.reranker_options()})
        return self._variants[spec.key]

    async def _one(self, job: Job) -> dict[str, Any]:
        if not job.spec.uses_model:
            return make_record(job, None, 0.0)
        if self.reranker is None:
            raise CapCalError(f"method {job.spec.label!r} needs a model endpoint")
        by_id = {c.docid: c for c in job.topic.candidates}
        docs = [by_id[d].document() for d in job.docids]
        rr = self._for(job.spec)
        start = time.perf_counter()
        ranking = await rr.arerank(job.topic.query, docs)
        return make_record(job, ranking, time.perf_counter() - start, self.model_id or rr.model or "")

    async def run(self, groups: Sequence[Group], desc: str = "") -> RunSummary:
        """Run every job not yet in the store, group after group, with a progress bar over queries."""
        from tqdm.auto import tqdm

        summary = RunSummary()
        start = time.perf_counter()
        pending = [(t, [j for j in jobs if j.key not in self.store]) for t, jobs in groups]
        summary.cached = sum(len(jobs) for _, jobs in groups) - sum(len(jobs) for _, jobs in pending)
        todo = [(t, jobs) for t, jobs in pending if jobs]
        bar = tqdm(total=len(groups), initial=len(groups) - len(todo), unit="query", desc=desc or "eval",
                   disable=not self.progress, mininterval=1.0, dynamic_ncols=True)
        consecutive = 0
        try:
            for topic, jobs in todo:
                for job in jobs:
                    bar.set_postfix_str(f"{topic.qid} {job.spec.label}{' #' + job.variant if job.variant else ''}",
                                        refresh=False)
                    try:
                        rec = await self._one(job)
                    except CapCalError as err:
                        summary.failed.append((job.spec.label, topic.qid, f"{type(err).__name__}: {err}"))
                        log.warning("%s %s %s failed: %s", job.kind, job.spec.label, topic.qid, err)
                        consecutive += 1
                        if isinstance(err, EndpointUnreachable) or consecutive >= _MAX_CONSECUTIVE_FAILURES:
                            raise
                        continue
                    consecutive = 0
                    self.store.add(rec)
                    summary.done += 1
                bar.update(1)
        finally:
            bar.close()
            summary.seconds = time.perf_counter() - start
        return summary
