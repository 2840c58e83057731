"""The content check's power against its false "reads" on the real 1.5B, as the alignment evidence it needs varies.

"reads" needs the agreement e-value at ``1 / LEVEL`` and the alignment e-value (``prod(1 + .95 * size * a)``) at
``align_e`` (``capcal_integrations.content_check.evidence.Evidence``; the library's default :data:`ALIGN_E`). For each ``align_e``
swept this measures, with the same random draws for every value (common random numbers):

* testbed power (``benchmarks/decisions.py``): "reads" within 12 queries at s = 1 and within 24 at s = .5;
* testbed false "reads": no content (s = 0), readers of their own (random preferences), and a first-stage
  follower (a consistent preference that is a noisy copy of the BM25 order, :data:`decisions.FOLLOWER`), whose
  ``(beta, sigma)`` are calibrated here so that its per-query agreement and alignment means match a relevance
  reader's at s = .5; with the nDCG@10 that perfect calibration of each (sorting by the true preference) gives;
* real models: the saved readings of the 0.5B and 1.5B (``benchmarks/results/real-decision-*.json``) replayed in
  random query orders.

Writes ``benchmarks/results/tradeoff.md`` and ``.json``::

    python benchmarks/tradeoff.py --workers 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import pathlib
import random
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from decisions import FOLLOWER, NULL_SCENARIOS, OWN, load_judged, one_decision, query_summaries, upper_bound  # noqa: E402
from real_decision import _reading  # noqa: E402

from capcal_integrations.content_check.contrast import summary  # noqa: E402
from capcal_integrations.content_check.evidence import ALIGN_E, CAP, LEVEL, Evidence  # noqa: E402
from capcal_integrations.testbed.measure import ndcg10  # noqa: E402

ALIGN_ES = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)
GOAL = 0.95  # (a): "reads" within 12 queries at s = 1 and within 24 at s = .5 in at least this share of runs
REAL_GOAL = 0.01  # (b): "reads" in at most this share of the real 1.5B's query orders
REAL = {"0.5b": HERE / "results" / "real-decision-0.5b.json", "1.5b": HERE / "results" / "real-decision-1.5b.json"}


def query_stats(scenario: str, s: float, grades: list[list[int]], follower: tuple[float, float] | None,
                queries: int, seed: int = 7) -> dict:
    """Mean and SD of per-query agreement and alignment (top 20, no-delta slots) over ``queries`` queries."""
    facts = []
    for k in range(math.ceil(queries / 20)):
        facts += itertools.islice(query_summaries(scenario, s, "fixed", seed * 1_000_003 + k, grades,
                                                  follower or (0.0, 0.0)), 20)
    return _moments(facts[:queries])


def _moments(facts: list[tuple[float, float, int]]) -> dict:
    agree, align = [f[0] for f in facts], [f[1] for f in facts]
    return {"queries": len(facts), "agreement_mean": statistics.fmean(agree), "agreement_sd": statistics.stdev(agree),
            "alignment_mean": statistics.fmean(align), "alignment_sd": statistics.stdev(align)}


def calibrate(grades: list[list[int]], target: dict, queries: int) -> tuple[float, float]:
    """The follower's ``(beta, sigma)`` whose agreement and alignment means match ``target`` at s = .5 (alternate
    bisections: sigma for the agreement, beta for the alignment; the same draws throughout)."""
    beta, sigma = 0.5, 0.6

    def solve(lo: float, hi: float, f, goal: float) -> float:  # f increasing
        for _ in range(12):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < goal else (lo, mid)
        return (lo + hi) / 2

    for _ in range(3):
        sigma = solve(0.05, 2.0, lambda x, b=beta: query_stats(FOLLOWER, 0.5, grades, (b, x), queries)["agreement_mean"],
                      target["agreement_mean"])
        beta = solve(0.0, 3.0, lambda x, w=sigma: query_stats(FOLLOWER, 0.5, grades, (x, w), queries)["alignment_mean"],
                     target["alignment_mean"])
    return round(beta, 3), round(sigma, 3)


def ndcg_table(grades: list[list[int]], ideals: list[list[int]], follower: tuple[float, float], draws: int,
               seed: int) -> dict:
    """Mean nDCG@10 over the lists' top 20: BM25's order, sorted by the grades (a relevance reader's true
    preference: what perfect calibration gives it) and sorted by the follower's true preference (mean of ``draws``)."""
    rng = random.Random(seed)
    beta, sigma = follower
    bm25, reader, follows = [], [], []
    for g, ideal in zip(grades, ideals):
        top = g[:20]
        n = len(top)
        bm25.append(ndcg10(top, ideal))
        reader.append(ndcg10(sorted(top, reverse=True), ideal))
        per = []
        for _ in range(draws):
            pref = [-beta * i / n + rng.gauss(0.0, sigma) for i in range(n)]
            per.append(ndcg10([top[i] for i in sorted(range(n), key=lambda i: -pref[i])], ideal))
        follows.append(statistics.fmean(per))
    return {"lists": len(grades), "bm25": statistics.fmean(bm25), "reader": statistics.fmean(reader),
            "follower": statistics.fmean(follows), "follower_draws": draws}


def replay(facts: list[tuple[float, float, int]], orders: int, align_e: float, seed: int = 0) -> dict:
    """``real_decision.replay`` with ``align_e``: the decision in ``orders`` random query orders (same orders)."""
    rng = random.Random(seed)
    verdicts: dict[str, int] = {}
    for _ in range(orders):
        evidence = Evidence(cap=CAP, align_e=align_e)
        for f in rng.sample(facts, len(facts)):
            if evidence.add(*f) is not None:
                break
        verdict = evidence.verdict or f"undecided after all {len(facts)}"
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    return verdicts


def idealised(moments: dict, align_es: list[float], draws: int, seed: int) -> dict:
    """Power with perfect agreement scores (1 every query) and alignments ``N(mean, sd)`` (clipped to [-1, 1]) of a
    full list: how much of the power the alignment evidence alone leaves, per ``align_e``."""
    out = {}
    for e in align_es:
        rng = random.Random(seed)
        within = {12: 0, 24: 0}
        for _ in range(draws):
            evidence = Evidence(cap=CAP, align_e=e)
            while evidence.add(1.0, rng.gauss(moments["alignment_mean"], moments["alignment_sd"])) is None:
                pass
            for k in within:
                within[k] += evidence.verdict == "reads" and evidence.queries <= k
        out[str(e)] = {"within_12": within[12] / draws, "within_24": within[24] / draws}
    fastest = Evidence(cap=CAP, align_e=0.0)
    while fastest.add(1.0) is None:
        pass
    out["agreement_alone_queries"] = fastest.queries  # "reads" at the earliest on agreement 1 every query
    return out


def cell(run, scenario: str, s: float, shape: str, draws: int, grades, seed: int, align_e: float,
         follower=None) -> dict:
    start = time.perf_counter()
    results = run([(scenario, s, shape, seed * 100_003 + d, grades, align_e, follower) for d in range(draws)])
    reads = [q for v, q in results if v == "reads"]
    out = {"scenario": scenario, "s": s, "shape": shape, "align_e": align_e, "draws": draws, "reads": len(reads),
           "reads_rate": len(reads) / draws, "reads_upper_95": upper_bound(len(reads), draws),
           "reads_within_12": sum(q <= 12 for q in reads) / draws, "reads_within_24": sum(q <= 24 for q in reads) / draws,
           "does_not_read": sum(v == "does not read" for v, _ in results),
           "undecided": sum(v == "undecided" for v, _ in results), "seconds": round(time.perf_counter() - start, 2)}
    print(json.dumps(out), flush=True)
    return out


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %"


def report(res: dict) -> str:
    meta, rows, es = res["meta"], res["rows"], res["align_es"]
    get = lambda **k: [r for r in rows if all(r[a] == b for a, b in k.items())]  # noqa: E731

    def name(e: float) -> str:
        return "0 (not required)" if e == 0 else f"{e:g}" + (" (default)" if e == ALIGN_E else "")

    power_cells = sorted({(r["scenario"], r["shape"]) for r in rows if r["kind"] == "power"},
                         key=lambda c: (c[1] != "fixed", c[1], c[0]))
    fixed = [c for c in power_cells if c[1] == "fixed"]

    def power_ok(e: float, cells) -> bool:
        return all(get(kind="power", scenario=sc, shape=sh, s=1.0, align_e=e)[0]["reads_within_12"] >= GOAL and
                   get(kind="power", scenario=sc, shape=sh, s=0.5, align_e=e)[0]["reads_within_24"] >= GOAL
                   for sc, sh in cells)

    def worst(e: float, s: float, key: str, cells) -> tuple[float, str]:
        r = min((get(kind="power", scenario=sc, shape=sh, s=s, align_e=e)[0] for sc, sh in cells), key=lambda r: r[key])
        return r[key], f"{r['scenario']}/{r['shape']}"

    real = res["real"]
    ok_a = {e: power_ok(e, fixed) for e in es}
    ok_a_all = {e: power_ok(e, power_cells) for e in es}
    ok_b = {e: real["1.5b"]["by_align_e"][str(e)]["reads_rate"] <= REAL_GOAL for e in es}
    f = res["follower"]
    lines = [
        f"`{meta['command']}` — {meta['seconds']:.0f} s wall time ({meta['when']}, workers {meta['workers']}).", "",
        "# The content check: power on the testbed against false \"reads\" on the real 1.5B, by `align_e`", "",
        f"Data: {meta['data']} ({meta['queries']} queries; grades from its qrels). Every decision is "
        f"`capcal_integrations.content_check.evidence.Evidence(cap={CAP}, align_e=...)`: \"reads\" needs the agreement "
        f"e-value at "
        f"{1 / LEVEL:g} and the alignment e-value at `align_e` (library default {ALIGN_E:g}; `align_e` = 0 drops the "
        "condition, 1 still needs the alignment e-value not to have fallen below 1). Testbed decisions: "
        "`benchmarks/decisions.py` `one_decision`, the same seeds for every `align_e`.", "",
        "**Goals.** (a) power: \"reads\" within 12 queries in at least 95 % of runs at s = 1 and within 24 at "
        "s = 0.5, in every testbed scenario; (b) on the packaged 1.5B's saved real readings, \"reads\" in at most "
        f"1 % of {meta['orders']} random query orders.", "",
        "## Summary", "",
        "| align_e | (a) worst within 12, s = 1 | (a) worst within 24, s = 0.5 | (a) met, fixed shape | (a) met, all shapes run "
        "| null false reads (max over null cells) | own-preferences reads (s = .5 / 1) | follower reads (s = .5) "
        "| real 0.5B reads | real 1.5B reads | (b) met |",
        "|---|---:|---:|:---:|:---:|---:|---:|---:|---:|---:|:---:|"]
    for e in es:
        w12, c12 = worst(e, 1.0, "reads_within_12", fixed)
        w24, c24 = worst(e, 0.5, "reads_within_24", fixed)
        null = max(get(kind="null", align_e=e), key=lambda r: r["reads_rate"])
        own = [get(kind="own", s=s, align_e=e)[0]["reads_rate"] for s in (0.5, 1.0)]
        fol = get(kind="follower", s=0.5, align_e=e)[0]["reads_rate"]
        lines.append(f"| {name(e)} | {pct(w12)} ({c12}) | {pct(w24)} ({c24}) | {'yes' if ok_a[e] else 'no'} | "
                     f"{'yes' if ok_a_all[e] else 'no'} | {pct(null['reads_rate'], 2)} | {pct(own[0])} / {pct(own[1])} | "
                     f"{pct(fol)} | {pct(real['0.5b']['by_align_e'][str(e)]['reads_rate'])} | "
                     f"{pct(real['1.5b']['by_align_e'][str(e)]['reads_rate'])} | {'yes' if ok_b[e] else 'no'} |")
    both = [name(e) for e in es if ok_a[e] and ok_b[e]]
    lines += ["", f"`align_e` meeting (a) on the fixed shape: {', '.join(name(e) for e in es if ok_a[e]) or 'none'}; "
              f"(a) on every shape run: {', '.join(name(e) for e in es if ok_a_all[e]) or 'none'}; "
              f"(b): {', '.join(name(e) for e in es if ok_b[e]) or 'none'}; both (a, fixed shape) and (b): "
              f"{', '.join(both) or 'none'}.", "",
              "## Per-query agreement and alignment", "",
              "Mean and SD over queries of `contrast.summary()`'s agreement and alignment (testbed: no-delta slots, top 20).", "",
              "| model | queries | agreement mean | agreement SD | alignment mean | alignment SD |",
              "|---|---:|---:|---:|---:|---:|"]
    for label, m in res["moments"].items():
        lines.append(f"| {label} | {m['queries']} | {m['agreement_mean']:.3f} | {m['agreement_sd']:.3f} | "
                     f"{m['alignment_mean']:+.3f} | {m['alignment_sd']:.3f} |")
    ideal, im = res["idealised"], res["idealised_moments"]
    lines += ["", f"**Alignment evidence alone** (agreement 1 every query, the agreement e-value at its fastest: "
              f"alone it reaches {1 / LEVEL:g} at query {ideal['agreement_alone_queries']}; alignment ~ "
              f"N({im['alignment_mean']:.3f}, {im['alignment_sd']:.3f}), the testbed reader's at "
              f"s = 1, clipped to [-1, 1]; full lists; {meta['ideal_draws']} runs): \"reads\" within 12 / 24 queries: " +
              "; ".join(f"align_e {e:g}: {pct(ideal[str(e)]['within_12'])} / {pct(ideal[str(e)]['within_24'])}"
                        for e in es) + "."]
    nd = res["ndcg"]
    lines += ["", "## The first-stage follower", "",
              f"Preference of the passage at first-stage rank i of n: `-beta * i / n + N(0, sigma)`, read at slope s = 0.5, "
              f"with beta = {f['beta']:g}, sigma = {f['sigma']:g} (calibrated on {f['calibration_queries']} queries so that "
              "its agreement and alignment means match the relevance reader's at s = 0.5: table above). It carries no "
              "relevance information beyond the BM25 order.", "",
              f"Mean nDCG@10 over the {nd['lists']} DL19 top-20 lists (trec_eval's: linear gains, ideal from all judgements), "
              "of the order perfect calibration would give (the passages sorted by the true preference):", "",
              "| order | mean nDCG@10 |", "|---|---:|",
              f"| BM25 | {nd['bm25']:.4f} |",
              f"| relevance reader, sorted by its preference (the grades; ties in BM25 order) | {nd['reader']:.4f} |",
              f"| first-stage follower, sorted by its preference (mean of {nd['follower_draws']} draws per list) | "
              f"{nd['follower']:.4f} |", "",
              "## Testbed cells", "",
              "Power: share of runs with \"reads\" within 12 (s = 1) or 24 (s = 0.5) queries, "
              f"{meta['power_draws']} runs per cell.", "",
              "Scenarios that differ only in fixed slot effects (no-delta, delta-0.5b, last-digit) give identical rows: "
              "such effects cancel exactly in the two content estimates, and the runs share their seeds.", "",
              "| scenario | shape | s | " + " | ".join(f"align_e {e:g}" for e in es) + " |",
              "|---|---|---:|" + "---:|" * len(es)]
    for sc, sh in power_cells:
        for s, key in ((1.0, "reads_within_12"), (0.5, "reads_within_24")):
            vals = [get(kind="power", scenario=sc, shape=sh, s=s, align_e=e)[0][key] for e in es]
            lines.append(f"| {sc} | {sh} | {s:g} | " + " | ".join(pct(v) + ("" if v >= GOAL else " ✗") for v in vals) + " |")
    lines += ["", "False \"reads\" (reads at all, up to the cap of 40 queries; exact 95 % upper bound in brackets):", "",
              "| scenario | shape | s | runs | " + " | ".join(f"align_e {e:g}" for e in es) + " |",
              "|---|---|---:|---:|" + "---:|" * len(es)]
    for kind in ("null", "own", "follower"):
        for sc, sh, s in sorted({(r["scenario"], r["shape"], r["s"]) for r in rows if r["kind"] == kind}):
            rs = [get(kind=kind, scenario=sc, shape=sh, s=s, align_e=e)[0] for e in es]
            lines.append(f"| {sc} | {sh} | {s:g} | {rs[0]['draws']} | " +
                         " | ".join(f"{pct(r['reads_rate'])} ({pct(r['reads_upper_95'])})" for r in rs) + " |")
    lines += ["", "## Real models: saved readings replayed", ""]
    for model, r in real.items():
        lines.append(f"- {model}: {r['queries']} saved queries (`{r['file']}`), {meta['orders']} random query orders "
                     f"(seed {meta['seed']}; at align_e {ALIGN_E:g} the orders of `real_decision.replay`)" +
                     (f"; with fewer saved queries than the cap of {CAP}, an order that has not decided after all "
                      f"{r['queries']} stays undecided." if r["queries"] < CAP else "."))
    lines += ["", "| model | " + " | ".join(f"align_e {e:g}" for e in es) + " |", "|---|" + "---:|" * len(es)]
    for model, r in real.items():
        lines.append(f"| {model} | " + " | ".join(
            f"{pct(r['by_align_e'][str(e)]['reads_rate'])}" for e in es) + " |")
    lines += ["", "Verdicts per order:", ""]
    for model, r in real.items():
        for e in es:
            v = r["by_align_e"][str(e)]["verdicts"]
            lines.append(f"- {model}, align_e {e:g}: " + ", ".join(f"{k} {n}" for k, n in sorted(v.items())))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--align-e", default=",".join(f"{e:g}" for e in ALIGN_ES), help="the align_e values swept")
    ap.add_argument("--power-draws", type=int, default=500, help="runs per power cell")
    ap.add_argument("--null-draws", type=int, default=2000, help="runs per null cell (s = 0)")
    ap.add_argument("--own-draws", type=int, default=1000, help="runs per own-preferences and follower cell")
    ap.add_argument("--scenarios", default=",".join(NULL_SCENARIOS), help="power scenarios (fixed shape)")
    ap.add_argument("--null-scenarios", default="no-delta,ties")
    ap.add_argument("--shapes", default="mixed,windows", help="further shapes of the power cells, on no-delta")
    ap.add_argument("--calibration-queries", type=int, default=1000, help="queries per moment estimate (follower)")
    ap.add_argument("--moment-queries", type=int, default=4000, help="queries per row of the moments table")
    ap.add_argument("--ndcg-draws", type=int, default=200, help="follower draws per list for its nDCG@10")
    ap.add_argument("--ideal-draws", type=int, default=10000, help="runs per align_e with perfect agreement")
    ap.add_argument("--orders", type=int, default=500, help="random query orders of the real readings")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results" / "tradeoff"))
    a = ap.parse_args()
    start = time.perf_counter()
    es = [float(x) for x in a.align_e.split(",") if x]
    grades, ideals = load_judged(a.data)

    reader = query_stats("no-delta", 0.5, grades, None, a.calibration_queries)
    follower = calibrate(grades, reader, a.calibration_queries)
    print(f"follower (beta, sigma) = {follower}", flush=True)
    moments = {"real 1.5B (saved DL19 readings)": None, "real 0.5B (saved DL19 readings)": None}
    real = {}
    for model, path in REAL.items():
        rows = json.loads(path.read_text())["rows"]
        facts = [summary(_reading(r)) for r in rows]
        moments[f"real {model.upper()} (saved DL19 readings)"] = _moments(facts)
        by = {}
        for e in es:
            v = replay(facts, a.orders, e, a.seed)
            by[str(e)] = {"verdicts": v, "reads_rate": v.get("reads", 0) / a.orders}
        real[model] = {"file": str(path.relative_to(HERE.parent)), "queries": len(facts), "by_align_e": by}
        print(model, {e: by[e]["reads_rate"] for e in by}, flush=True)
    for label, sc, s, fol in (("testbed relevance reader, s = 0.5", "no-delta", 0.5, None),
                              ("testbed relevance reader, s = 1", "no-delta", 1.0, None),
                              ("testbed first-stage follower, s = 0.5", FOLLOWER, 0.5, follower),
                              ("testbed own preferences, s = 0.5", OWN, 0.5, None),
                              ("testbed own preferences, s = 1", OWN, 1.0, None)):
        moments[label] = query_stats(sc, s, grades, fol, a.moment_queries)
    ideal = idealised(moments["testbed relevance reader, s = 1"], es, a.ideal_draws, a.seed)
    print("idealised", ideal, flush=True)
    nd = ndcg_table(grades, ideals, follower, a.ndcg_draws, a.seed)
    print(nd, flush=True)

    pool = multiprocessing.Pool(a.workers) if a.workers > 1 else None
    run = (lambda args: pool.map(one_decision, args, chunksize=16)) if pool else (lambda args: list(map(one_decision, args)))
    rows = []
    try:
        for e in es:
            for sc in a.scenarios.split(","):
                for s in (1.0, 0.5):
                    rows.append({"kind": "power", **cell(run, sc, s, "fixed", a.power_draws, grades, a.seed, e)})
            for sh in (x for x in a.shapes.split(",") if x):
                for s in (1.0, 0.5):
                    rows.append({"kind": "power", **cell(run, "no-delta", s, sh, a.power_draws, grades, a.seed, e)})
            for sc in a.null_scenarios.split(","):
                rows.append({"kind": "null", **cell(run, sc, 0.0, "fixed", a.null_draws, grades, a.seed, e)})
            for s in (0.5, 1.0):
                rows.append({"kind": "own", **cell(run, OWN, s, "fixed", a.own_draws, grades, a.seed, e)})
            rows.append({"kind": "follower", **cell(run, FOLLOWER, 0.5, "fixed", a.own_draws, grades, a.seed, e, follower)})
    finally:
        if pool:
            pool.close()
    meta = {"command": "python benchmarks/tradeoff.py " + " ".join(sys.argv[1:]), "seconds": time.perf_counter() - start,
            "when": time.strftime("%Y-%m-%d"), "data": pathlib.Path(a.data).name, "queries": len(grades),
            "workers": a.workers, "orders": a.orders, "seed": a.seed, "power_draws": a.power_draws,
            "ideal_draws": a.ideal_draws}
    res = {"meta": meta, "align_es": es, "follower": {"beta": follower[0], "sigma": follower[1], "s": 0.5,
                                                       "calibration_queries": a.calibration_queries},
           "moments": moments, "idealised": ideal,
           "idealised_moments": moments["testbed relevance reader, s = 1"], "ndcg": nd, "real": real, "rows": rows}
    out = pathlib.Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(res))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
