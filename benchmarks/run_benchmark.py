"""The CapCal benchmark: vanilla vs CapCal vs PSC on the shared data with the embedded Qwen2.5-Coder-0.5B.

One command, resumable (every finished reranking is kept in ``benchmarks/results/<dataset>/records.jsonl``,
or ``<dataset>@<model>/`` for another embedded model than the 0.5B)::

    .venv/bin/python benchmarks/run_benchmark.py            # run what is missing, phase by phase
    .venv/bin/python benchmarks/run_benchmark.py --report-only   # only regenerate benchmarks/RESULTS.md

Phases run in the order of :data:`PHASES` (the most important first); ``benchmarks/RESULTS.md`` is
regenerated after each phase, from whatever is done so far.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import signal
import sys
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.errors import CapCalError  # noqa: E402
from capcal_integrations.evaluation.data import load_dataset  # noqa: E402
from capcal_integrations.evaluation.runner import Runner, needle_jobs, rank_jobs, shuffle_jobs  # noqa: E402
from capcal_integrations.evaluation.specs import parse_specs  # noqa: E402
from capcal_integrations.evaluation.store import Store  # noqa: E402

log = logging.getLogger("benchmark")

DATA = pathlib.Path("/work/shared/data") if pathlib.Path("/work/shared/data").is_dir() else ROOT.parent / "shared/data"
RESULTS = ROOT / "benchmarks" / "results"
TOP = 20

#: The specs of the runs made before the no-harm guard existed (``guard=none``: the default now guards).
CORE = ("bm25,first-token,first-token:capcal,guard=none,vanilla,capcal:guard=none,capcal:alpha=1.0,guard=none,"
        "capcal:probability=trie,guard=none,vanilla:probability=trie")
FIRST_TOKEN = "bm25,first-token,first-token:capcal,guard=none"
#: The bias runs use the per-node ("trie") form for the listwise methods: on the 40 DL19 rank runs
#: ``vanilla:probability=trie`` gave exactly ``vanilla``'s rankings at a fifth of the time.
LISTWISE_BIAS = ("vanilla:probability=trie,capcal:probability=trie,guard=none,"
                 "capcal:alpha=1.0,probability=trie,guard=none")
VARIANTS = ("capcal:alpha=1.0,probability=trie,guard=none,capcal:calibration=log,alpha=1.0,probability=trie,guard=none,"
            "capcal:placeholder=,alpha=1.0,probability=trie,guard=none,capcal:alpha=0.5,probability=trie,guard=none,"
            "capcal:alpha=2.0,probability=trie,guard=none,first-token:capcal,placeholder=,guard=none,"
            "vanilla:template=rank_gpt,probability=trie,"
            "capcal:template=rank_gpt,alpha=1.0,probability=trie,guard=none")
#: The CapCal authors' code, reproduced (issue 10): vanilla, the fixed rate 1.0 and the adaptive rule.
RELEASE = "vanilla:preset=release,capcal:preset=release,alpha=1.0,capcal:preset=release"
#: The guarded defaults, and the first step's calibration with raw and with renormalised probabilities
#: (one step each, on the prompts the guard has just read).
GUARDED = ("capcal,first-token:capcal,first-token:capcal,normalise=false,guard=none,"
           "first-token:capcal,alpha=1.0,normalise=false,guard=none,first-token:capcal,alpha=1.0,guard=none")
#: Raw joint probabilities (the release's) against the renormalised ones, in the exact engine.
RAW = "capcal:normalise=false,guard=none,capcal:alpha=1.0,normalise=false,guard=none"
#: The release's prompt through the chat template, and a prompt with no example ranking to copy.
TEMPLATES = ("vanilla:template=capcal,capcal:template=capcal,alpha=1.0,guard=none,"
             "vanilla:template=no_example,capcal:template=no_example,alpha=1.0,guard=none")


@dataclass(frozen=True)
class Phase:
    name: str
    dataset: str
    kind: str  # rank | shuffle | needle
    methods: str
    queries: int | None = None  # first N queries of the dataset
    shuffles: int = 5
    positions: tuple[int, ...] | None = None
    model: str = "0.5b"  # the embedded model (capcal_integrations.server.MODELS)

    @property
    def store(self) -> str:
        """The results folder: the dataset's name, with ``@model`` for models other than the 0.5B."""
        return self.dataset if self.model == "0.5b" else f"{self.dataset}@{self.model}"


DL19, DL20, SCIFACT = "trec-dl19-passage", "trec-dl20-passage", "beir-scifact-test"

#: In order of importance. A cold 2.2k-token prompt per shuffled or needle list is the main cost, so
#: every method runs on a list back to back (one prefill), and the listwise methods get fewer lists;
#: a later phase adds lists for the (one-step) first-token methods only: finished jobs are skipped.
PHASES = (
    Phase("dl19-core", DL19, "rank", CORE),
    Phase("dl19-release", DL19, "rank", RELEASE),
    Phase("dl19-guard", DL19, "rank", GUARDED),
    Phase("dl19-1.5b-guard", DL19, "rank", "capcal:probability=trie,first-token:capcal", queries=10, model="1.5b"),
    Phase("dl19-raw", DL19, "rank", RAW, queries=12),
    Phase("dl19-templates", DL19, "rank", TEMPLATES, queries=12),
    Phase("dl19-1.5b-guard-more", DL19, "rank", "capcal:probability=trie,first-token:capcal", queries=20, model="1.5b"),
    Phase("dl19-raw-more", DL19, "rank", RAW, queries=22),
    Phase("dl19-templates-more", DL19, "rank", TEMPLATES, queries=22),
    Phase("dl19-bias", DL19, "shuffle", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=6),
    Phase("dl19-needle", DL19, "needle", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=2, positions=(1, 4, 8, 12, 16, 20)),
    Phase("dl19-variants", DL19, "rank", VARIANTS, queries=8),
    Phase("dl19-1.5b-core", DL19, "rank", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=8, model="1.5b"),
    Phase("dl19-1.5b-bias", DL19, "shuffle", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=2, shuffles=4, model="1.5b"),
    Phase("dl19-needle-first-token", DL19, "needle", FIRST_TOKEN, queries=2),
    Phase("dl19-1.5b-core-more", DL19, "rank", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=20, model="1.5b"),
    Phase("dl19-variants-rest", DL19, "rank", VARIANTS),
    Phase("dl19-bias-first-token", DL19, "shuffle", FIRST_TOKEN, queries=12),
    Phase("dl19-psc", DL19, "rank", "psc:m=5", queries=10),
    Phase("dl20-core", DL20, "rank", CORE),
    Phase("scifact-core", SCIFACT, "rank", CORE, queries=50),
    Phase("dl19-psc-rest", DL19, "rank", "psc:m=5"),
)


def groups_of(phase: Phase):
    dataset = load_dataset(DATA / phase.dataset)
    selected = dataset.select(phase.queries)
    specs = parse_specs(phase.methods)
    if phase.kind == "rank":
        return rank_jobs(selected.topics, specs, TOP)
    if phase.kind == "shuffle":
        return shuffle_jobs(selected.topics, specs, TOP, phase.shuffles)
    return needle_jobs(dataset, dataset.topics, specs, TOP, phase.queries or 1, phase.positions)


def pending(phase: Phase) -> int:
    store = Store(RESULTS / phase.store / "records.jsonl")
    return sum(1 for _, jobs in groups_of(phase) for j in jobs if j.key not in store)


def write_results() -> None:
    """Regenerate RESULTS.md (by benchmarks/results_report.py, re-imported so that edits apply)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        report = importlib.reload(importlib.import_module("results_report"))
        report.write_results_md(PHASES, DATA, RESULTS, ROOT / "benchmarks" / "RESULTS.md", TOP)
    except Exception:  # a report bug must never stop hours of reranking
        log.exception("could not regenerate RESULTS.md")


async def run_phases(phases: list[Phase], reranker: CapCalReranker, progress: bool) -> None:
    """All phases in one event loop (the async client's connections belong to it)."""
    for phase in phases:
        todo = pending(phase)
        if not todo:
            continue
        log.info("phase %s: %d rerankings to do", phase.name, todo)
        store = Store(RESULTS / phase.store / "records.jsonl")
        summary = await Runner(store, reranker, progress=progress).run(groups_of(phase), phase.name)
        log.info("%s: %d done, %d cached, %d failed in %.0f s", phase.name, summary.done, summary.cached,
                 len(summary.failed), summary.seconds)
        write_results()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8093, help="port of the benchmark's own server (default 8093)")
    ap.add_argument("--threads", type=int, default=1,
                    help="server CPU threads (default 1: on a shared 2-core machine one thread is steadier)")
    ap.add_argument("--phases", default=None, help="comma-separated phase names (default: all, in order)")
    ap.add_argument("--report-only", action="store_true", help="only regenerate benchmarks/RESULTS.md")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):  # one line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if a.report_only:
        write_results()
        return 0
    # SIGTERM (kill PID) unwinds like Ctrl-C, so the server started below is stopped too
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt, which no retry catches
    chosen = [p for p in PHASES if not a.phases or p.name in a.phases.split(",")]
    runs: list[list[Phase]] = []  # consecutive phases of one model share a server
    for phase in chosen:
        if runs and runs[-1][0].model == phase.model:
            runs[-1].append(phase)
        else:
            runs.append([phase])
    for run in runs:
        if any(pending(p) for p in run) and not _run_with_server(run, a):
            return 1
    write_results()
    return 0


def _run_with_server(phases: list[Phase], a: argparse.Namespace) -> bool:
    """Run ``phases`` (all of one model) against that model's embedded server; True when done."""
    from capcal_integrations.server import EmbeddedServer

    model = phases[0].model
    for attempt in range(4):  # a dead server (OOM, crash) is restarted; finished work is kept
        server = None
        try:  # always its own server: one found on the port might serve another model
            server = EmbeddedServer(model=model, port=a.port, threads=a.threads, startup_timeout=600).start()
            url = server.base_url
            log.info("server %s for %s (attempt %d)", url, model, attempt + 1)
            reranker = CapCalReranker(base_url=url, timeout=600)
            reranker.capabilities()  # probed before any timing
            asyncio.run(run_phases(phases, reranker, not a.no_progress))
            return True
        except CapCalError as err:
            log.error("endpoint failed (%s); restarting the server in 10 s", err)
            time.sleep(10)
        finally:
            if server is not None:
                server.stop()
    return False

if __name__ == "__main__":
    raise SystemExit(main())
