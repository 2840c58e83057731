"""The testbed table: every method of the library on a simulated reranker with known signal and bias.

    python benchmarks/testbed.py [--data ../shared/data/trec-dl19-passage] [--draws 20] [--s 0,0.5,1,2,4]

For each slot scenario (no delta; the 0.5B's and the 1.5B's fitted delta; a last-digit-shared delta;
twelve labels tied at a floor) and content slope ``s``, every method ranks the 43 DL19 top-20 lists
through the simulated llama.cpp server of :mod:`capcal_integrations.testbed`, ``--draws`` times (one
simulated model per draw). Writes benchmarks/results/testbed.json (rows with standard errors and the
time per ranking) and testbed.md (the table, and the checks of issue 17's "What must hold").
Cells already in the JSON are kept unless --fresh (so an interrupted run resumes).

A test instrument: the numbers say what the library's rules do on a model whose signal and bias are
known, not what a real model does.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import asdict

from capcal_integrations.testbed.measure import METHODS, Row, bench_lists, measure, table
from capcal_integrations.testbed.model import SCENARIOS

HERE = pathlib.Path(__file__).parent
DATA = pathlib.Path("/work/shared/data/trec-dl19-passage")


def checks(rows: list[Row]) -> list[str]:
    """Issue 17's conditions on the default, per (scenario, s): s = 0 decides "does not read" in >= 95 % of
    decisions and stays within .01 of BM25; s >= 0.5 decides "reads" in >= 95 % and stays within .01 of the
    best of vanilla and CapCal (any alpha measured)."""
    out = []
    cells = {(r.scenario, r.s) for r in rows}
    for name, s in sorted(cells, key=lambda c: (list(SCENARIOS).index(c[0]) if c[0] in SCENARIOS else 99, c[1])):
        by = {r.method: r for r in rows if (r.scenario, r.s) == (name, s)}
        d = by.get("default")
        if d is None:
            continue
        share = d.reads_share if d.reads_share is not None else 1.0
        if s == 0:
            ok = share <= 0.05 and d.ndcg10 >= by["bm25"].ndcg10 - 0.01
            what = f"reads {share:.2f} (<= .05), nDCG {d.ndcg10:.4f} vs BM25 {by['bm25'].ndcg10:.4f}"
        else:
            rivals = [r for m, r in by.items() if m == "vanilla" or m.startswith("capcal")]
            best = max(rivals, key=lambda r: r.ndcg10)
            ok = share >= 0.95 and d.ndcg10 >= best.ndcg10 - 0.01
            what = f"reads {share:.2f} (>= .95), nDCG {d.ndcg10:.4f} vs best {best.method} {best.ndcg10:.4f}"
        out.append(f"| {name} | {s:g} | {'yes' if ok else '**no**'} | {what} |")
    return ["| scenario | s | holds | default |", "|---|---:|---|---|", *out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--s", default="0,0.5,1,2,4")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--lists", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "testbed"))
    ap.add_argument("--fresh", action="store_true", help="recompute cells already in the JSON")
    args = ap.parse_args()
    lists = bench_lists(args.data)[:args.lists]
    out = pathlib.Path(args.out)
    stored = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").is_file() and not args.fresh else {}
    rows = [Row(**r) for r in stored.get("rows", [])]
    meta = stored.get("meta", {"draws": args.draws, "lists": len(lists), "seed": args.seed, "methods": METHODS})
    for name in args.scenarios.split(","):
        for s in (float(x) for x in args.s.split(",")):
            if any((r.scenario, r.s) == (name, s) for r in rows):
                continue
            start = time.perf_counter()
            rows += measure(lists, scenarios=[name], s_values=[s], draws=args.draws, seed=args.seed,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
            print(f"{name} s={s:g}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            _write(out, rows, meta)
    _write(out, rows, meta)
    print(out.with_suffix(".md").read_text())
    return 0


def _write(out: pathlib.Path, rows: list[Row], meta: dict) -> None:
    order = {n: i for i, n in enumerate(SCENARIOS)}
    methods = {m: i for i, m in enumerate(meta["methods"])}
    rows = sorted(rows, key=lambda r: (order.get(r.scenario, 99), r.s, methods.get(r.method, 99), r.method))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    per_list = {m: sum(r.seconds for r in rows if r.method == m) / max(1, sum(r.method == m for r in rows))
                for m in methods}
    text = [
        "# The testbed: the library's methods on a simulated reranker with known signal and bias",
        "",
        "A test instrument: what the library's rules do on a reranker whose content signal `s` (logits per",
        "relevance grade) and slot bias are known, not what a real model does. Regenerate with",
        "`python benchmarks/testbed.py` (see its docstring and `capcal_integrations/testbed`).",
        "",
        f"{meta['lists']} DL19 top-20 lists x {meta['draws']} draws (simulated models) per scenario and s; nDCG@10",
        "(trec_eval's) averaged over lists and draws, ± its standard error over draws; `reads share`: the share of",
        "the method's content decisions that said the model reads (per list for the per-list guard).",
        "",
        "Methods: " + "; ".join(f"`{m}` = {'BM25 order' if o is None else (o or 'the default options')}"
                                for m, o in meta["methods"].items()) + ".",
        "",
        table(rows),
        "",
        "## Issue 17's conditions on the default",
        "",
        *checks(rows),
        "",
        "Time per ranking (2 shared cores, the whole library path against the in-process server): "
        + ", ".join(f"{m} {v * 1000:.0f} ms" for m, v in per_list.items() if v) + ".",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(text))


if __name__ == "__main__":
    raise SystemExit(main())
