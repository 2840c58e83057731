"""The content check on a real model: its decision on a real collection, and how it depends on the query order.

Runs the content rule (``guard="content"``, the default before issue 22; ``check_wait=True`` so that the readings are taken in
query order and every list after the decision is ranked by it) over the first ``--queries`` lists of a
collection (top 20 of BM25), and reads the queries after the decision too (the same four first-step
readings and the empty prompt's, :func:`capcal_integrations.ranking.decoding.check_readings`), so that the
saved readings let the decision be replayed in ``--orders`` random query orders. Writes
``benchmarks/results/real-decision-<model>.md`` and ``.json`` (every reading saved, for reanalysis with
``--readings FILE``)::

    python benchmarks/real_decision.py --model 0.5b --queries 20 --set probability=trie
    python benchmarks/real_decision.py --readings benchmarks/results/real-decision-0.5b.json   # replay only
    python benchmarks/real_decision.py --model 1.5b --complete benchmarks/results/decision-sampling-1.5b.json

``--complete FILE`` starts from readings saved by the older check (each list read as given and with its halves
swapped: readings ``A`` and ``B``, method ``first-token`` without calibration) and reads the two it lacks
(``C``, ``D``) the same way, after checking on the first list that a fresh reading of ``A`` matches the saved one.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.content_check.contrast import Reading, agreement, alignment, summary  # noqa: E402
from capcal_integrations.content_check.evidence import ALIGN_E, CAP, Evidence  # noqa: E402
from capcal_integrations.options import Options  # noqa: E402


def _partial(args: argparse.Namespace, rows: list[dict], **facts: object) -> None:
    """The rows read so far, saved after every query (``--readings`` replays a run that was stopped); with
    ``--start``, after the rows of the earlier run."""
    out = pathlib.Path(args.out or HERE / "results" / f"real-decision-{args.model}")
    if getattr(args, "start", 0):
        earlier = getattr(args, "_earlier", None)
        if earlier is None:
            earlier = args._earlier = json.loads(_named(out, ".json").read_text())["rows"][:args.start]
        rows = [*earlier, *rows]
    _named(out, ".json").write_text(json.dumps({"model": args.model, "options": args.set, "queries": len(rows),
                                                    "partial": True, "rows": rows, **facts}) + "\n")


def _named(out: pathlib.Path, suffix: str) -> pathlib.Path:
    """``out`` with ``suffix`` appended (``real-decision-0.5b`` keeps its ``.5b``)."""
    return out.parent / (out.name + suffix)


def replay(readings: list[Reading], orders: int, seed: int = 0) -> dict:
    """The decision in ``orders`` random query orders of the saved readings (the cap: all of them)."""
    rng = random.Random(seed)
    verdicts: dict[str, int] = {}
    for _ in range(orders):
        evidence = Evidence(cap=CAP)
        for r in rng.sample(readings, len(readings)):
            if evidence.add(*summary(r)) is not None:
                break
        verdict = evidence.verdict or f"undecided after all {len(readings)}"
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    return verdicts


def ndcg10(grades: list[int], ideal: list[int]) -> float:
    from capcal_integrations.testbed.measure import ndcg10 as trec

    return trec(grades, ideal)


def run(args: argparse.Namespace) -> dict:
    from capcal_integrations.evaluation.data import load_dataset
    from capcal_integrations.ranking.decoding import check_readings
    from capcal_integrations.server.launcher import endpoint
    from capcal_integrations.transport.drivers import run_sync

    data = load_dataset(args.data)
    grades = data.grades()
    topics = data.topics[args.start:args.queries]
    options = dict(check_wait=True, guard="content", **{k: Options.parse(k, v) for k, v in (s.split("=", 1) for s in args.set)})
    start = time.perf_counter()
    with endpoint(args.base_url, args.model) as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, **options)
        rows = []
        for k, t in enumerate(topics):
            texts = [c.text if not c.title else f"Title: {c.title} Content: {c.text}" for c in t.candidates[:20]]
            judged = grades.get(t.qid, {})
            g = [judged.get(c.docid, 0) for c in t.candidates[:20]]
            before = rr.content_decision()
            t0 = time.perf_counter()
            ranking = rr.rerank(t.query, texts)
            seconds = time.perf_counter() - t0
            check = next(iter(rr._state.content.values()))
            if before is None and ranking.checked:
                reading = check.readings[-1]
            else:  # decided already: read it all the same, for the replay
                state = rr._state.for_ranking()
                opts = rr.options.replace(alpha=1.0)
                reading, _ = run_sync(check_readings(state, opts, t.query, texts), rr.client)
            rows.append({"qid": t.qid, "query": t.query, "method": ranking.method, "order": list(ranking.order),
                         "ndcg10": ndcg10([g[i] for i in ranking.order], sorted(judged.values(), reverse=True)),
                         "bm25": ndcg10(g, sorted(judged.values(), reverse=True)), "seconds": round(seconds, 2),
                         "score": agreement(reading), "aligned": alignment(reading), "e_after": check.evidence.for_reads,
                         "reading": {"slots": [list(s) for s in reading.slots], "empty": list(reading.empty or ())}})
            print(f"{k + 1}/{len(topics)} {ranking.method} score {rows[-1]['score']:.2f} e {check.evidence.for_reads:.3g} "
                  f"verdict {check.evidence.verdict}", file=sys.stderr, flush=True)
            _partial(args, rows, weights=rr.capabilities().weights,
                     decision_text=str(rr.content_decision()) if rr.content_decision() else "undecided so far",
                     seconds=round(time.perf_counter() - start, 1))
        decision = rr.content_decision()
        caps = rr.capabilities()
    rows = [*getattr(args, "_earlier", []), *rows]  # --start: the earlier run's rows first (_partial read them)
    return {"model": args.model or caps.model, "served": caps.model, "weights": caps.weights, "options": args.set,
            "queries": len(rows), "decision": None if decision is None else json.loads(decision.to_json()),
            "decision_text": str(decision) if decision else "undecided after every query",
            "seconds": round(time.perf_counter() - start, 1), "rows": rows}


def complete(args: argparse.Namespace) -> dict:
    """Readings ``A``, ``B`` saved by the older check, ``C`` and ``D`` read here the same way (module docstring)."""
    import math

    from capcal_integrations.content_check.contrast import reading_orders
    from capcal_integrations.server.launcher import endpoint
    from capcal_integrations.testbed.measure import bench_lists

    saved = json.loads(pathlib.Path(args.complete).read_text())["readings"]
    lists = bench_lists(args.data)[:len(saved)]
    start = time.perf_counter()
    with endpoint(args.base_url, args.model) as ep:
        first = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, timeout=900,
                               method="first-token", guard=None)

        def read(b, order: list[int]) -> tuple[float, ...]:
            p = first.rerank(b.query, [b.passages[i] for i in order]).steps[0].p
            return tuple(math.log(max(x, 1e-300)) for x in p)

        again = read(lists[0], list(range(len(lists[0].passages))))
        drift = max(abs((x - again[0]) - (y - saved[0][0][0])) for x, y in zip(again, saved[0][0]))
        print(f"reading A of list 0 read again: largest difference from the saved one {drift:.2e}", file=sys.stderr)
        rows = []
        for k, (b, (a, bb)) in enumerate(zip(lists, saved)):
            if k < args.start:  # read by the earlier run (--start)
                continue
            n = len(b.passages)
            _, _, c, d = reading_orders(n)
            reading = Reading((tuple(a), tuple(bb), read(b, c), read(b, d)))
            rows.append({"qid": str(k), "query": b.query, "method": "-", "order": [], "ndcg10": 0.0, "bm25": 0.0,
                         "seconds": 0.0, "score": agreement(reading), "aligned": alignment(reading), "e_after": 0.0,
                         "reading": {"slots": [list(s) for s in reading.slots], "empty": []}})
            print(f"{k + 1}/{len(saved)} score {rows[-1]['score']:.2f}", file=sys.stderr, flush=True)
            _partial(args, rows, check_drift=drift, weights=first.capabilities().weights,
                     seconds=round(time.perf_counter() - start, 1),
                     options_note=["method=first-token", "guard=None", f"readings A, B from {args.complete}"])
        caps = first.capabilities()
    rows = [*getattr(args, "_earlier", []), *rows]  # --start: the earlier run's rows first (_partial read them)
    evidence = Evidence(cap=CAP)
    for r in rows:
        if evidence.add(*summary(_reading(r))) is not None:
            break
        r["e_after"] = evidence.for_reads
    return {"model": args.model or caps.model, "served": caps.model, "weights": caps.weights,
            "options": ["method=first-token", "guard=None", f"readings A, B from {args.complete}"], "queries": len(rows),
            "decision": None, "decision_text": (f"{evidence.verdict} after {evidence.queries} queries (e = "
                                                f"{evidence.for_reads:.3g} for reads, {evidence.for_not:.3g} against)"
                                                if evidence.verdict else f"undecided after all {evidence.queries} "
                                                f"queries (e = {evidence.for_reads:.3g} for reads, {evidence.for_not:.3g} "
                                                "against): the check keeps the given order while undecided"),
            "check_drift": drift, "seconds": round(time.perf_counter() - start, 1), "rows": rows}


def report(result: dict, verdicts: dict, orders: int, command: str) -> str:
    rows = result["rows"]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    reads = verdicts.get("reads", 0)
    return "\n".join([
        f"# The content check on the real {result['model']} model", "",
        f"`{command}` ({result['seconds']:.0f} s; {result['queries']} DL19 queries, top 20 of BM25; options "
        f"{', '.join(result['options']) or 'defaults'}; weights fingerprint `{result['weights']}`).", "",
        f"**Decision in query order:** {result['decision_text']}", "",
        *([f"nDCG@10 of the default over these queries: {mean('ndcg10'):.4f} (BM25 {mean('bm25'):.4f}); the default "
           f"ranked {sum(r['method'] != 'given-order' for r in rows)} of {len(rows)} lists calibrated.", ""]
          if "check_drift" not in result else
          [f"Readings A and B are the older check's saved ones; C and D were read here the same way (A of the first list "
           f"read again differs from the saved one by at most {result['check_drift']:.2e} in log-probability).", ""]),
        f"**Replayed in {orders} random query orders** (the saved readings): " +
        ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items())) + f" — \"reads\" in {100 * reads / orders:.1f} %.", "",
        "| qid | query | score | alignment | e after | e aligned after | method | nDCG@10 | BM25 |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
        *(f"| {r['qid']} | {r['query'][:40]} | {r['score']:.2f} | {r.get('aligned', float('nan')):+.2f} | {r['e_after']:.3g} | "
          f"{r.get('e_aligned_after', float('nan')):.3g} | {r['method']} | {r['ndcg10']:.4f} | {r['bm25']:.4f} |"
          for r in rows), ""])


def _reading(row: dict) -> Reading:
    """A saved row's four readings (and the empty prompt's, where it was read)."""
    return Reading(tuple(tuple(s) for s in row["reading"]["slots"]), tuple(row["reading"]["empty"]) or None)


def fixture(paths: list[str]) -> int:
    """The real models' readings reduced to what the sequential test takes, for tests/test_content_check.py."""
    out = {}
    for path in paths:
        result = json.loads(pathlib.Path(path).read_text())
        out[result["model"]] = [[round(score, 6), round(aligned, 6), pairs]
                                for score, aligned, pairs in (summary(_reading(r)) for r in result["rows"])]
    target = HERE.parent / "tests" / "fixtures" / "real-readings.json"
    target.write_text(json.dumps(out) + "\n")
    print(f"{target}: " + ", ".join(f"{m} {len(q)} queries" for m, q in out.items()))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--base-url", default=None, help="an endpoint; default: the embedded --model, started here")
    ap.add_argument("--model", default="0.5b")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--start", type=int, default=0, help="begin at this query, adding to the rows of the results "
                    "file already there (a run stopped early, continued; the decision is replayed over all of them)")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE")
    ap.add_argument("--orders", type=int, default=500)
    ap.add_argument("--readings", help="replay the readings saved in this JSON instead of ranking")
    ap.add_argument("--complete", help="complete the older check's saved readings (A, B) with C and D (docstring)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fixture", nargs="+", metavar="RESULTS_JSON", help="write tests/fixtures/real-readings.json "
                    "(per query: agreement, alignment, slot pairs) from these results files, and stop")
    a = ap.parse_args()
    if a.fixture:
        return fixture(a.fixture)
    command = "python benchmarks/real_decision.py " + " ".join(sys.argv[1:])
    result = (json.loads(pathlib.Path(a.readings).read_text()) if a.readings else complete(a) if a.complete else run(a))
    readings = [_reading(r) for r in result["rows"]]
    if result.get("partial"):  # a run in parts: the decision in query order over every query read
        evidence = Evidence(cap=CAP)
        for r, row in zip(readings, result["rows"]):
            row["score"], row["aligned"], _ = facts = summary(r)
            decided = evidence.add(*facts)
            row["e_after"], row["e_aligned_after"] = evidence.for_reads, evidence.for_aligned
            if decided is not None:
                break
        verdict = {"undecided": f"does not read (undecided at the cap of {CAP} queries)"}.get(evidence.verdict,
                                                                                             evidence.verdict)
        result["decision_text"] = (f"{verdict} after {evidence.queries} queries" if evidence.verdict else
                                   f"undecided after the {evidence.queries} queries read (the run was stopped there)") + (
            f" (e = {evidence.for_reads:.3g} for \"reads\" and {evidence.for_aligned:.3g} for \"goes the first stage's "
            f"way\", which needs {ALIGN_E:g}; {evidence.for_not:.3g} for \"does not read\")")
        result["options"] = result.get("options_note") or result.get("options") or []
    verdicts = replay(readings, a.orders)
    result["replay"] = {"orders": a.orders, "verdicts": verdicts}
    out = pathlib.Path(a.out or HERE / "results" / f"real-decision-{result['model']}")
    _named(out, ".json").write_text(json.dumps(result) + "\n")
    _named(out, ".md").write_text(report(result, verdicts, a.orders, command))
    print(_named(out, ".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
