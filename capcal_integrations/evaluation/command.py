"""``capcal eval``: rerank a benchmark with several methods; write run files, ``report.md`` and plots.

Example::

    capcal eval --data ../shared/data/trec-dl19-passage --top 20 \\
        --methods bm25,vanilla,capcal,capcal:alpha=1.0,first-token,first-token:capcal,psc:m=5 \\
        --out eval-out/dl19 --queries 20 --shuffles 5 --bias-queries 10 --needle-queries 2

Without ``--base-url`` the embedded llama.cpp server is started for the run (model ``--model``,
default ``0.5b``). Everything finished is kept in ``OUT/records.jsonl``; running the same command
again resumes where it stopped and regenerates the report. Records and meta.json name the model
(:mod:`.identity`): a run with another model refuses to resume into that folder (``--fresh`` sets its
records aside). meta.json and report.md record the command line with credentials hidden.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import pathlib
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import CapCalError, InputError
from ..redaction import RedactingFilter, redact_argv
from . import identity
from .data import Dataset, load_dataset
from .runner import Group, Runner, needle_jobs, rank_jobs, shuffle_jobs
from .specs import MethodSpec, parse_specs
from .store import Store

log = logging.getLogger(__name__)

__all__ = ["main", "build_parser", "run_groups", "bias_methods"]

DEFAULT_METHODS = "bm25,first-token,first-token:capcal,vanilla,capcal"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="capcal eval", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Rerank a benchmark with several methods; write run files, report.md and plots.",
        epilog="example:\n  " + __doc__.split("::\n\n")[1].split("\n\n")[0].strip() + "\n\n"
               "Finished rerankings are kept in OUT/records.jsonl: the same command again resumes.")
    ap.add_argument("--data", required=True, help="dataset directory (candidates.jsonl.gz + qrels.txt)")
    ap.add_argument("--out", required=True, help="output directory (records, run files, report.md, plots)")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help="comma-separated method specs, e.g. capcal:alpha=1.0,probability=trie "
                         f"(default {DEFAULT_METHODS})")
    ap.add_argument("--top", type=int, default=20, help="rerank the first-stage top-k (default 20)")
    ap.add_argument("--queries", type=int, default=None, help="only the first N queries (file order)")
    ap.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint; default: start the embedded server")
    ap.add_argument("--api-key", default=None,
                    help="key for --base-url (default $OPENAI_API_KEY); never sent to the embedded server")
    ap.add_argument("--model", default=None,
                    help="model name to ask the endpoint for; without --base-url, the embedded model to start "
                         "(0.5b, 1.5b or smollm2; default 0.5b)")
    ap.add_argument("--port", type=int, default=None, help="port of the embedded server (default: a free one)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of the embedded server")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per HTTP request (default 600: a cold 2k-token prompt on a busy CPU is slow)")
    bias = ap.add_argument_group("position bias")
    bias.add_argument("--shuffles", type=int, default=0, help="M random shuffles per bias query (default 0: skip)")
    bias.add_argument("--bias-queries", type=int, default=10, help="queries for the shuffle measures (default 10)")
    bias.add_argument("--bias-methods", default=None,
                      help="methods for the shuffle and needle tests (default: --methods without psc)")
    bias.add_argument("--needle-queries", type=int, default=0, help="queries for the needle test (default 0: skip)")
    bias.add_argument("--needle-positions", default=None, help="1-based positions, e.g. 1,5,10,15,20 (default: all)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from stored records; rerank nothing")
    ap.add_argument("--fresh", action="store_true",
                    help="start over in --out: its records.jsonl and meta.json are renamed *.<time>.old, not resumed")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    return ap


def bias_methods(specs: Sequence[MethodSpec], text: str | None) -> list[MethodSpec]:
    """The methods for shuffles and needles: ``text`` if given, else ``specs`` without the (m-times
    dearer) psc."""
    return parse_specs(text) if text else [s for s in specs if s.method != "psc"]


async def run_groups(runner: Runner, phases: Sequence[tuple[str, Sequence[Group]]]) -> list[tuple[str, Any]]:
    """Run phases in order; returns ``(name, RunSummary)`` pairs."""
    out = []
    for name, groups in phases:
        if groups:
            out.append((name, await runner.run(groups, name)))
    return out


def _phases(dataset: Dataset, specs: list[MethodSpec], biased: list[MethodSpec], a: argparse.Namespace,
            ) -> list[tuple[str, list[Group]]]:
    topics = dataset.topics
    positions = [int(p) for p in a.needle_positions.split(",")] if a.needle_positions else None
    return [
        (f"{dataset.name} rank", rank_jobs(topics, specs, a.top)),
        (f"{dataset.name} shuffles", shuffle_jobs(topics[: a.bias_queries], biased, a.top, a.shuffles)
         if a.shuffles >= 2 else []),
        (f"{dataset.name} needle", needle_jobs(dataset, topics, biased, a.top, a.needle_queries, positions)
         if a.needle_queries else []),
    ]


def _server_meta(caps: Any, url: str, embedded: str | None, weights: str | None) -> dict[str, Any]:
    import importlib.metadata as md

    meta = {"model_id": identity.model_id(embedded, caps.model, url), "model": caps.model, "weights": weights,
            "endpoint": identity.endpoint_host(url) if embedded is None else "embedded", "server": caps.server,
            "transport": caps.transport, "context": caps.context, "fingerprint": caps.weights}
    with contextlib.suppress(md.PackageNotFoundError):
        meta["xllamacpp"] = md.version("xllamacpp")
    return meta


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capcal eval``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="capcal: %(message)s")
        for handler in logging.getLogger().handlers:
            handler.addFilter(RedactingFilter())  # -v logs request lines, whose URLs may carry credentials
    try:
        specs = parse_specs(a.methods)
        biased = bias_methods(specs, a.bias_methods)
        dataset = load_dataset(a.data).select(a.queries)
    except (CapCalError, OSError, ValueError) as err:
        return _error(err, 2)
    embedded = identity.embedded_model(a.base_url, a.model)
    if a.api_key and embedded:
        return _error(InputError("--api-key is the key of --base-url's endpoint; the embedded server has its own"), 2)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.fresh and not a.report_only:
        for moved in identity.set_aside(out):
            log.warning("set aside %s", moved)
    store = Store(out / "records.jsonl")
    meta_path = out / "meta.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    uses_model = any(s.uses_model for s in [*specs, *biased])
    if uses_model and not a.report_only and (planned := identity.planned_model_id(a.base_url, a.model)):
        try:  # before a server starts: a refusal costs nothing
            identity.check_resume(out, store, meta, planned)
        except InputError as err:
            return _error(err, 2)
    meta.update(command="capcal eval " + " ".join(redact_argv(argv)),
                data=str(pathlib.Path(a.data).resolve()), top=a.top, methods=[s.label for s in specs],
                bias_methods=[s.label for s in biased], shuffles=a.shuffles, needle_queries=a.needle_queries)
    phases = _phases(dataset, specs, biased, a)
    status = 0
    if not a.report_only:
        needs_model = any(j.spec.uses_model and j.key not in store for _, groups in phases for _, jobs in groups
                          for j in jobs)
        try:
            if needs_model:
                from .. import CapCalReranker
                from ..server import endpoint

                with endpoint(a.base_url, a.model, port=a.port, threads=a.threads, reuse_default=False) as ep:
                    url, model = ep
                    # a local server's own key (never $OPENAI_API_KEY); for --base-url, --api-key or the default
                    key = ep.api_key or (a.api_key if embedded is None else None)
                    reranker = CapCalReranker(base_url=url, api_key=key, model=model, timeout=a.timeout)
                    caps = reranker.capabilities()  # probed before any timing starts
                    current = _server_meta(caps, url, embedded, identity.served_weights(reranker, caps.server, url))
                    try:  # refused before reranking anything: the folder stays as it was
                        identity.check_weights(embedded, current["weights"], url)
                        identity.check_resume(out, store, meta, current["model_id"])
                        identity.check_fingerprint(out, meta, current["fingerprint"])
                    except InputError as err:
                        return _error(err, 2)
                    meta.update(current)
                    runner = Runner(store, reranker, progress=not a.no_progress, model_id=current["model_id"])
                    summaries = asyncio.run(run_groups(runner, phases))
            else:
                summaries = asyncio.run(run_groups(Runner(store, None, progress=not a.no_progress), phases))
        except CapCalError as err:  # the report still shows what finished
            sys.stderr.write(f"capcal eval: error: {err}\n")
            status = 1
        else:
            status = 1 if any(s.failed for _, s in summaries) else 0
            meta["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta_path.write_text(json.dumps(meta, indent=2))
    from .report import write_report

    report = write_report(out, dataset, store, specs, biased, meta)
    sys.stderr.write(f"capcal eval: wrote {report}\n")
    return status


def _error(err: Exception, status: int) -> int:
    sys.stderr.write(f"capcal eval: error: {err}\n")
    return status
