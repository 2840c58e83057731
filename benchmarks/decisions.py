"""Does the default decide right? The null suite and power on the testbed, judged queries, and real models.

    python -m benchmarks.decisions --smoke                     # nulls and judged on 2 lists: seconds, no server
    python -m benchmarks.decisions nulls --workers 2           # every cell at its goal's draws (about 40 min)
    python -m benchmarks.decisions judged --workers 2          # ranks the pool (an hour), then the tables
    python -m benchmarks.decisions judged --pool benchmarks/results/decisions/records/judged-pool.json
    python -m benchmarks.decisions real --model 1.5b --queries 20 --set probability=trie

``nulls``: the default rule (``guard="query"``) under the nulls real models produce, and its power (module
:mod:`benchmarks._nulls`). ``judged``: how often ``CapCalReranker.decide`` says "calibrate" from judged queries, for
simulated rerankers whose truth is known (:data:`CELLS`: readers of slope ``s`` per relevance grade; ``s = 0``; a
*BM25 follower* that reads a noisy copy of the first stage's order; a *taste* that ignores relevance), drawn from a
pool of every DL19 and DL20 top-20 list with a graded passage, each ranked through the library (calibrated, given,
uncalibrated; ``--draws`` noise draws a list, seeds per cell): one decision on ``n`` judged queries; a user who
re-runs ``decide()`` after each new judged query from 5 to 40 (at true mean gains 0 and -0.01: each cell's gains
re-centred, and two skewed shapes), beside the t interval the library used before; and the judged queries a reader
needs. ``real``: the label-free content check (``guard="content"``, ``check_wait=True``) on a real model's first
``--queries`` DL19 lists, every list read also after the decision so that the saved readings replay the decision in
``--orders`` random query orders (``--fixture``: tests/fixtures/real-readings.json from such results).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import pathlib
import random
import sys
import time
from typing import Any

from benchmarks import _common as C

RECORDS = C.RESULTS / "decisions" / "records"
#: (name, slope s, how the model's grades are made: "relevance", "follower" or "taste")
CELLS = (("reader s = 1", 1.0, "relevance"), ("reader s = .5", 0.5, "relevance"), ("reader s = .25", 0.25, "relevance"),
         ("no content (s = 0)", 0.0, "relevance"), ("BM25 follower (s = .5)", 0.5, "follower"),
         ("taste SD .2", 0.2 / math.sqrt(1.25), "taste"))
READERS = ("reader s = 1", "reader s = .5", "reader s = .25")
SIZES, RERUN, TARGETS = (5, 10, 20, 40), (5, 40), (0.0, -0.01)
SKEW = 0.098  # the skew -2.7 shape's loss probability
SHAPES = {"skewed: +.05 w.p. .75, -.15 otherwise (skew -1.15)": (0.75, 0.05),
          f"skewed: +g w.p. {1 - SKEW:.3f}, -.3 otherwise (skew -2.70)": (1 - SKEW, 0.3 * SKEW / (1 - SKEW))}


def _seed(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def model_grades(lists: list, kind: str, seed: int) -> list:
    """The grades the simulated model reads (``relevance``: the judgements themselves)."""
    if kind == "relevance":
        return lists
    rng, out = random.Random(seed), []
    for query, passages, _ in lists:
        n = len(passages)
        fake = ([min(3, max(0, round(3 * (1 - r / (n - 1)) + rng.gauss(0, 1)))) for r in range(n)] if kind == "follower"
                else [rng.randrange(4) for _ in range(n)])
        out.append((query, passages, fake))
    return out


def pool_scores(job: tuple) -> dict:
    """One cell's draw: every list ranked through the library (its nDCG@10 calibrated, given, uncalibrated)."""
    from capcal_integrations.content_check.judged import rank_judged
    from capcal_integrations.testbed import simulated_endpoint

    name, s, kind, draw, lists = job
    seed = _seed(name, draw)
    reranker = simulated_endpoint(model_grades(lists, kind, seed), s=s, scenario="no-delta", seed=seed).reranker()
    return {"cell": name, "draw": draw, "scores": [tuple(x[0] for x in rank_judged(reranker, [item])) for item in lists]}


def make_pool(data: list[str], top: int, lists: int | None, draws: int, workers: int) -> dict:
    """Every cell's lists ranked: ``{"cells": {name: per query, per draw, (calibrated, given, uncalibrated)}}``."""
    from capcal_integrations.testbed import judged_lists

    start = time.time()
    chosen = [x for d in data for x in judged_lists(d, top=top) if any(x[2]) and len(x[1]) >= 2][:lists]
    jobs = [(name, s, kind, draw, chosen) for name, s, kind in CELLS for draw in range(draws)]
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            done = pool.map(pool_scores, jobs, chunksize=1)
    else:
        done = [pool_scores(j) for j in jobs]
    cells: dict[str, list[list]] = {name: [[] for _ in chosen] for name, _, _ in CELLS}
    for d in sorted(done, key=lambda d: (d["cell"], d["draw"])):
        for q, sc in enumerate(d["scores"]):
            cells[d["cell"]][q].append(list(sc))
    return {"lists": len(chosen), "draws": draws, "seconds": round(time.time() - start),
            "data": [pathlib.Path(d).name for d in data], "cells": cells}


def fixed_n(pool: list[list], n: int, count: int, seed: int) -> dict:
    """``count`` decisions, each on ``n`` distinct queries drawn from the pool with one draw each."""
    from capcal_integrations.content_check.judged import LabelEvidence

    rng = random.Random(seed)
    calibrate = sum(LabelEvidence.of(*zip(*[rng.choice(pool[q]) for q in rng.sample(range(len(pool)), n)])).calibrate
                    for _ in range(count))
    return {"n": n, "runs": count, "calibrate": calibrate, "rate": calibrate / count}


def recentred(diffs: list[float], target: float) -> list[float]:
    """``diffs`` shifted and clipped to [-1, 1] so that their mean is ``target`` (the shift by bisection)."""
    lo, hi = -2.0, 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.fsum(min(1.0, max(-1.0, d + mid)) for d in diffs) / len(diffs) < target else (lo, mid)
    return [min(1.0, max(-1.0, d + (lo + hi) / 2)) for d in diffs]


def t_rule_crossing(diffs: list[float], quantiles: dict[int, float]) -> int:
    """The rule before the e-process, at every count from 5: the first count whose two-sided 95 % t interval's lower
    end is above 0 (0: none)."""
    total = square = 0.0
    for t, d in enumerate(diffs, 1):
        total, square = total + d, square + d * d
        if t >= RERUN[0]:
            mean = total / t
            if mean - quantiles[t - 1] * math.sqrt(max(0.0, (square - t * mean * mean) / (t - 1))) / math.sqrt(t) > 0:
                return t
    return 0


def rerun_row(name: str, draw: Any, target: float, runs: int, quantiles: dict[int, float]) -> dict:
    """``runs`` users who decide at every count from 5 to 40 and stop at the first "calibrate"."""
    from capcal_integrations.content_check import betting

    rng, ours, before = random.Random(_seed("rerun", name, target)), 0, 0
    for _ in range(runs):
        diffs = draw(rng)
        ours += betting.crossing(diffs) > 0
        before += t_rule_crossing(diffs, quantiles) > 0
    return {"pool": name, "target": target, "runs": runs, "calibrate": ours, "rate": ours / runs,
            "t_interval_calibrate": before, "t_interval_rate": before / runs}


def rerun_rows(cells: dict, runs: int) -> list[dict]:
    from scipy import stats  # the t interval's quantiles (the rule before), for the comparison only

    quantiles = {df: float(stats.t.ppf(0.975, df)) for df in range(1, RERUN[1])}
    rows = []
    for target in TARGETS:
        for name, _, _ in CELLS:
            flat, by_query = recentred([c - g for q in cells[name] for c, g, _ in q], target), []
            for q in cells[name]:
                by_query.append(flat[:len(q)])
                flat = flat[len(q):]
            rows.append(rerun_row(f"{name}, re-centred", lambda rng, b=by_query: [
                rng.choice(b[q]) for q in rng.sample(range(len(b)), RERUN[1])], target, runs, quantiles))
        for name, (p, up) in SHAPES.items():
            rows.append(rerun_row(name, lambda rng, p=p, up=up, t=target: [
                (up if rng.random() < p else -p * up / (1 - p)) + t for _ in range(RERUN[1])], target, runs, quantiles))
    return rows


def needed(per_query: list[list], runs: int, seed: int) -> dict:
    """The count at which the e-process crosses, over the whole pool in a random order (one draw a query)."""
    from capcal_integrations.content_check import betting

    rng, counts = random.Random(seed), []
    for _ in range(runs):
        order = rng.sample(range(len(per_query)), len(per_query))
        counts.append(betting.crossing([c - g for c, g, _ in (rng.choice(per_query[q]) for q in order)]) or math.inf)
    counts.sort()
    return {"runs": runs, "median": counts[len(counts) // 2], "p95": counts[math.ceil(0.95 * len(counts)) - 1],
            "by_30": sum(c <= 30 for c in counts) / runs, "by_20": sum(c <= 20 for c in counts) / runs,
            "never": sum(c == math.inf for c in counts) / runs}


def judged(args: argparse.Namespace, stamp: dict, out: pathlib.Path) -> dict:
    os.environ.setdefault("CAPCAL_DECISIONS_DIR", "off")
    if args.pool:
        pool = json.loads(pathlib.Path(args.pool).read_text())
    else:
        root = C.need_data()
        data = [str(root / d) for d in ("trec-dl19-passage", "trec-dl20-passage")]
        pool = make_pool(data, 5 if args.smoke else 20, 2 if args.smoke else None, 1 if args.smoke else args.draws,
                         args.workers)
        pool["commit"] = stamp["commit"]
        if not args.smoke:
            (RECORDS / "judged-pool.json").write_text(json.dumps(pool))
    runs = (20, 20, 20) if args.smoke else (args.runs, args.rerun_runs, args.needed_runs)
    cells = pool["cells"]
    rows = []
    for name, s, kind in CELLS:
        flat = [x for q in cells[name] for x in q]
        rows.append({"cell": name, "s": s, "kind": kind, "gain": math.fsum(c - g for c, g, _ in flat) / len(flat),
                     "uncalibrated_gain": math.fsum(u - g for _, g, u in flat) / len(flat),
                     "sizes": [fixed_n(cells[name], n, runs[0], _seed(name, "runs", n)) for n in SIZES
                               if n <= len(cells[name])]})
    rerun = rerun_rows(cells, runs[1]) if len(cells[CELLS[0][0]]) >= RERUN[1] else []
    need = {name: needed(cells[name], runs[2], _seed("needed", name)) for name in READERS}
    return judged_run(args.name or ("judged-smoke" if args.smoke else "judged"), stamp, pool, rows, rerun, need)


def judged_run(name: str, stamp: dict, pool: dict, rows: list, rerun: list, need: dict) -> dict:
    count = lambda c: "never" if c == math.inf else f"{c:g}"  # noqa: E731
    sizes = [x["n"] for x in rows[0]["sizes"]]
    gains = {r["cell"]: r["gain"] for r in rows}
    return {"name": name, "stamp": stamp, "title": "Deciding from judged queries on the testbed",
            "notes": [f"Pool: {pool['lists']} top-20 lists of {', '.join(pool['data'])} with a graded passage, each "
                      f"ranked through the library by every cell's simulated model ({pool['draws']} noise draws a list; "
                      f"{pool['seconds']} s{', at commit ' + pool['commit'] if pool.get('commit') else ''}). The rule "
                      "(`CapCalReranker.decide`): calibrate once the betting e-process on the per-query nDCG@10 gains "
                      "over the given order reaches 40. Goals: re-running decide() after each new judged query from 5 "
                      "to 40, at true gains 0 and -0.01, says \"calibrate\" in at most 2.5 % of runs in every row; "
                      "readers s = 1 and s = .5 calibrate by 30 judged queries in at least 95 % of runs."],
            "tables": [{"caption": "Re-running decide() after each new judged query (5, 6, ..., 40), stopping at the "
                                   "first \"calibrate\"; beside it the t interval's rule used the same way:",
                        "columns": ["differences", "true mean gain", "false \"calibrate\" (e-process)",
                                    "the t interval before"],
                        "rows": [[r["pool"], f"{r['target']:+.2f}", f"{100 * r['rate']:.2f} %",
                                  f"{100 * r['t_interval_rate']:.1f} %"] for r in rerun]},
                       {"caption": "Judged queries needed: the count at which the e-process crosses 40, over the whole "
                                   "pool in a random order:",
                        "columns": ["reader", "gain of calibrating (pool)", "median", "95th percentile",
                                    "calibrated by 20", "by 30"],
                        "rows": [[n, f"{gains[n]:+.4f}", count(x["median"]), count(x["p95"]), f"{100 * x['by_20']:.1f} %",
                                  f"{100 * x['by_30']:.1f} %"] for n, x in need.items()]},
                       {"caption": "One decision on n judged queries, drawn from the pool:",
                        "columns": ["model", "gain of calibrating (pool)", "uncalibrated's gain",
                                    *(f"calibrate, {n} judged" for n in sizes)],
                        "rows": [[r["cell"], f"{r['gain']:+.4f}", f"{r['uncalibrated_gain']:+.4f}",
                                  *(f"{100 * x['rate']:.1f} %" for x in r["sizes"])] for r in rows]}],
            "data": {"pool": {k: v for k, v in pool.items() if k != "cells"}, "rows": rows, "rerun": rerun,
                     "needed": need}}


def _reading(row: dict) -> Any:
    from capcal_integrations.content_check.contrast import Reading

    return Reading(tuple(tuple(s) for s in row["reading"]["slots"]), tuple(row["reading"]["empty"]) or None)


def replay(readings: list, orders: int, seed: int = 0) -> dict:
    """The decision in ``orders`` random query orders of the saved readings (the cap: all of them)."""
    from capcal_integrations.content_check.contrast import summary
    from capcal_integrations.content_check.evidence import CAP, Evidence

    rng, verdicts = random.Random(seed), {}
    for _ in range(orders):
        evidence = Evidence(cap=CAP)
        for r in rng.sample(readings, len(readings)):
            if evidence.add(*summary(r)) is not None:
                break
        verdict = evidence.verdict or f"undecided after all {len(readings)}"
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    return verdicts


def real(args: argparse.Namespace, stamp: dict) -> dict:
    """The content check in query order on a real model, every list read (for the replay)."""
    from capcal_integrations import CapCalReranker
    from capcal_integrations.content_check.contrast import agreement, alignment
    from capcal_integrations.evaluation.data import load_dataset
    from capcal_integrations.options import Options
    from capcal_integrations.ranking.decoding import check_readings
    from capcal_integrations.testbed.measure import ndcg10
    from capcal_integrations.transport.drivers import run_sync

    data = load_dataset(args.data or C.need_data("trec-dl19-passage"))
    top = 5 if args.smoke else 20
    options = dict(check_wait=True, guard="content", **{k: Options.parse(k, v) for k, v in (s.split("=", 1) for s in args.set)})
    start, rows = time.perf_counter(), []
    with C.server(args.base_url, args.model) as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, **options)
        for t in data.topics[:2 if args.smoke else args.queries]:
            texts = [c.text if not c.title else f"Title: {c.title} Content: {c.text}" for c in t.candidates[:top]]
            judged_ = data.grades().get(t.qid, {})
            g, ideal = [judged_.get(c.docid, 0) for c in t.candidates[:top]], sorted(judged_.values(), reverse=True)
            before, t0 = rr.content_decision(), time.perf_counter()
            ranking = rr.rerank(t.query, texts)
            check = next(iter(rr._state.content.values()))
            if before is None and ranking.checked:
                reading = check.readings[-1]
            else:  # decided already: read it all the same, for the replay
                reading, _ = run_sync(check_readings(rr._state.for_ranking(), rr.options.replace(alpha=1.0), t.query,
                                                     texts), rr.client)
            rows.append({"qid": t.qid, "query": t.query, "method": ranking.method, "order": list(ranking.order),
                         "ndcg10": ndcg10([g[i] for i in ranking.order], ideal), "bm25": ndcg10(g, ideal),
                         "seconds": round(time.perf_counter() - t0, 2), "score": agreement(reading),
                         "aligned": alignment(reading), "e_after": check.evidence.for_reads,
                         "reading": {"slots": [list(s) for s in reading.slots], "empty": list(reading.empty or ())}})
            print(f"{len(rows)} {ranking.method} e {check.evidence.for_reads:.3g}", file=sys.stderr, flush=True)
        decision, caps = rr.content_decision(), rr.capabilities()
    result = {"model": args.model, "served": caps.model, "weights": caps.weights, "options": args.set,
              "queries": len(rows), "decision_text": str(decision) if decision else "undecided after every query",
              "seconds": round(time.perf_counter() - start, 1), "rows": rows}
    return real_run(args.name or f"real-decision-{args.model}" + ("-smoke" if args.smoke else ""), stamp, result,
                    replay([_reading(r) for r in rows], args.orders))


def real_run(name: str, stamp: dict, result: dict, verdicts: dict) -> dict:
    rows, orders = result["rows"], sum(verdicts.values())
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    options = ", ".join(result["options"]) or "the defaults"
    replayed = ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items()))
    ndcg = "" if "check_drift" in result else f"nDCG@10 of the default: {mean('ndcg10'):.4f} (BM25 {mean('bm25'):.4f}). "
    return {"name": name, "stamp": stamp, "title": f"The content check on the real {result['model']} model",
            "notes": [f"{result['queries']} DL19 queries, BM25 top 20; options {options}; weights `{result['weights']}`; "
                      f"{result['seconds']:.0f} s. Decision in query order: {result['decision_text']}. {ndcg}Replayed in "
                      f"{orders} random query orders: {replayed} (\"reads\" in {100 * verdicts.get('reads', 0) / orders:.1f} "
                      "%)."],
            "tables": [{"columns": ["qid", "query", "score", "alignment", "e after", "method", "nDCG@10", "BM25"],
                        "rows": [[r["qid"], r["query"][:40], f"{r['score']:.2f}", f"{r.get('aligned', math.nan):+.2f}",
                                  f"{r['e_after']:.3g}", r["method"], f"{r['ndcg10']:.4f}", f"{r['bm25']:.4f}"]
                                 for r in rows]}], "data": {**result, "replay": verdicts}}


def fixture(paths: list[str]) -> None:
    """The real models' readings reduced to what the sequential test takes, for tests/test_content_check.py."""
    from capcal_integrations.content_check.contrast import summary

    out = {}
    for path in paths:
        run = next(r for r in C.load("decisions")["runs"] if r["name"] == path)["data"]
        out[run["model"]] = [[round(a, 6), round(b, 6), pairs] for a, b, pairs in (summary(_reading(r)) for r in run["rows"])]
    (C.ROOT / "tests" / "fixtures" / "real-readings.json").write_text(json.dumps(out) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = C.parser("decisions", __doc__)
    sub = ap.add_subparsers(dest="what")
    nulls = C.subcommand(sub, "nulls", "the default rule under the nulls real models produce, and its power")
    from benchmarks import _nulls

    _nulls.arguments(nulls)
    jd = C.subcommand(sub, "judged", "deciding from judged queries on the testbed")
    jd.add_argument("--pool", help="the ranked pool (judged-pool.json) instead of ranking it")
    jd.add_argument("--draws", type=int, default=3, help="draws of the simulated server's noise per list and cell")
    jd.add_argument("--runs", type=int, default=2000, help="decisions per cell and number of judged queries")
    jd.add_argument("--rerun-runs", type=int, default=10000, help="re-running users per row")
    jd.add_argument("--needed-runs", type=int, default=10000, help="orders of the pool per reader")
    jd.add_argument("--workers", type=int, default=2)
    rl = C.subcommand(sub, "real", "the content check on a real model, replayed in random query orders")
    rl.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    rl.add_argument("--base-url", help="an endpoint; default: the embedded --model, started here")
    rl.add_argument("--model", default="0.5b")
    rl.add_argument("--queries", type=int, default=20)
    rl.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE")
    rl.add_argument("--orders", type=int, default=500)
    rl.add_argument("--fixture", nargs="+", metavar="RUN", help="write tests/fixtures/real-readings.json from these "
                    "runs of the results file, and stop")
    args = ap.parse_args(argv)
    if getattr(args, "fixture", None):
        fixture(args.fixture)
        return 0
    stamp, out = C.stamp("decisions", argv), C.out_dir("decisions", args)
    parts = {"nulls": (nulls, lambda a: _nulls.run(a, stamp, lambda run: C.save("decisions", run, out))),
             "judged": (jd, lambda a: judged(a, stamp, out)),
             "real": (rl, lambda a: real(a, stamp))}
    for what in ([args.what] if args.what else ["nulls", "judged"]):  # --smoke alone: the parts without a server
        sub_args = parts[what][0].parse_args([], namespace=argparse.Namespace(**vars(args))) if not args.what else args
        print(f"wrote {C.save('decisions', parts[what][1](sub_args), out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
