"""Deciding from judged queries on the testbed (issue 33, item 1): how often ``CapCalReranker.decide`` says
"calibrate", for readers that gain from it and for models that do not, by the number of judged queries.

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
server's own noise seeded per cell and draw, ``--draws`` draws per list, each cell's seeds its own). A run draws
``n`` distinct queries from the pool, each with one of its draws, and applies the library's own rule
(``judged.LabelEvidence``: calibrate when the 95 % paired interval of the nDCG@10 gain over the given order is
above zero). The runs of a cell resample one pool, so the rates are those of the pool's queries and draws.
Writes ``benchmarks/results/judged.md`` and ``.json``::

    python benchmarks/judged.py --data ../shared/data/trec-dl19-passage ../shared/data/trec-dl20-passage
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

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations.content_check.judged import LabelEvidence, rank_judged  # noqa: E402
from capcal_integrations.testbed import judged_lists, simulated_endpoint  # noqa: E402

#: (name, slope s, how the model's grades are made: "relevance", "follower" or "taste")
CELLS = (("reader s = 1", 1.0, "relevance"), ("reader s = .5", 0.5, "relevance"), ("reader s = .25", 0.25, "relevance"),
         ("no content (s = 0)", 0.0, "relevance"), ("BM25 follower (s = .5)", 0.5, "follower"),
         ("taste SD .2", 0.2 / math.sqrt(1.25), "taste"))
SIZES = (5, 10, 20, 40)
GOALS = ("at 20 judged queries: calibrate in >= 90 % of runs for the s = .5 reader, <= 5 % for no content, the follower "
         "and the taste")


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


def runs(pool: list[list[tuple[float, float, float]]], n: int, count: int, seed: int) -> dict:
    """``count`` decisions, each on ``n`` distinct queries drawn from the pool with one draw each."""
    rng = random.Random(seed)
    calibrate, gains = 0, []
    for _ in range(count):
        picked = [rng.choice(pool[q]) for q in rng.sample(range(len(pool)), n)]
        evidence = LabelEvidence.of(*zip(*picked))
        calibrate += evidence.calibrate
        gains.append(evidence.gain)
    return {"n": n, "runs": count, "calibrate": calibrate, "rate": calibrate / count}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", default=["../shared/data/trec-dl19-passage", "../shared/data/trec-dl20-passage"])
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--draws", type=int, default=3, help="draws of the simulated server's noise per list and cell")
    ap.add_argument("--runs", type=int, default=2000, help="decisions per cell and number of judged queries")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lists", type=int, default=None, help="only the first N lists of the pool (a smoke run)")
    ap.add_argument("--out", default=str(HERE / "results" / "judged"))
    a = ap.parse_args()
    os.environ.setdefault("CAPCAL_DECISIONS_DIR", "off")
    start = time.time()
    lists = [x for d in a.data for x in judged_lists(d, top=a.top) if any(x[2]) and len(x[1]) >= 2][:a.lists]
    jobs = [(name, s, kind, draw, lists) for name, s, kind in CELLS for draw in range(a.draws)]
    with multiprocessing.get_context("spawn").Pool(a.workers) as pool:
        done = pool.map(pool_scores, jobs, chunksize=1)
    by_cell: dict[str, list[list]] = {name: [[] for _ in lists] for name, _, _ in CELLS}
    for d in done:
        for q, sc in enumerate(d["scores"]):
            by_cell[d["cell"]][q].append(sc)
    rows = []
    for name, s, kind in CELLS:
        pool_ = by_cell[name]
        flat = [x for q in pool_ for x in q]
        gain = math.fsum(c - g for c, g, _ in flat) / len(flat)
        plain = math.fsum(u - g for _, g, u in flat) / len(flat)
        rows.append({"cell": name, "s": s, "kind": kind, "gain": gain, "uncalibrated_gain": plain,
                     "given": math.fsum(g for _, g, _ in flat) / len(flat),
                     "sizes": [runs(pool_, n, a.runs, _seed(name, "runs", n)) for n in SIZES if n <= len(pool_)]})
    meta = {"command": "python benchmarks/judged.py " + " ".join(sys.argv[1:]), "lists": len(lists), "draws": a.draws,
            "runs": a.runs, "seconds": round(time.time() - start), "data": [pathlib.Path(d).name for d in a.data],
            "date": time.strftime("%Y-%m-%d")}
    out = pathlib.Path(a.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    sizes = [n for n in SIZES if n <= len(lists)]
    lines = ["# Deciding from judged queries on the testbed (issue 33)", "",
             f"`{meta['command']}` ({meta['seconds']} s, {meta['date']}). Pool: {len(lists)} top-{a.top} lists of "
             f"{', '.join(meta['data'])} with a graded passage, each ranked through the library by every cell's simulated "
             f"model ({a.draws} noise draws per list, seeds per cell); {a.runs} decisions per cell and size, each on "
             "that many distinct queries drawn from the pool (`CapCalReranker.decide`'s rule, `judged.LabelEvidence`: "
             "calibrate when the 95 % paired t interval of the nDCG@10 gain over the given order is above zero). "
             "Module docstring: what each cell simulates.", "", f"Goal: {GOALS}.", "",
             "| model | gain of calibrating (pool) | uncalibrated's gain | " + " | ".join(f"calibrate, {n} judged" for n in sizes)
             + " |", "|---|---:|---:|" + "---:|" * len(sizes)]
    for r in rows:
        rates = {x["n"]: x["rate"] for x in r["sizes"]}
        lines.append(f"| {r['cell']} | {r['gain']:+.4f} | {r['uncalibrated_gain']:+.4f} | "
                     + " | ".join(f"{100 * rates[n]:.1f} %" for n in sizes) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
