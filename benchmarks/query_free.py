"""Do a real model's passage preferences depend on the query? The saved readings against query-free ones.

The content check (``capcal_integrations/content_check/contrast.py``) finds that both packaged models have consistent passage
preferences on DL19 that do not follow relevance (``benchmarks/results/real-decision-*.md``). This probe asks
whether those preferences need the query at all: each saved query's top-20 list is read again in the same four
orders with the query replaced by a placeholder (``QUERY_FREE``), the same way the saved readings were taken
(the 0.5B: the check's own readings, ``probability=trie``; the 1.5B: ``first-token`` first steps). Per query:

* ``agree_q`` / ``agree_free``: the check's score (:func:`~capcal_integrations.content_check.contrast.agreement`) with and
  without the query;
* ``corr``: the correlation over slot pairs of the two content estimates (``e1 + e2``) with and without the
  query (near 1: the preferences are the same whatever the query);
* ``agree_d`` / ``align_d``: the score (not centred) and the alignment of what the query adds (``e - e_free``);
  ``agree_c``: the default rule's score, centred over the list's pairs (a shift alike in every pair removed);
* ``grades_q`` / ``grades_d``: among the slot pairs whose relevance grades differ, the share whose content
  estimate (with the query; what the query adds) prefers the better-graded passage (labels used here only to
  describe, never by the library).

    python benchmarks/query_free.py --model 0.5b --queries 12
    python benchmarks/query_free.py --model 1.5b --queries 8
    python benchmarks/query_free.py --model 0.5b --replay        # the decisions again from the saved readings
    python benchmarks/query_free.py --model 0.5b --replay --fresh --data ../shared/data/trec-dl20-passage --queries 30

The decisions: both rules (``content``, ``query`` at several ``align_e``) over the queries read, in their order
and in ``--orders`` random orders (cap: the queries read).

Writes ``benchmarks/results/query-free-<model>.md`` and ``.json`` (every query-free reading saved).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.content_check import rules  # noqa: E402
from capcal_integrations.content_check.contrast import Reading, agreement, alignment, estimates, reading_orders, share, summary  # noqa: E402
from capcal_integrations.content_check.evidence import CAP  # noqa: E402
from capcal_integrations.content_check.query_contrast import differences, estimate_pairs, judge  # noqa: E402
from capcal_integrations.content_check.query_contrast import summary as query_summary  # noqa: E402
from capcal_integrations.options import Options  # noqa: E402
from capcal_integrations.prompts.render import QUERY_PLACEHOLDER  # noqa: E402

#: What stands in for the query: the library's own (the query rule reads the same prompts).
QUERY_FREE = QUERY_PLACEHOLDER


def pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = math.fsum((a - mx) ** 2 for a in x), math.fsum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def follows(content: list[float], g: list[int]) -> tuple[int, int]:
    """``(pairs preferring the better-graded passage, pairs whose grades differ)`` over slot pairs (m, m + h)."""
    h = len(g) // 2
    pairs = [(c, g[m] - g[m + h]) for m, c in enumerate(content[:h]) if g[m] != g[m + h]]
    return sum((c > 0) == (dg > 0) for c, dg in pairs if c != 0), len(pairs)


def facts(with_query: Reading, free: Reading, g: list[int]) -> dict:
    both = Reading((*with_query.slots, *free.slots))  # the query rule's eight readings
    cq, cf, cd = ([a + b for a, b in zip(*pair)] for pair in (estimates(with_query), estimates(free), differences(both)))
    agree_d, align_d, _ = uncentred(both)
    return {"agree_q": agreement(with_query), "agree_free": agreement(free), "corr": pearson(cq, cf),
            "agree_d": agree_d, "align_d": align_d, "align_q": alignment(with_query),
            "grades_q": follows(cq, g), "grades_d": follows(cd, g)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="0.5b", help="0.5b or 1.5b (its saved readings: results/real-decision-<model>.json)")
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--queries", type=int, default=12)
    ap.add_argument("--start", type=int, default=0, help="begin at this query, after the rows already saved")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replay", action="store_true", help="only the decisions, from the saved readings")
    ap.add_argument("--orders", type=int, default=500)
    ap.add_argument("--fresh", action="store_true", help="read every query of --data here, with and without the query, "
                    "by the library's own check_readings at the default options (out of sample: another collection than "
                    "the saved DL19 readings); writes query-free-<model>-<collection>")
    ap.add_argument("--fixture", action="store_true", help="write tests/fixtures/query-effects.json from both models' "
                    "saved readings (what the query adds, per slot pair: tests/test_query_rule.py replays it)")
    args = ap.parse_args()
    if args.fixture:
        return write_fixture()
    collection = pathlib.Path(args.data).name.replace("trec-", "").replace("-passage", "")
    out = pathlib.Path(args.out or HERE / "results" / (f"query-free-{args.model}-{collection}" if args.fresh
                                                       else f"query-free-{args.model}"))
    if args.replay:
        done = json.loads(pathlib.Path(f"{out}.json").read_text())
        if any("with_query" not in r for r in done["rows"]):  # runs before the replay existed saved only the query-free
            kept = json.loads((HERE / "results" / f"real-decision-{args.model}.json").read_text())["rows"]
            saved = {r["query"]: r for r in kept}
            for r in done["rows"]:
                r.setdefault("with_query", saved[r["query"]]["reading"]["slots"])
        args.queries = len(done["rows"])
        _write(out, args, done["rows"], done["drift"], done["seconds"])
        print(pathlib.Path(f"{out}.md").read_text())
        return 0
    if args.fresh:
        return fresh(args, out)
    from capcal_integrations.ranking.decoding import check_readings
    from capcal_integrations.server.launcher import endpoint
    from capcal_integrations.testbed.measure import bench_lists
    from capcal_integrations.transport.drivers import run_sync

    saved = json.loads((HERE / "results" / f"real-decision-{args.model}.json").read_text())
    note = saved.get("options_note") or saved.get("options") or []
    first_token = "method=first-token" in note
    options = {} if first_token else {k: Options.parse(k, v) for k, v in (s.split("=", 1) for s in saved["options"])}
    lists = {b.query: b for b in bench_lists(args.data)}
    before = json.loads(pathlib.Path(f"{out}.json").read_text()) if args.start else {"rows": [], "drift": math.nan}
    rows = before["rows"][:args.start]
    start = time.perf_counter()
    with endpoint(None, args.model) as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, timeout=900, guard=None,
                            **({"method": "first-token"} if first_token else options))

        def read(query: str, texts: list[str]) -> Reading:
            if first_token:  # as benchmarks/real_decision.py --complete read the 1.5B's
                return Reading(tuple(tuple(math.log(max(x, 1e-300)) for x in rr.rerank(query, [texts[i] for i in o]).steps[0].p)
                                     for o in reading_orders(len(texts))))
            reading, _ = run_sync(check_readings(rr._state.for_ranking(), rr.options.replace(alpha=1.0), query, texts),
                                  rr.client)
            return reading

        rr.capabilities()
        drift = before["drift"]
        # past the saved readings (the 1.5B's first 20), both readings are taken here, in the collection's order
        rows_in = saved["rows"] + [{"qid": str(k), "query": b.query, "reading": None}
                                   for k, b in enumerate(lists.values()) if k >= len(saved["rows"])]
        for k, row in enumerate(rows_in[:args.queries]):
            if k < args.start:
                continue
            b = lists[row["query"]]
            texts = list(b.passages)
            with_query = (Reading(tuple(tuple(s) for s in row["reading"]["slots"])) if row["reading"] is not None
                          else read(row["query"], texts))
            if row["reading"] is None and k == args.start:
                print("read with and without the query on this machine (past the saved readings)", file=sys.stderr)
            elif k == args.start:  # the saved reading is what this script reads
                again = read(row["query"], texts)
                drift = max(abs((x - again.slots[0][0]) - (y - with_query.slots[0][0]))
                            for x, y in zip(again.slots[0], with_query.slots[0]))
                print(f"the first saved reading read again: largest difference {drift:.2e}", file=sys.stderr, flush=True)
            free = read(QUERY_FREE, texts)
            rows.append({"qid": row["qid"], "query": row["query"], **facts(with_query, free, list(b.grades)),
                         "with_query": [list(s) for s in with_query.slots], "free": [list(s) for s in free.slots]})
            r = rows[-1]
            print(f"{k + 1}/{args.queries} agree q {r['agree_q']:.2f} free {r['agree_free']:.2f} corr {r['corr']:.2f} "
                  f"d {r['agree_d']:.2f} align_d {r['align_d']:+.2f}", file=sys.stderr, flush=True)
            _write(out, args, rows, drift, time.perf_counter() - start)
    return 0


def fresh(args: argparse.Namespace, out: pathlib.Path) -> int:
    """Every query of ``--data`` (its first ``--queries``) read here in one run, with and without the query, as the
    library's check reads it (``check_readings``, default options, the default rule's orders)."""
    from capcal_integrations.ranking.decoding import check_readings
    from capcal_integrations.server.launcher import endpoint
    from capcal_integrations.testbed.measure import bench_lists
    from capcal_integrations.transport.drivers import run_sync

    lists = bench_lists(args.data)[:args.queries]
    done = json.loads(pathlib.Path(f"{out}.json").read_text())["rows"] if args.start else []
    rows, start = done[:args.start], time.perf_counter()
    with endpoint(None, args.model) as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, timeout=1800, guard=None)
        rr.capabilities()
        for k, b in enumerate(lists):
            if k < len(rows):
                continue
            reading, _ = run_sync(check_readings(rr._state.for_ranking(), rr.options.replace(alpha=1.0), b.query,
                                                 list(b.passages)), rr.client)
            with_query, free = (Reading(half) for half in (reading.slots[:4], reading.slots[4:]))
            rows.append({"qid": str(k), "query": b.query, **facts(with_query, free, list(b.grades)),
                         "with_query": [list(x) for x in with_query.slots], "free": [list(x) for x in free.slots]})
            print(f"{k + 1}/{len(lists)} {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            _write(out, args, rows, math.nan, time.perf_counter() - start)
    return 0


def write_fixture() -> int:
    """Both packaged models' estimates per DL19 query, in the collection's order (4 decimals): ``[e, f]``, the
    slot-free estimates per pair of orders with the query and without it (``query_contrast.estimate_pairs``)."""
    effects = {}
    for model in ("0.5b", "1.5b"):
        rows = json.loads((HERE / "results" / f"query-free-{model}.json").read_text())["rows"]
        effects[model] = [[[[round(x, 4) for x in d] for d in side]
                           for side in estimate_pairs(Reading((*map(tuple, r["with_query"]), *map(tuple, r["free"]))))]
                          for r in rows]
    target = HERE.parent / "tests" / "fixtures" / "query-effects.json"
    target.write_text(json.dumps(effects, separators=(",", ":")) + "\n")
    print(f"wrote {target} ({', '.join(f'{m}: {len(v)} queries' for m, v in effects.items())})")
    return 0


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def uncentred(reading: Reading) -> tuple[float, float, int]:
    """The query rule's summary before its score was centred over the list's pairs (betting on the score)."""
    d1, d2 = differences(reading)[:2]
    return share([x * y for x, y in zip(d1, d2)]), share([x + y for x, y in zip(d1, d2)]), len(d1)


#: The rules replayed: (label, summary of one query's readings, align_e). A summary of three values bets on the score
#: (the query rule before its e-value from the estimates' signs); of four, multiplies by the query's e-value.
RULES = (("content (align_e 20)", "content", lambda r: summary(Reading(r.slots[:4])), 20.0),
         ("query, not centred, betting on the score (align_e 0)", "query", uncentred, 0.0),
         ("query, centred, betting on the score (the default before; align_e 0)", "query",
          lambda r: query_summary(r)[:3], 0.0),
         ("query, the e-value of the estimates' signs at scale 1 (the default before issue 33; align_e 0)", "query",
          lambda r: judge(differences(r)), 0.0),
         ("query (the default: the least e-value over the scales 0.8-2; align_e 0)", "query", query_summary, 0.0),
         ("query, align_e 2", "query", query_summary, 2.0), ("query, align_e 20", "query", query_summary, 20.0))


def decisions(rows: list[dict], orders: int, seed: int = 0) -> list[tuple[str, str, dict[str, int]]]:
    """Per rule: its decision over the queries in their order, and the verdicts' counts over random orders."""
    import random

    readings = [Reading((*map(tuple, r["with_query"]), *map(tuple, r["free"]))) for r in rows]
    out = []
    for label, rule, summarise, align_e in RULES:
        facts_of = [summarise(r) for r in readings]

        def decide(sequence: list[tuple], rule: str = rule, align_e: float = align_e) -> str:
            evidence = rules.rule_named(rule).evidence(CAP)  # the rule's own test, at this alignment threshold
            evidence.align_e = align_e
            for f in sequence:
                if evidence.add(*f) is not None:
                    return f"{evidence.verdict} after {evidence.queries}"
            return f"undecided after all {evidence.queries}"

        rng, counts = random.Random(seed), {}
        for _ in range(orders):
            verdict = decide(rng.sample(facts_of, len(facts_of))).split(" after")[0]
            counts[verdict] = counts.get(verdict, 0) + 1
        out.append((label, decide(facts_of), counts))
    return out


def _write(out: pathlib.Path, args: argparse.Namespace, rows: list[dict], drift: float, seconds: float) -> None:
    pathlib.Path(f"{out}.json").write_text(json.dumps({"model": args.model, "query_free": QUERY_FREE, "drift": drift,
                                                    "seconds": round(seconds, 1), "rows": rows}) + "\n")
    gq = [sum(r["grades_q"][i] for r in rows) for i in (0, 1)]
    gd = [sum(r["grades_d"][i] for r in rows) for i in (0, 1)]
    fresh_args = f" --fresh --data {args.data}" if getattr(args, "fresh", False) else ""
    lines = [f"# Does the {args.model} model's passage preference depend on the query?", "",
             f"`python benchmarks/query_free.py --model {args.model} --queries {args.queries}{fresh_args}` ({len(rows)} "
             f"{pathlib.Path(args.data).name} queries "
             f"read, {seconds:.0f} s; the saved reading of the first query read again differs by at most {drift:.1e}). "
             f"Query-free: the query replaced by {QUERY_FREE!r}. Columns: the module docstring.", "",
             "| qid | agree_q | agree_free | corr | agree_d | agree_c | align_q | align_d | grades_q | grades_d |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        r["agree_c"] = query_summary(Reading((*map(tuple, r["with_query"]), *map(tuple, r["free"]))))[0]
        lines.append(f"| {r['qid']} | {r['agree_q']:.2f} | {r['agree_free']:.2f} | {r['corr']:.2f} | {r['agree_d']:.2f} | "
                     f"{r['agree_c']:.2f} | "
                     f"{r['align_q']:+.2f} | {r['align_d']:+.2f} | {r['grades_q'][0]}/{r['grades_q'][1]} | "
                     f"{r['grades_d'][0]}/{r['grades_d'][1]} |")
    lines += ["", f"**Means:** agree_q {_mean([r['agree_q'] for r in rows]):.2f}, agree_free "
              f"{_mean([r['agree_free'] for r in rows]):.2f}, corr {_mean([r['corr'] for r in rows]):.2f}, agree_d "
              f"{_mean([r['agree_d'] for r in rows]):.2f}, agree_c "
              f"{_mean([r['agree_c'] for r in rows]):.2f}, align_q {_mean([r['align_q'] for r in rows]):+.2f}, align_d "
              f"{_mean([r['align_d'] for r in rows]):+.2f}; the better-graded passage preferred in {gq[0]} of {gq[1]} "
              f"pairs with the query, {gd[0]} of {gd[1]} by what the query adds."]
    if rows and "with_query" in rows[0]:
        lines += ["", f"**Decisions** over these {len(rows)} queries (the cap: all of them), in their order and in "
                  f"{args.orders} random orders:", "", "| rule | in order | random orders: reads / does not read / "
                  "undecided |", "|---|---|---|"]
        for label, in_order, counts in decisions(rows, args.orders):
            lines.append(f"| {label} | {in_order} | {counts.get('reads', 0)} / {counts.get('does not read', 0)} / "
                         f"{counts.get('undecided', 0)} |")
    pathlib.Path(f"{out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
