"""Does reranking beat the first stage? Every method on the shared collections, and on the testbed whose truth is known.

    python -m benchmarks.quality --smoke                       # 2 DL19 lists of 5 passages, and the testbed on 2 lists
    python -m benchmarks.quality collections                   # run or resume every phase (hours on 2 CPU cores)
    python -m benchmarks.quality collections --report          # the headline from the records, nothing ranked
    python -m benchmarks.quality testbed --draws 20 --s 0,0.5,1,2,4

``collections`` reranks the BM25 top-20 lists of the shared data (``../shared/data``) with every method side by side
on the embedded server (Qwen2.5-Coder-0.5B; the ``@1.5b`` phases the 1.5B), phase by phase in the order of
:data:`PHASES` (the most important first), one CPU thread by default (``--threads``). Every finished reranking is
appended at once to ``results/quality/records/<dataset>[@model]/records.jsonl``, keyed by (kind, method, query,
variant): kill it at any time (SIGTERM unwinds and stops its server), run it again, and it continues. Each phase is
one ``capcal eval`` run (the same runner and records). The headline: nDCG@10 (trec_eval's) of BM25, vanilla and
CapCal on the queries every one finished, with paired differences against vanilla.

``testbed`` ranks the 43 DL19 lists through the simulated llama.cpp server of :mod:`capcal_integrations.testbed`,
whose content signal ``s`` (logits per relevance grade) and slot bias (``--scenarios``) are known, ``--draws``
simulated models per cell: what the library's rules do where the truth is known, not what a real model does.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import _common as C

log = logging.getLogger("benchmarks.quality")
RECORDS = C.RESULTS / "quality" / "records"
TOP = 20

#: Method specs (``capcal eval --methods``). The runs made before the content check existed say ``guard=none``.
CORE = ("bm25,first-token,first-token:capcal,guard=none,vanilla,capcal:guard=none,capcal:alpha=1.0,guard=none,"
        "capcal:probability=trie,guard=none,vanilla:probability=trie")
FIRST_TOKEN = "bm25,first-token,first-token:capcal,guard=none"
#: The listwise methods in the per-node form (on the 40 DL19 rank runs it gave vanilla's exact rankings, 5x faster).
LISTWISE_BIAS = "vanilla:probability=trie,capcal:probability=trie,guard=none,capcal:alpha=1.0,probability=trie,guard=none"
VARIANTS = ("capcal:alpha=1.0,probability=trie,guard=none,capcal:calibration=log,alpha=1.0,probability=trie,guard=none,"
            "capcal:placeholder=,alpha=1.0,probability=trie,guard=none,capcal:alpha=0.5,probability=trie,guard=none,"
            "capcal:alpha=2.0,probability=trie,guard=none,first-token:capcal,placeholder=,guard=none,"
            "vanilla:template=rank_gpt,probability=trie,capcal:template=rank_gpt,alpha=1.0,probability=trie,guard=none")
RELEASE = "vanilla:preset=release,capcal:preset=release,alpha=1.0,capcal:preset=release"
GUARDED = ("capcal,first-token:capcal,first-token:capcal,normalise=false,guard=none,"
           "first-token:capcal,alpha=1.0,normalise=false,guard=none,first-token:capcal,alpha=1.0,guard=none")
RAW = "capcal:normalise=false,guard=none,capcal:alpha=1.0,normalise=false,guard=none"
TEMPLATES = ("vanilla:template=capcal,capcal:template=capcal,alpha=1.0,guard=none,"
             "vanilla:template=no_example,capcal:template=no_example,alpha=1.0,guard=none")


@dataclass(frozen=True)
class Phase:
    name: str
    dataset: str
    kind: str  # rank | shuffle | needle
    methods: str
    queries: int | None = None  # the first N queries
    shuffles: int = 5
    positions: tuple[int, ...] | None = None
    model: str = "0.5b"

    @property
    def store(self) -> str:
        return self.dataset if self.model == "0.5b" else f"{self.dataset}@{self.model}"


DL19, DL20, SCIFACT = "trec-dl19-passage", "trec-dl20-passage", "beir-scifact-test"
PHASES = (
    Phase("dl19-core", DL19, "rank", CORE), Phase("dl19-release", DL19, "rank", RELEASE),
    Phase("dl19-guard", DL19, "rank", GUARDED),
    Phase("dl19-1.5b-guard", DL19, "rank", "capcal:probability=trie,first-token:capcal", queries=10, model="1.5b"),
    Phase("dl19-raw", DL19, "rank", RAW, queries=12), Phase("dl19-templates", DL19, "rank", TEMPLATES, queries=12),
    Phase("dl19-1.5b-guard-more", DL19, "rank", "capcal:probability=trie,first-token:capcal", queries=20, model="1.5b"),
    Phase("dl19-raw-more", DL19, "rank", RAW, queries=22), Phase("dl19-templates-more", DL19, "rank", TEMPLATES, queries=22),
    Phase("dl19-bias", DL19, "shuffle", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=6),
    Phase("dl19-needle", DL19, "needle", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=2, positions=(1, 4, 8, 12, 16, 20)),
    Phase("dl19-variants", DL19, "rank", VARIANTS, queries=8),
    Phase("dl19-1.5b-core", DL19, "rank", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=8, model="1.5b"),
    Phase("dl19-1.5b-bias", DL19, "shuffle", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=2, shuffles=4, model="1.5b"),
    Phase("dl19-needle-first-token", DL19, "needle", FIRST_TOKEN, queries=2),
    Phase("dl19-1.5b-core-more", DL19, "rank", f"{FIRST_TOKEN},{LISTWISE_BIAS}", queries=20, model="1.5b"),
    Phase("dl19-variants-rest", DL19, "rank", VARIANTS),
    Phase("dl19-bias-first-token", DL19, "shuffle", FIRST_TOKEN, queries=12),
    Phase("dl19-psc", DL19, "rank", "psc:m=5", queries=10), Phase("dl20-core", DL20, "rank", CORE),
    Phase("scifact-core", SCIFACT, "rank", CORE, queries=50), Phase("dl19-psc-rest", DL19, "rank", "psc:m=5"),
)
SMOKE = (Phase("smoke", DL19, "rank", "bm25,vanilla,capcal:guard=none", queries=2),)
#: Headline columns: the first spec of each that has rank records in a folder (the 1.5B ran the per-node form).
HEADLINE = {"vanilla": ("vanilla", "vanilla:probability=trie"),
            "CapCal (adaptive)": ("capcal:guard=None", "capcal:guard=None,probability=trie"),
            "CapCal alpha=1": ("capcal:alpha=1.0,guard=None", "capcal:alpha=1.0,guard=None,probability=trie")}


def groups_of(phase: Phase, data: pathlib.Path, top: int):
    from capcal_integrations.evaluation.data import load_dataset
    from capcal_integrations.evaluation.runner import needle_jobs, rank_jobs, shuffle_jobs
    from capcal_integrations.evaluation.specs import parse_specs

    dataset = load_dataset(data / phase.dataset)
    selected, specs = dataset.select(phase.queries), parse_specs(phase.methods)
    if phase.kind == "rank":
        return rank_jobs(selected.topics, specs, top)
    if phase.kind == "shuffle":
        return shuffle_jobs(selected.topics, specs, top, phase.shuffles)
    return needle_jobs(dataset, dataset.topics, specs, top, phase.queries or 1, phase.positions)


def run_phases(phases: tuple[Phase, ...], data: pathlib.Path, records: pathlib.Path, top: int, threads: int,
               port: int | None) -> None:
    """Each run of consecutive phases of one model on its own embedded server, restarted if it dies."""
    from capcal_integrations import CapCalReranker
    from capcal_integrations.errors import CapCalError
    from capcal_integrations.evaluation.runner import Runner
    from capcal_integrations.evaluation.store import Store
    from capcal_integrations.server import EmbeddedServer

    def pending(p: Phase) -> int:
        store = Store(records / p.store / "records.jsonl")
        return sum(j.key not in store for _, jobs in groups_of(p, data, top) for j in jobs)

    async def run(chosen: list[Phase], reranker: CapCalReranker) -> None:  # one event loop: the client's connections
        for p in (p for p in chosen if pending(p)):
            store = Store(records / p.store / "records.jsonl")
            done = await Runner(store, reranker, progress=sys.stderr.isatty()).run(groups_of(p, data, top), p.name)
            log.info("%s: %d done, %d cached, %d failed in %.0f s", p.name, done.done, done.cached, len(done.failed),
                     done.seconds)

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill PID unwinds, so the server is stopped too
    runs: list[list[Phase]] = []
    for p in phases:
        runs[-1].append(p) if runs and runs[-1][0].model == p.model else runs.append([p])
    for chosen in (r for r in runs if any(pending(p) for p in r)):
        for attempt in range(4):  # a dead server (OOM, crash) is restarted; finished work is kept
            try:
                with EmbeddedServer(model=chosen[0].model, port=port, threads=threads, startup_timeout=600) as server:
                    reranker = CapCalReranker(base_url=server.base_url, timeout=600)
                    reranker.capabilities()  # probed before any timing
                    asyncio.run(run(chosen, reranker))
                break
            except CapCalError as err:
                log.error("endpoint failed (%s); restarting the server in 10 s (attempt %d)", err, attempt + 1)
                time.sleep(10)


def headline(phases: tuple[Phase, ...], data: pathlib.Path, records: pathlib.Path) -> dict[str, Any]:
    """nDCG@10 per results folder on the queries every headline method finished, and the paired differences."""
    from capcal_integrations.evaluation import analysis as A
    from capcal_integrations.evaluation.data import load_dataset
    from capcal_integrations.evaluation.store import Store

    rows = []
    for name, dataset in dict.fromkeys((p.store, p.dataset) for p in phases):
        path = records / name / "records.jsonl"
        if not path.is_file():
            continue
        store = Store(path)
        keys = {c: next((k for k in o if any(True for _ in store.select("rank", k))), o[0]) for c, o in HEADLINE.items()}
        runs = {k: v for k in ("bm25", *keys.values()) if (v := list(store.select("rank", k)))}
        common = set.intersection(*({r["qid"] for r in v} for v in runs.values())) if runs else set()
        if "bm25" not in runs or keys["vanilla"] not in runs or not common:
            continue
        q = A.quality(load_dataset(data / dataset), {k: [r for r in v if r["qid"] in common] for k, v in runs.items()})
        tests = {c: q.test(k, keys["vanilla"]) for c, k in keys.items() if c != "vanilla" and k in runs}
        rows.append([name, "per-node (trie)" if "trie" in keys["vanilla"] else "joint", len(common),
                     f"{q.mean('bm25'):.4f}", *(f"{q.mean(k):.4f}" if k in runs else "–" for k in keys.values()),
                     *(f"{t.diff:+.4f} (p {t.t_p:.3f})" if (t := tests.get(c)) else "–" for c in keys if c != "vanilla")])
    others = [c for c in HEADLINE if c != "vanilla"]
    return {"columns": ["results", "label probability", "queries", "BM25", *HEADLINE, *(f"{c} - vanilla" for c in others)],
            "rows": rows}


def collections(args: Any, stamp: dict, out: pathlib.Path) -> dict[str, Any]:
    data = C.need_data()
    phases = SMOKE if args.smoke else tuple(p for p in PHASES if not args.phases or p.name in args.phases.split(","))
    records = pathlib.Path(tempfile.mkdtemp(prefix="records-", dir=out)) if args.smoke else RECORDS
    if not args.report:
        run_phases(phases, data, records, 5 if args.smoke else TOP, args.threads, args.port)
    notes = ["nDCG@10 is trec_eval's (the ideal ranking from all of a query's judgements); p: paired t-test. "
             f"Records: `{records.relative_to(C.ROOT) if records.is_relative_to(C.ROOT) else records}`."]
    if args.report and not args.smoke:
        notes.append("Computed from the committed records, nothing ranked: they were written by "
                     "`benchmarks/run_benchmark.py` (the same phases) on 2026-11-30 and 2026-12-01; the last commit "
                     "that changed them: " + ", ".join(
                         f"{p.name}: {_last_commit(p)}" for p in sorted(RECORDS.iterdir()) if p.is_dir()) + ".")
    return {"name": args.name or ("smoke" if args.smoke else "collections"), "stamp": stamp, "notes": notes,
            "title": f"BM25 top-{5 if args.smoke else TOP} reranked by each method, per collection and model",
            "tables": [headline(phases, data, records)]}


def _last_commit(folder: pathlib.Path) -> str:
    git = ["git", "-C", str(C.ROOT), "log", "-1", "--follow", "--format=%h %cs", "--", str(folder / "records.jsonl")]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip() or "not committed"


def testbed(args: Any, stamp: dict) -> dict[str, Any]:
    from capcal_integrations.testbed.measure import METHODS, bench_lists, measure

    lists = bench_lists(args.data or C.need_data("trec-dl19-passage"))[:2 if args.smoke else args.lists]
    scenarios = ["no-delta"] if args.smoke else args.scenarios.split(",")
    s_values = [0.0, 1.0] if args.smoke else [float(x) for x in args.s.split(",")]
    methods = {m: METHODS[m] for m in ("bm25,vanilla,capcal-1,default" if args.smoke else args.methods).split(",")}
    draws = 1 if args.smoke else args.draws
    rows = measure(lists, scenarios=scenarios, s_values=s_values, draws=draws, seed=args.seed, methods=methods,
                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    cells = list(dict.fromkeys((r.scenario, r.s) for r in rows))
    by = {(r.scenario, r.s, r.method): r for r in rows}
    table = [[sc, s, *(f"{by[sc, s, m].ndcg10:.4f}" + (f" (reads {by[sc, s, m].reads_share:.2f})"
                                                       if by[sc, s, m].reads_share is not None else "")
                       if (sc, s, m) in by else "–" for m in methods)] for sc, s in cells]
    return {"name": args.name or ("testbed-smoke" if args.smoke else "testbed"), "stamp": stamp,
            "title": f"The testbed: {len(lists)} DL19 lists x {draws} simulated models per scenario and s",
            "notes": ["A test instrument: nDCG@10 averaged over lists and draws on a simulated reranker whose content "
                      "slope `s` and slot bias (the scenario) are known; `reads`: the share of the default's decisions "
                      "that said the model reads. Methods: " + "; ".join(
                          f"`{m}` = {'the BM25 order' if o is None else o or 'the defaults'}" for m, o in methods.items())],
            "tables": [{"columns": ["scenario", "s", *methods], "rows": table}],
            "data": {"rows": [r.__dict__ for r in rows]}}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser("quality", __doc__)
    sub = ap.add_subparsers(dest="what")
    col = C.subcommand(sub, "collections", "every method on the shared collections (the default)")
    col.add_argument("--phases", help="comma-separated phase names (default: all, in order)")
    col.add_argument("--report", action="store_true", help="only the headline, from the records")
    col.add_argument("--threads", type=int, default=1, help="server CPU threads (default 1: steadier on a shared machine)")
    col.add_argument("--port", type=int, default=None)
    tb = C.subcommand(sub, "testbed", "the library's methods on the simulated reranker")
    tb.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    tb.add_argument("--s", default="0,0.5,1,2")
    tb.add_argument("--draws", type=int, default=20)
    tb.add_argument("--lists", type=int, default=None)
    tb.add_argument("--seed", type=int, default=0)
    tb.add_argument("--scenarios", default="no-delta,delta-0.5b,delta-1.5b,last-digit,ties")
    tb.add_argument("--methods", default="bm25,vanilla,capcal-adaptive,capcal-1,capcal-chosen,default")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    stamp, out = C.stamp("quality", argv), C.out_dir("quality", args)
    out.mkdir(parents=True, exist_ok=True)
    if args.what in (None, "testbed"):  # --smoke alone runs both, the testbed first (no server)
        if args.what is None:
            args = tb.parse_args([], namespace=args)
        if args.smoke or args.what == "testbed":
            print(f"wrote {C.save('quality', testbed(args, stamp), out)}")
    if args.what in (None, "collections"):
        if args.what is None:
            args = col.parse_args([], namespace=args)
        print(f"wrote {C.save('quality', collections(args, stamp, out), out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
