"""Batch reranking on Ray: many lists, sharded by query over workers, each bound to one endpoint.

A calibrated ranking is a conversation of short requests with one endpoint (the probe, ``/tokenize``,
one prompt list per decoding step), not one prompt and one generation per row, so Ray Data's LLM
processors do not fit it. What fits is sharding by query: each worker is a Ray actor with its own
:class:`~.CapCalReranker` bound to one endpoint (one of several base URLs, or one router URL:
then pass ``routed=True``, and the routing key keeps each list on one replica, see :mod:`.routing`),
and ranks its share of the lists a few at a time with ``arerank``.

Results are written as they come, by the driver alone, one JSON line per list (a ``write`` of a whole
line, flushed and synced), so a run that is stopped, however hard, leaves finished lines and at most
one torn last line. Run again with the same output, it drops the torn line, skips every list the
output already holds and ranks only the rest: none is ranked twice into the file, none is lost. A list
is known by its identity, never by its line number: its ``qid``, else a hash of its query and passages
(:func:`list_hash`), both written in its output line. An input that changed under the output (a list
the output holds is gone, or a ``qid``'s list is not the one ranked) is refused with an
:class:`~.errors.InputError`: resuming would mix two inputs. A list that fails stops the run (its error
is raised; nothing is turned into a score), and a new run resumes after the lists that finished.

The API key never goes to Ray as an argument (Ray keeps actor arguments in its task metadata): the driver
writes it to a file only this user can read (0600, in a 0700 folder), the workers read it from there, and
the file is deleted when the run ends. On a multi-node cluster, where the workers cannot read the driver's
files, give the key in the cluster's environment (``OPENAI_API_KEY``) and pass no ``api_key``.

The content check (``guard="query"``, the default, or ``"content"``) is decided once for the whole run: the first lists
go to one worker alone until it has decided, its decision is handed to every other worker and saved beside
the output (``OUTPUT.decision.json``, written whole: a temporary file renamed over it), where a resumed run picks
it up if it is about the same model and options (``decision=`` given wins); one about another model (the
endpoint now serves other weights) or unreadable is decided afresh and replaced. Only one run at a time writes
an output: a second is refused while the first holds ``OUTPUT.lock`` (an ``fcntl`` lock).

Ray is an optional extra (``pip install "capcal-integrations[ray]"``): this module imports it only
when a run starts, and ``import capcal_integrations`` never imports this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..content_check.check import CAP, decision_key, load_decision
from ..content_check.saved_decisions import write_atomically
from ..errors import InputError, MissingExtra
from ..options import Options
from ..reranker import CapCalReranker
from ..types import Ranking
from .batchfile import finished, identities, list_hash, pending, read_rows, record, rows_of

__all__ = ["rerank_batch", "read_rows", "finished", "pending", "identities", "list_hash", "record", "worker_options",
           "decision_path", "BatchResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    """What a run did: lists ranked now, lists the output already held, and the output's path."""

    ranked: int
    skipped: int
    output: Path


def worker_options(endpoints: Sequence[str], workers: int, options: Mapping[str, Any]) -> dict[str, Any]:
    """The ranking options of every worker, checked (before Ray starts). Several workers on one endpoint
    are several clients of it, and none may pin a llama.cpp slot another's request may be using, so
    ``routed`` defaults to True there (no pins, prompts one by one; see :mod:`.routing`).

    >>> worker_options(["http://a/v1"], 2, {})["routed"], worker_options(["http://a/v1", "http://b/v1"], 2, {})
    (True, {})
    """
    out = dict(options)
    if workers > len(set(endpoints)):
        out.setdefault("routed", True)
    Options().replace(**out)
    return out


def rerank_batch(source: Any, output: str | os.PathLike[str], *, endpoints: Sequence[str], workers: int | None = None,
                 lists_per_worker: int = 2, api_key: str | None = None, model: str | None = None,
                 top_n: int | None = None, progress: bool = True, **options: Any) -> BatchResult:
    """Rank every list of ``source`` (a JSONL path, a Ray Dataset, or mappings with ``query`` and
    ``passages``) into ``output`` (JSONL, appended to; see the module docstring for resuming).

    ``endpoints``: base URLs; worker ``k`` talks to ``endpoints[k % len(endpoints)]``. ``workers``
    (default one per endpoint) Ray actors rank ``lists_per_worker`` lists at a time each. ``options``
    are ranking options (:class:`~.options.Options`); ``routed`` defaults to True when workers share an
    endpoint (a router URL, or more workers than URLs). Uses the running Ray (``ray.init`` first to
    choose the cluster or its size), else starts a local one."""
    if isinstance(endpoints, str) or not endpoints or not all(isinstance(e, str) and e for e in endpoints):
        raise InputError("endpoints must be a non-empty list of base URLs")
    workers = len(endpoints) if workers is None else workers
    if not (isinstance(workers, int) and workers >= 1 and isinstance(lists_per_worker, int) and lists_per_worker >= 1):
        raise InputError(f"workers and lists_per_worker must be integers >= 1, got {workers} and {lists_per_worker}")
    options = worker_options(endpoints, workers, options)
    opts, saved = Options().replace(**options), decision_path(output)
    deciding = opts.guard is not None and opts.calibrated and not opts.decision
    if deciding:  # a batch waits for the check's readings: every list after the decision is ranked by it
        options = {"check_wait": True, **options}
    rows = rows_of(source)
    for row, key in zip(rows, identities(rows)):
        if key[0] == "list" and key[2]:
            row["copy"] = key[2]
    with _output_lock(Path(output)):
        todo = pending(rows, finished(output))
        skipped = len(rows) - len(todo)
        if skipped:
            log.info("batch: %d of %d lists already in %s; ranking the other %d", skipped, len(rows), output, len(todo))
        if todo:
            with _key_file(api_key) as key_file:
                _run(todo, Path(output), [endpoints[k % len(endpoints)] for k in range(workers)], lists_per_worker,
                     dict(model=model, **options), top_n, progress, total=len(rows), skipped=skipped, deciding=deciding,
                     key_file=key_file, saved=saved if deciding and saved.is_file() else None)
    return BatchResult(len(todo), skipped, Path(output))


@contextlib.contextmanager
def _output_lock(output: Path) -> Iterator[None]:
    """Hold ``OUTPUT.lock`` (``fcntl.flock``, not waited for) while a run writes ``output``: a second run on the
    same output is an :class:`~.errors.InputError`. The lock file stays (removing it would let a third run lock a
    new file while the second holds the old one)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock
        yield
        return
    path = Path(str(output) + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another capcal batch run is writing {output} (it holds {path}): wait for it to end, "
                             "or write another output") from None
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _key_file(api_key: str | None) -> Iterator[str | None]:
    """The path of a file holding ``api_key`` that only this user can read (0600 in a 0700 folder), deleted
    on exit; ``None`` without a key (the workers' ``OPENAI_API_KEY`` then applies, as for any client)."""
    if api_key is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="capcal-batch-")  # 0700
    path = os.path.join(folder, "api_key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(api_key)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_key(path: str | None) -> str | None:
    """A worker's API key, from the driver's key file (:func:`_key_file`); ``None`` without one."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise InputError(f"the batch's API key file is not readable on this node ({err.strerror}): on a multi-node "
                         "cluster set OPENAI_API_KEY in the cluster's environment and pass no api_key") from None


def decision_path(output: str | os.PathLike[str]) -> Path:
    """Where a run saves the content check's decision: beside its output."""
    return Path(str(output) + ".decision.json")


def _run(rows: list[dict[str, Any]], output: Path, urls: list[str], at_once: int, settings: dict[str, Any],
         top_n: int | None, progress: bool, *, total: int, skipped: int, deciding: bool = False,
         key_file: str | None = None, saved: Path | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise MissingExtra("ray", "ray") from None
    from tqdm import tqdm

    if not ray.is_initialized():
        ray.init()
    actors = [_worker_class(ray).remote(url, settings, key_file) for url in urls]  # the key's path, never the key
    if saved is not None:  # an earlier run's decision: used if it is about this model and these options
        text = saved.read_text(encoding="utf-8")
        if ray.get(actors[0].applies.remote(text)):
            ray.get([actor.use_decision.remote(text) for actor in actors])
            log.info("batch: the content check's decision saved by an earlier run is used (%s)", saved)
            deciding = False
        else:
            log.warning("batch: %s is not a decision about this model and these options (another model's, other "
                        "options, or unreadable): decided afresh, and replaced", saved)
    lists = int(settings.get("check_lists", CAP))
    first = rows[:lists] if deciding and len(actors) > 1 else []  # to one worker, until it has decided
    rest = rows[len(first):]
    try:
        with open(output, "a", encoding="utf-8") as out, tqdm(total=total, initial=skipped, unit="list",
                                                               desc="capcal batch", disable=not progress) as bar:
            def written(row: dict[str, Any], ranking: Ranking) -> None:
                out.write(json.dumps(record(row, ranking, top_n), ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
                bar.update()

            if first:
                _drain(ray, actors[:1], [list(first)], at_once, written)
                if (decision := _saved_decision(ray, actors[0], output)) is not None:
                    ray.get([actor.use_decision.remote(decision) for actor in actors[1:]])
                    log.info("batch: the content check decided on worker 0, handed to the others")
            _drain(ray, actors, [rest[k::len(actors)] for k in range(len(actors))], at_once, written)  # by query
            if deciding and not first:  # one worker: its decision saved for resuming
                _saved_decision(ray, actors[0], output)
    finally:
        for actor in actors:
            ray.kill(actor)


def _saved_decision(ray: Any, actor: Any, output: Path) -> str | None:
    """The content check's decision ``actor`` has taken (``None`` before it has), saved beside ``output``."""
    decision = ray.get(actor.decision.remote())
    if decision is not None:
        write_atomically(decision_path(output), decision + "\n")
        log.info("batch: the content check's decision saved in %s", decision_path(output))
    return decision


def _drain(ray: Any, actors: list[Any], shards: list[list[dict[str, Any]]], at_once: int,
           written: Callable[[dict[str, Any], Ranking], None]) -> None:
    """Rank every shard on its actor (the shards are consumed), ``at_once`` lists in flight each, writing each
    result as it comes; on any failure the lists in flight are cancelled and the error raised."""
    flying: dict[Any, tuple[int, dict[str, Any]]] = {}

    def submit(k: int) -> None:
        if shards[k]:
            row = shards[k].pop(0)
            flying[actors[k].rank.remote(row["query"], row["passages"])] = (k, row)

    try:
        for k in range(len(actors)):
            for _ in range(at_once):
                submit(k)
        while flying:
            [ref], _ = ray.wait(list(flying), num_returns=1)
            k, row = flying.pop(ref)
            try:
                ranking = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                raise (err.cause if isinstance(err.cause, BaseException) else err) from None
            written(row, ranking)
            submit(k)
    finally:
        for ref in flying:
            ray.cancel(ref, force=True)


_WORKER = None


def _worker_class(ray: Any) -> Any:
    """The Ray actor class (made once, after ``ray`` is imported): one reranker, one endpoint,
    several lists at a time on one event loop. Workers are HTTP clients: they reserve no CPU."""
    global _WORKER
    if _WORKER is None:
        @ray.remote(num_cpus=0, max_concurrency=64)
        class Worker:
            def __init__(self, base_url: str, settings: dict[str, Any], key_file: str | None = None) -> None:
                self.reranker = CapCalReranker(base_url=base_url, api_key=read_key(key_file), **settings)

            async def rank(self, query: str, passages: Iterable[Any]) -> Ranking:
                return await self.reranker.arerank(query, list(passages))

            def decision(self) -> str | None:
                decided = self.reranker.content_decision()
                return None if decided is None else decided.to_json()

            def use_decision(self, decision: str) -> None:
                self.reranker = self.reranker.with_options(decision=decision)

            def applies(self, decision: str) -> bool:
                """Whether a saved decision is about this endpoint's model and these options."""
                try:
                    key = load_decision(decision).key
                except InputError:
                    return False
                caps = self.reranker.capabilities()
                return key == decision_key(caps.model, caps.weights, self.reranker.options)

        _WORKER = Worker
    return _WORKER
