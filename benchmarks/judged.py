"""Deciding from judged queries on the testbed (issue 33, item 1; issue 48, part 3): how often
``CapCalReranker.decide`` says "calibrate", for readers that gain from it and for models that do not, by the number
of judged queries; whether re-running it after every new judged query raises its error; how many judged queries
a reader of each strength needs.

Each cell is a simulated reranker (``capcal_integrations.testbed``) whose truth is known:

* ``reader s``: the logit of a passage grows by ``s`` per relevance grade (the 0.5B's fitted slot prior and noise);
* ``no content``: ``s = 0``, the slot prior and noise alone;
* ``BM25 follower``: reads consistently, but what it reads is a noisy copy of the first stage's order (a
  pseudo-grade ``clip(round(3 (1 - rank / (n - 1)) + N(0, 1)), 0, 3)`` per passage, at slope .5): calibrating it
  returns about the order it was given;
* ``taste SD .2``: a query-dependent preference that ignores relevance (a pseudo-grade drawn uniformly from 0-3 per
  query and passage, at slope .179: logit SD .2), which no label-free rule can tell from reading.

The pool: every top-20 list of the data folders given (DL19 and DL20 by default) with a passage graded above 0,
each ranked through the library (``judged.rank_judged``: calibrated, given order, uncalibrated; the simulated
server's own noise seeded per cell and draw, ``--draws`` draws per list, each cell's seeds its own), written to
``judged-pool.json`` beside the results (``--pool FILE`` reads such a file instead of ranking again). A run draws
distinct queries from the pool in a random order, each with one of its draws, and applies the library's own
test (``judged.LabelEvidence``, ``betting.crossing``: calibrate once the betting e-process on the nDCG@10 gains
reaches 40; a decision pooled over calls is that test on the pooled sequence, ``judged.pooled``).

* **fixed n**: one decision on ``n`` judged queries (5, 10, 20, 40), ``--runs`` runs a cell;
* **re-run after each new judged query** (issue 48): ``decide()`` at n = 5, 6, ..., 40, stopping at the first
  "calibrate", ``--rerun-runs`` runs a row, at true mean gains 0 and -0.01: each cell's per-query differences
  re-centred (shifted, then clipped to [-1, 1], the shift found by bisection so that the pool's mean is the target)
  and two skewed shapes (+.05 w.p. .75, a loss otherwise; +g w.p. .902, -.3 otherwise: skewness -2.70), each at
  the target mean; beside it the fixed-n t interval the library used before (two-sided 95 %, lower end > 0);
* **judged queries needed**: per reader, the count at which the e-process crosses over the whole pool in a random
  order (median, 95th percentile; "calibrate by 30 judged queries" is the share crossed by 30).

Writes ``benchmarks/results/judged.md`` and ``.json`` (with the command and the commit)::

    python benchmarks/judged.py --data ../shared/data/trec-dl19-passage ../shared/data/trec-dl20-passage
    python benchmarks/judged.py --pool benchmarks/results/judged-pool.json   # the tables again, from the pool
    python benchmarks/judged.py --draws 1 --lists 12 --runs 50 --rerun-runs 50 --out /tmp/judged   # a smoke run
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
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations.content_check import betting  # noqa: E402
from capcal_integrations.content_check.judged import LabelEvidence, pooled, rank_judged  # noqa: E402
from capcal_integrations.testbed import judged_lists, simulated_endpoint  # noqa: E402

#: (name, slope s, how the model's grades are made: "relevance", "follower" or "taste")
CELLS = (("reader s = 1", 1.0, "relevance"), ("reader s = .5", 0.5, "relevance"), ("reader s = .25", 0.25, "relevance"),
         ("no content (s = 0)", 0.0, "relevance"), ("BM25 follower (s = .5)", 0.5, "follower"),
         ("taste SD .2", 0.2 / math.sqrt(1.25), "taste"))
READERS = ("reader s = 1", "reader s = .5", "reader s = .25")
SIZES = (5, 10, 20, 40)
RERUN = (5, 40)  # decide() at every count from 5 to 40
TARGETS = (0.0, -0.01)
SKEW = 0.098  # the skew -2.7 shape's loss probability
SHAPES = {"skewed: +.05 w.p. .75, -.15 otherwise (skew -1.15)": (0.75, 0.05),
          f"skewed: +g w.p. {1 - SKEW:.3f}, -.3 otherwise (skew -2.70)": (1 - SKEW, 0.3 * SKEW / (1 - SKEW))}
GOALS = ("re-running decide() after each new judged query from 5 to 40, at true gains 0 and -0.01: false "
         "\"calibrate\" <= 2.5 % in every row; readers s = 1 and s = .5 calibrated by 30 judged queries in >= 95 % of runs")


def _seed(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def model_grades(lists: list, kind: str, seed: int) -> list:
    """The grades the simulated model reads (``relevance``: the judgements themselves)."""
    if kind == "relevance":
        return lists
    rng = random.Random(seed)
    out = []
    for query, passages, _ in lists:
        n = len(passages)
        if kind == "follower":
            fake = [min(3, max(0, round(3 * (1 - r / (n - 1)) + rng.gauss(0, 1)))) for r in range(n)]
        else:
            fake = [rng.randrange(4) for _ in range(n)]
        out.append((query, passages, fake))
    return out


def pool_scores(job: tuple) -> dict:
    """One cell's draw: every list ranked through the library (its nDCG@10 calibrated, given, uncalibrated)."""
    name, s, kind, draw, lists = job
    seed = _seed(name, draw)
    endpoint = simulated_endpoint(model_grades(lists, kind, seed), s=s, scenario="no-delta", seed=seed)
    reranker = endpoint.reranker()
    scores = [tuple(x[0] for x in rank_judged(reranker, [item])) for item in lists]
    return {"cell": name, "draw": draw, "scores": scores}


def make_pool(a: argparse.Namespace) -> dict:
    """Every cell's lists ranked (the slow part: minutes a cell and draw); ``{"cells": {name: per query, per draw,
    (calibrated, given, uncalibrated)}}`` with how it was made."""
    start = time.time()
    lists = [x for d in a.data for x in judged_lists(d, top=a.top) if any(x[2]) and len(x[1]) >= 2][:a.lists]
    jobs = [(name, s, kind, draw, lists) for name, s, kind in CELLS for draw in range(a.draws)]
    with multiprocessing.get_context("spawn").Pool(a.workers) as pool:
        done = pool.map(pool_scores, jobs, chunksize=1)
    return cells_of(done, len(lists), a.draws, round(time.time() - start), [pathlib.Path(d).name for d in a.data])


def cells_of(done: list[dict], lists: int, draws: int, seconds: int, data: list[str]) -> dict:
    cells: dict[str, list[list]] = {name: [[] for _ in range(lists)] for name, _, _ in CELLS}
    for d in sorted(done, key=lambda d: (d["cell"], d["draw"])):
        for q, sc in enumerate(d["scores"]):
            cells[d["cell"]][q].append(list(sc))
    return {"lists": lists, "draws": draws, "seconds": seconds, "data": data, "cells": cells}


def fixed_n(pool: list[list], n: int, count: int, seed: int) -> dict:
    """``count`` decisions, each on ``n`` distinct queries drawn from the pool with one draw each."""
    rng = random.Random(seed)
    calibrate = 0
    for _ in range(count):
        picked = [rng.choice(pool[q]) for q in rng.sample(range(len(pool)), n)]
        calibrate += LabelEvidence.of(*zip(*picked)).calibrate
    return {"n": n, "runs": count, "calibrate": calibrate, "rate": calibrate / count}


def recentred(diffs: list[float], target: float) -> list[float]:
    """``diffs`` shifted and clipped to [-1, 1] so that their mean is ``target`` (the shift by bisection)."""
    lo, hi = -2.0, 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        mean = math.fsum(min(1.0, max(-1.0, d + mid)) for d in diffs) / len(diffs)
        lo, hi = (mid, hi) if mean < target else (lo, mid)
    return [min(1.0, max(-1.0, d + (lo + hi) / 2)) for d in diffs]


def t_rule_crossing(diffs: list[float], quantiles: dict[int, float]) -> int:
    """The rule before issue 48 at every count from 5: the first count whose two-sided 95 % t interval's lower end
    is above 0 (0: none)."""
    total = square = 0.0
    for t, d in enumerate(diffs, 1):
        total, square = total + d, square + d * d
        if t >= RERUN[0]:
            mean = total / t
            sd = math.sqrt(max(0.0, (square - t * mean * mean) / (t - 1)))
            if mean - quantiles[t - 1] * sd / math.sqrt(t) > 0:
                return t
    return 0


def literal_rerun(diffs: list[float]) -> int:
    """The re-running user through the library's own pooling (``judged.pooled`` on decisions, as ``adopt`` does):
    the count of the first call that says "calibrate" (0: none). Slow; a check on the fast path."""
    from capcal_integrations.content_check.check import ContentDecision

    current, key = None, (("model", "sim"), ("weights", "w"))
    for n in range(RERUN[0], RERUN[1] + 1):
        new = diffs[len(current.judged_ids) if current else 0:n]
        scores = tuple((0.5 + d / 2, 0.5 - d / 2, 0.5) for d in new)  # calibrated - given = d
        ev = LabelEvidence.of(*zip(*scores))
        decision = ContentDecision(ev.calibrate, "", 1.0, 1.0, 0.0, len(new), 1.0, 1.0, (), key, judged=len(new),
                                   judged_ids=tuple(str(i) for i in range(n - len(new), n)), judged_scores=scores,
                                   crossed=ev.crossed)
        current = pooled(current, decision)
        if current.reads:
            return n
    return 0


def rerun_row(name: str, draw, target: float, runs: int, quantiles: dict[int, float], literal: int) -> dict:
    """``runs`` users who decide at every count from 5 to 40 and stop at the first "calibrate"."""
    rng = random.Random(_seed("rerun", name, target))
    ours = before = 0
    for r in range(runs):
        diffs = draw(rng)
        crossed = betting.crossing(diffs)
        ours += crossed > 0
        before += t_rule_crossing(diffs, quantiles) > 0
        if r < literal:
            assert literal_rerun(diffs) == crossed, (name, target, r)  # the pooled path says the same
    return {"pool": name, "target": target, "runs": runs, "calibrate": ours, "rate": ours / runs,
            "t_interval_calibrate": before, "t_interval_rate": before / runs}


def rerun_rows(cells: dict, runs: int, literal: int) -> list[dict]:
    from scipy import stats  # the t interval's quantiles (the rule before issue 48), for the comparison only

    quantiles = {df: float(stats.t.ppf(0.975, df)) for df in range(1, RERUN[1])}
    rows = []
    for target in TARGETS:
        for name, _, _ in CELLS:
            per_query = cells[name]
            flat = recentred([c - g for q in per_query for c, g, _ in q], target)
            starts = [0]
            for q in per_query:
                starts.append(starts[-1] + len(q))
            by_query = [flat[starts[i]:starts[i + 1]] for i in range(len(per_query))]

            def draw(rng: random.Random, by_query: list = by_query) -> list[float]:
                return [rng.choice(by_query[q]) for q in rng.sample(range(len(by_query)), RERUN[1])]

            rows.append(rerun_row(f"{name}, re-centred", draw, target, runs, quantiles, literal))
        for name, (p, up) in SHAPES.items():
            down = p * up / (1 - p)  # the loss that makes the mean 0

            def draw(rng: random.Random, p: float = p, up: float = up, down: float = down,
                     target: float = target) -> list[float]:
                return [(up if rng.random() < p else -down) + target for _ in range(RERUN[1])]

            rows.append(rerun_row(name, draw, target, runs, quantiles, literal))
    return rows


def needed(per_query: list[list], runs: int, seed: int) -> dict:
    """The count at which the e-process crosses, over the whole pool in a random order (one draw a query)."""
    rng = random.Random(seed)
    counts = []
    for _ in range(runs):
        order = rng.sample(range(len(per_query)), len(per_query))
        counts.append(betting.crossing([c - g for c, g, _ in (rng.choice(per_query[q]) for q in order)]) or math.inf)
    counts.sort()
    return {"runs": runs, "median": counts[len(counts) // 2], "p95": counts[math.ceil(0.95 * len(counts)) - 1],
            "by_30": sum(c <= 30 for c in counts) / runs, "by_20": sum(c <= 20 for c in counts) / runs,
            "never": sum(c == math.inf for c in counts) / runs}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip() + (" (uncommitted changes)" if subprocess.run(
                                  ["git", "status", "--porcelain", "--", "capcal_integrations", "benchmarks/judged.py"],
                                  cwd=HERE, capture_output=True, text=True).stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _count(c: float) -> str:
    return "never" if c == math.inf else f"{c:g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", default=["../shared/data/trec-dl19-passage", "../shared/data/trec-dl20-passage"])
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--draws", type=int, default=3, help="draws of the simulated server's noise per list and cell")
    ap.add_argument("--pool", default=None, help="read the ranked pool from this file (judged-pool.json) instead")
    ap.add_argument("--runs", type=int, default=2000, help="decisions per cell and number of judged queries")
    ap.add_argument("--rerun-runs", type=int, default=10000, help="re-running users per row")
    ap.add_argument("--needed-runs", type=int, default=10000, help="orders of the pool per reader (queries needed)")
    ap.add_argument("--literal", type=int, default=5, help="runs per re-run row also walked through judged.pooled")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lists", type=int, default=None, help="only the first N lists of the pool (a smoke run)")
    ap.add_argument("--out", default=str(HERE / "results" / "judged"))
    a = ap.parse_args()
    os.environ.setdefault("CAPCAL_DECISIONS_DIR", "off")
    start = time.time()
    out = pathlib.Path(a.out)
    if a.pool:
        pool = json.loads(pathlib.Path(a.pool).read_text())
    else:
        pool = make_pool(a)
        pool["commit"] = _commit()
        out.with_name(out.name + "-pool.json").write_text(json.dumps(pool))
    cells = pool["cells"]
    rows = []
    for name, s, kind in CELLS:
        per_query = cells[name]
        flat = [x for q in per_query for x in q]
        rows.append({"cell": name, "s": s, "kind": kind, "gain": math.fsum(c - g for c, g, _ in flat) / len(flat),
                     "uncalibrated_gain": math.fsum(u - g for _, g, u in flat) / len(flat),
                     "given": math.fsum(g for _, g, _ in flat) / len(flat),
                     "sizes": [fixed_n(per_query, n, a.runs, _seed(name, "runs", n)) for n in SIZES if n <= len(per_query)]})
    rerun = rerun_rows(cells, a.rerun_runs, a.literal) if len(cells[CELLS[0][0]]) >= RERUN[1] else []
    need = {name: needed(cells[name], a.needed_runs, _seed("needed", name)) for name in READERS}
    meta = {"command": "python benchmarks/judged.py " + " ".join(sys.argv[1:]), "commit": _commit(),
            "pool": {k: pool[k] for k in ("lists", "draws", "seconds", "data")} | {"commit": pool.get("commit", "")},
            "fractions": list(betting.FRACTIONS), "runs": a.runs, "rerun_runs": a.rerun_runs,
            "needed_runs": a.needed_runs, "seconds": round(time.time() - start), "date": time.strftime("%Y-%m-%d")}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows, "rerun": rerun, "needed": need},
                                                   indent=1))
    out.with_suffix(".md").write_text(report(meta, rows, rerun, need, a))
    print(out.with_suffix(".md").read_text())
    return 0


def report(meta: dict, rows: list, rerun: list, need: dict, a: argparse.Namespace) -> str:
    pool = meta["pool"]
    sizes = [x["n"] for x in rows[0]["sizes"]]
    lines = ["# Deciding from judged queries on the testbed (issues 33 and 48)", "",
             f"`{meta['command']}` at commit {meta['commit']} ({meta['seconds']} s, {meta['date']}). Pool: "
             f"{pool['lists']} top-{a.top} lists of {', '.join(pool['data'])} with a graded passage, each ranked "
             f"through the library by every cell's simulated model ({pool['draws']} noise draws per list, seeds per cell; "
             f"ranked in {pool['seconds']} s{', at commit ' + pool['commit'] if pool.get('commit') else ''}). The rule "
             "(`CapCalReranker.decide`, `judged.LabelEvidence`): calibrate once the betting e-process on the per-query "
             f"nDCG@10 gains over the given order reaches 40 (fractions {', '.join(map(str, meta['fractions']))}, "
             "equal shares; `content_check/betting.py`). Module docstring: what each cell simulates.", "",
             f"Goals: {GOALS}.", "", "## Re-running decide() after each new judged query (5, 6, ..., 40)", "",
             f"{meta['rerun_runs']} users a row, each deciding at every count from 5 to 40 over 40 distinct queries and "
             "stopping at the first \"calibrate\" (the decision pooled over the calls: the same test on the pooled "
             f"sequence; the first {a.literal} runs of each row walked through `judged.pooled` too, with the same "
             "outcome). Beside it, the rule before issue 48 (a two-sided 95 % t interval's lower end above 0) used the "
             "same way.", "",
             "| differences | true mean gain | false \"calibrate\" (e-process) | the t interval before |", "|---|---:|---:|---:|"]
    for r in rerun:
        lines.append(f"| {r['pool']} | {r['target']:+.2f} | {100 * r['rate']:.2f} % | {100 * r['t_interval_rate']:.1f} % |")
    lines += ["", "## Judged queries needed", "",
              f"Per reader, the count at which the e-process crosses 40, over the whole pool ({pool['lists']} queries) in "
              f"a random order, one draw a query ({a.needed_runs} orders).", "",
              "| reader | gain of calibrating (pool) | median | 95th percentile | calibrated by 20 | by 30 |",
              "|---|---:|---:|---:|---:|---:|"]
    gains = {r["cell"]: r["gain"] for r in rows}
    for name, x in need.items():
        lines.append(f"| {name} | {gains[name]:+.4f} | {_count(x['median'])} | {_count(x['p95'])} | "
                     f"{100 * x['by_20']:.1f} % | {100 * x['by_30']:.1f} % |")
    lines += ["", "## One decision on n judged queries", "",
              f"{meta['runs']} decisions per cell and size, each on that many distinct queries drawn from the pool.", "",
              "| model | gain of calibrating (pool) | uncalibrated's gain | "
              + " | ".join(f"calibrate, {n} judged" for n in sizes) + " |", "|---|---:|---:|" + "---:|" * len(sizes)]
    for r in rows:
        rates = {x["n"]: x["rate"] for x in r["sizes"]}
        lines.append(f"| {r['cell']} | {r['gain']:+.4f} | {r['uncalibrated_gain']:+.4f} | "
                     + " | ".join(f"{100 * rates[n]:.1f} %" for n in sizes) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
