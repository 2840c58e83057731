"""The content check's decisions on the testbed: how often it says "reads" without content, and how fast with it.

Each decision is the library's own sequential test (``capcal_integrations.contrast``: four first-step
readings per query, the agreement score, the two e-processes, the cap) run over queries drawn at random
from a real collection's BM25 lists (relevance grades from its qrels), each query read by the testbed's
model (``capcal_integrations.testbed.model``, the same formula the simulated endpoint serves) with fresh
noise. Shapes of traffic:

* ``fixed``: every query's top 20;
* ``mixed``: each query cut to a length drawn from 3..30 (lists shorter than 4 are not read: they neither
  decide nor count);
* ``windows``: lists of 50-100 candidates ranked by sliding windows; the check reads each query's top window
  once (the first 20), never its other windows.

Null scenarios (``s = 0``: no content) give the false-"reads" rate with its exact 95 % upper bound
(Clopper-Pearson); ``s > 0`` gives the share of decisions that say "reads" within 12 and 24 queries. One
command writes ``benchmarks/results/decisions.md`` and ``.json``::

    python benchmarks/decisions.py --data ../shared/data/trec-dl19-passage --draws 2000

The real packaged models' readings are analysed by ``benchmarks/testbed.py --real`` (their decisions).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import pathlib
import random
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations.contrast import ALIGN_E, CAP, MIN_PASSAGES, Evidence, Reading, reading_orders, summary  # noqa: E402
from capcal_integrations.testbed.model import SCENARIOS  # noqa: E402

NULL_SCENARIOS = ("no-delta", "ties", "heavy-tails", "noise-scale-0.5", "noise-scale-1", "scale-1.5b", "shared-slots",
                  "delta-0.5b", "delta-1.5b", "last-digit")
SHAPES = ("fixed", "mixed", "windows")
#: Readers of their own: content read consistently that follows neither relevance nor the first stage (what the
#: packaged 0.5B and 1.5B do on DL19); "reads" is a wrong call for them too.
OWN = "own-preferences"
#: A first-stage follower: content read consistently that is a noisy copy of the first stage's order and carries
#: no relevance information beyond it. The passage at first-stage rank ``i`` of the ``n`` read has the preference
#: ``-beta * i / n + N(0, sigma)``, read at slope ``s`` (``benchmarks/tradeoff.py`` sets ``beta`` and ``sigma`` so
#: that at s = .5 its per-query agreement and alignment means match a relevance reader's at s = .5).
FOLLOWER = "first-stage-follower"
#: The follower's ``(beta, sigma)`` unless given (what ``benchmarks/tradeoff.py`` calibrated on DL19's top 20).
FOLLOWER_SHAPE = (0.574, 0.635)


def load_grades(data: str) -> list[list[int]]:
    """Per query, the grades of its BM25 candidates in first-stage order."""
    import gzip

    root = pathlib.Path(data)
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels.txt").read_text().splitlines():
        qid, _, doc, grade = line.split()
        qrels.setdefault(qid, {})[doc] = int(grade)
    with gzip.open(root / "candidates.jsonl.gz", "rt", encoding="utf-8") as f:
        topics = [json.loads(line) for line in f]
    return [[qrels.get(t["qid"], {}).get(c["docid"], 0) for c in t["candidates"]] for t in topics]


def list_of(shape: str, grades: list[int], rng: random.Random) -> list[int]:
    """The passages the check reads for one query of this shape (their grades, in first-stage order)."""
    if shape == "mixed":
        return grades[:rng.randint(3, 30)]
    if shape == "windows":
        return grades[:rng.randint(50, 100)][:20]  # the top window of a 50-100 candidate list
    return grades[:20]


def query_summaries(scenario: str, s: float, shape: str, seed: int, all_grades: list[list[int]],
                    follower: tuple[float, float] = FOLLOWER_SHAPE):
    """The ``summary()`` of each query the check reads, in the order a decision draws them (endless)."""
    own = scenario == OWN  # content of the model's own: a random preference per passage, not the grades
    follows = scenario == FOLLOWER  # a noisy copy of the first stage's order (FOLLOWER)
    model = SCENARIOS["no-delta" if own or follows else scenario].replace(s=s, seed=seed)
    rng = random.Random(seed)
    k = 0
    while True:
        g = list_of(shape, all_grades[rng.randrange(len(all_grades))], rng)
        if own:
            g = [rng.gauss(1.0, 1.0) for _ in g]
        elif follows:
            beta, sigma = follower
            g = [-beta * i / len(g) + rng.gauss(0.0, sigma) for i in range(len(g))]
        k += 1
        n = len(g)
        if n < MIN_PASSAGES:
            continue
        keys = [f"p{k}-{i}" for i in range(n)]
        slots = tuple(tuple(model.logits([g[i] for i in order], f"q{k} r{r}", [keys[i] for i in order], list_key=f"q{k}"))
                      for r, order in enumerate(reading_orders(n)))
        yield summary(Reading(slots))


def one_decision(args: tuple) -> tuple[str, int]:
    """One decision: ``args`` is ``(scenario, s, shape, seed, all_grades)``, optionally followed by ``align_e`` (the
    alignment e-value "reads" needs; default :data:`ALIGN_E`) and the follower's ``(beta, sigma)`` (:data:`FOLLOWER`)."""
    scenario, s, shape, seed, all_grades, *rest = args
    align_e = rest[0] if len(rest) > 0 and rest[0] is not None else ALIGN_E
    follower = rest[1] if len(rest) > 1 and rest[1] is not None else FOLLOWER_SHAPE
    evidence = Evidence(cap=CAP, align_e=align_e)
    for facts in query_summaries(scenario, s, shape, seed, all_grades, follower):
        if evidence.add(*facts) is not None:
            break
    return evidence.verdict, evidence.queries


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The exact (Clopper-Pearson) one-sided upper bound of a binomial rate with ``k`` of ``n``."""
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        cdf = math.fsum(math.comb(n, i) * mid ** i * (1 - mid) ** (n - i) for i in range(k + 1))
        lo, hi = (mid, hi) if cdf > 1 - confidence else (lo, mid)
    return hi


def cell(pool, scenario: str, s: float, shape: str, draws: int, grades: list[list[int]], seed: int) -> dict:
    start = time.perf_counter()
    runs = pool.map(one_decision, [(scenario, s, shape, seed * 100_003 + d, grades) for d in range(draws)], chunksize=8)
    verdicts = [v for v, _ in runs]
    reads = [q for v, q in runs if v == "reads"]
    out = {"scenario": scenario, "s": s, "shape": shape, "draws": draws, "reads": len(reads),
           "does_not_read": verdicts.count("does not read"), "undecided": verdicts.count("undecided"),
           "reads_within_12": sum(q <= 12 for q in reads) / draws, "reads_within_24": sum(q <= 24 for q in reads) / draws,
           "median_queries": sorted(q for _, q in runs)[draws // 2], "seconds": round(time.perf_counter() - start, 1)}
    out["reads_rate"] = len(reads) / draws
    out["reads_upper_95"] = upper_bound(len(reads), draws)
    print(json.dumps(out), flush=True)
    return out


def report(rows: list[dict], meta: dict) -> str:
    nulls = [r for r in rows if r["s"] == 0 and r["scenario"] != OWN]
    power = [r for r in rows if r["s"] > 0 and r["scenario"] != OWN]
    own = [r for r in rows if r["scenario"] == OWN]
    lines = ["# The content check's decisions on the testbed", "",
             f"`{meta['command']}` ({meta['seconds']:.0f} s, {meta['when']}). Data: {meta['data']} "
             f"({meta['queries']} queries, grades from its qrels). Each decision runs the library's sequential test "
             f"(`capcal_integrations/contrast.py`) over queries drawn at random, until it decides or reaches {CAP} queries.", "",
             "## Without content (s = 0): false \"reads\"", "",
             "Goal: at most 1 %, with the exact 95 % upper bound at most 1.5 %.", "",
             "| scenario | shape | decisions | reads | rate | 95 % upper | does not read | undecided (cap) | median queries |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in nulls:
        ok = r["reads_rate"] <= 0.01 and r["reads_upper_95"] <= 0.015
        lines.append(f"| {r['scenario']} | {r['shape']} | {r['draws']} | {r['reads']} | {100 * r['reads_rate']:.2f} % | "
                     f"{100 * r['reads_upper_95']:.2f} %{'' if ok else ' ✗'} | {r['does_not_read']} | {r['undecided']} | "
                     f"{r['median_queries']} |")
    lines += ["", "## With content: \"reads\" within 12 and 24 queries", "",
              "Goal: within 24 queries in at least 95 % of runs at s = 0.5, within 12 at s = 1.", "",
              "| scenario | shape | s | decisions | reads within 12 | reads within 24 | reads at all | median queries |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in power:
        goal = r["reads_within_12"] if r["s"] >= 1 else r["reads_within_24"] if r["s"] >= 0.5 else 1.0
        mark = "" if goal >= 0.95 else " ✗"
        lines.append(f"| {r['scenario']} | {r['shape']} | {r['s']:g} | {r['draws']} | {100 * r['reads_within_12']:.1f} % | "
                     f"{100 * r['reads_within_24']:.1f} % | {100 * r['reads'] / r['draws']:.1f} %{mark} | "
                     f"{r['median_queries']} |")
    if own:
        lines += ["", "## Readers of their own: \"reads\" is wrong for them too", "",
                  "Content read consistently (a preference per passage drawn at random, slope `s`) that follows neither "
                  "relevance nor the first stage, as the packaged models read DL19. The alignment evidence that \"reads\" "
                  f"needs reaches {ALIGN_E:g} with probability at most 1/{ALIGN_E:g} for them (Ville's inequality).", "",
                  "| s | shape | decisions | reads | rate | 95 % upper | does not read | undecided (cap) |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['s']:g} | {r['shape']} | {r['draws']} | {r['reads']} | {100 * r['reads_rate']:.1f} % | "
                  f"{100 * r['reads_upper_95']:.1f} % | {r['does_not_read']} | {r['undecided']} |" for r in own]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--draws", type=int, default=2000, help="decisions per null cell")
    ap.add_argument("--power-draws", type=int, default=400, help="decisions per cell with content")
    ap.add_argument("--scenarios", default=",".join(NULL_SCENARIOS))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--s", default="0.3,0.5,1", help="content slopes of the power cells")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "decisions"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--all-shapes", action="store_true", help="every shape for every scenario (default: the mixed and "
                    "windows shapes on no-delta, the equal-noise scenario)")
    ap.add_argument("--no-own", action="store_true", help="skip the readers of their own")
    a = ap.parse_args()
    grades = load_grades(a.data)
    start = time.perf_counter()
    rows = []
    shapes = a.shapes.split(",")
    cells = [(sc, sh) for sc in a.scenarios.split(",") for sh in shapes if sh == "fixed" or sc == "no-delta" or a.all_shapes]
    with multiprocessing.Pool(a.workers) as pool:
        for scenario, shape in cells:
            rows.append(cell(pool, scenario, 0.0, shape, a.draws, grades, a.seed))
            for s in (float(x) for x in a.s.split(",") if x):
                rows.append(cell(pool, scenario, s, shape, a.power_draws, grades, a.seed))
        if not a.no_own:
            for s in (0.5, 1.0):
                rows.append(cell(pool, OWN, s, "fixed", a.power_draws, grades, a.seed))
    meta = {"command": "python benchmarks/decisions.py " + " ".join(sys.argv[1:]), "seconds": time.perf_counter() - start,
            "when": time.strftime("%Y-%m-%d"), "data": pathlib.Path(a.data).name, "queries": len(grades)}
    out = pathlib.Path(a.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(rows, meta))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
