"""The testbed table: every method of the library on a simulated reranker with known signal and bias.

    python benchmarks/testbed.py [--data ../shared/data/trec-dl19-passage] [--draws 20] [--s 0,0.5,1,2]
    python benchmarks/testbed.py --shapes all --scenarios all --draws 5     # issue 22's shapes of real traffic

For each slot scenario (no delta; the 0.5B's and the 1.5B's fitted delta; a last-digit-shared delta;
twelve labels tied at a floor) and content slope ``s``, every method ranks the 43 DL19 top-20 lists
through the simulated llama.cpp server of :mod:`capcal_integrations.testbed`, ``--draws`` times (one
simulated model per draw). Writes benchmarks/results/testbed.json (rows with standard errors and the
time per ranking) and testbed.md (the table, and the checks of issue 17's "What must hold").
Cells already in the JSON are kept unless --fresh (so an interrupted run resumes).

``--shapes`` (``fixed``, ``mixed``, ``windows``, ``concurrent``, or ``all``: how the lists reach the reranker, see
:mod:`capcal_integrations.testbed.measure`) and the scenarios of issue 22 (``noise-scale-0.5``,
``noise-scale-1``, ``heavy-tails``, ``shared-slots``, ``scale-1.5b``; ``--scenarios all``) write to
benchmarks/results/testbed-traffic.json and .md instead, unless --out says otherwise. The run first says how
long it will take (a few lists of each shape timed).

A test instrument: the numbers say what the library's rules do on a model whose signal and bias are
known, not what a real model does.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time
from dataclasses import asdict

from capcal_integrations.testbed.measure import (
    IMPLIED_ALPHAS,
    METHODS,
    SHAPE_TOP,
    SHAPES,
    Row,
    bench_lists,
    estimate,
    measure,
    pivot,
    table,
)
from capcal_integrations.testbed.model import SCENARIOS

HERE = pathlib.Path(__file__).parent
DATA = pathlib.Path("/work/shared/data/trec-dl19-passage")
#: The scenarios of issue 17's table (benchmarks/results/testbed.json); the others are issue 22's.
CLASSIC = ("no-delta", "delta-0.5b", "delta-1.5b", "last-digit", "ties")


def _file(out: pathlib.Path, suffix: str) -> pathlib.Path:
    """``out`` with ``suffix`` appended (``testbed-real-0.5b`` keeps its dots)."""
    return out.parent / (out.name + suffix)


def checks(rows: list[Row]) -> list[str]:
    """Issue 22's conditions on the default, per (scenario, s): at s = 0 its nDCG@10 within .005 of BM25 over the
    whole run (the deciding phase included); at s >= 0.5, over the lists ranked after its decision, within .01 of
    the best fixed method in hindsight (vanilla, CapCal adaptive, at alpha 1, at the best alpha implied) on
    those same lists. The whole run is shown beside it, so the price of deciding is visible."""
    out = []
    cells = {(r.shape, r.scenario, r.s) for r in rows}
    shapes = list(SHAPES)
    for shape, name, s in sorted(cells, key=lambda c: (shapes.index(c[0]) if c[0] in shapes else 99,
                                                        list(SCENARIOS).index(c[1]) if c[1] in SCENARIOS else 99, c[2])):
        by = {r.method: r for r in rows if (r.shape, r.scenario, r.s) == (shape, name, s)}
        d = by.get("default")
        if d is None or "bm25" not in by:
            continue
        share = d.reads_share if d.reads_share is not None else 0.0
        whole = f"whole run {d.ndcg10:.4f} (BM25 {by['bm25'].ndcg10:.4f})"
        if s == 0:
            ok = abs(d.ndcg10 - by["bm25"].ndcg10) <= 0.005
            what = f"reads {share:.2f}; {whole}"
        else:
            after = by.get("default@decided")
            rivals = [r for m, r in by.items() if m.endswith("@decided") and m != "default@decided"
                      and (m.startswith("vanilla") or m.startswith("capcal"))]
            if after is None or not rivals:
                out.append(f"| {d.cell} | {s:g} | no decision in any draw | reads {share:.2f}; {whole} |")
                continue
            best = max(rivals, key=lambda r: r.ndcg10)
            ok = after.ndcg10 >= best.ndcg10 - 0.01
            what = (f"reads {share:.2f}; after the decision {after.ndcg10:.4f} vs best {best.method[:-8]} "
                    f"{best.ndcg10:.4f}; {whole}")
        out.append(f"| {d.cell} | {s:g} | {'yes' if ok else '**no**'} | {what} |")
    return ["| scenario | s | holds | default |", "|---|---:|---|---|", *out]


def costs(rows: list[Row]) -> list[str]:
    """Requests and prompt tokens per list (the probe spread over the draw's lists), against vanilla."""
    methods = [m for m in dict.fromkeys(r.method for r in rows) if any(r.requests for r in rows if r.method == m)]
    out = ["| cells | method | requests | prompt tokens | uncached prompt tokens | uncached vs vanilla |",
           "|---|---|---:|---:|---:|---:|"]
    for label, keep in (("s = 0", lambda r: r.s == 0), ("s >= 0.5", lambda r: r.s > 0)):
        chosen = [r for r in rows if keep(r)]
        base = [r.uncached_tokens for r in chosen if r.method == "vanilla"]
        base_mean = sum(base) / len(base) if base else 0.0
        for m in methods:
            mine = [r for r in chosen if r.method == m]
            if not mine:
                continue
            req, tok, unc = (sum(getattr(r, f) for r in mine) / len(mine) for f in ("requests", "prompt_tokens",
                                                                                 "uncached_tokens"))
            ratio = f"{unc / base_mean:.2f}" if base_mean else ""
            out.append(f"| {label} | {m} | {req:.1f} | {tok:,.0f} | {unc:,.0f} | {ratio} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--s", default="0,0.5,1,2")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--scenarios", default=None,
                    help=f"of {', '.join(SCENARIOS)}, or all (default: {', '.join(CLASSIC)} for the fixed shape, else all)")
    ap.add_argument("--shapes", default="fixed", help=f"of {', '.join(SHAPES)}, or all (default fixed)")
    ap.add_argument("--lists", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results/testbed (issue 17's cells) or results/testbed-traffic (default)")
    ap.add_argument("--methods", default=",".join(m for m in METHODS if m != "content"),  # content: opt-in
                    help=f"of {', '.join(METHODS)}")
    ap.add_argument("--fresh", action="store_true", help="recompute cells already in the JSON")
    ap.add_argument("--real", metavar="URL_OR_MODEL", help="instead: the default's decision on a real endpoint (a URL, "
                    "or 0.5b / 1.5b for the embedded model): benchmarks/real_decision.py")
    ap.add_argument("--queries", type=int, default=20, help="with --real: the first N lists")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE", help="with --real: a ranking option")
    args = ap.parse_args()
    if args.real:
        where = ["--model", args.real] if "://" not in args.real else ["--base-url", args.real]
        command = [sys.executable, str(HERE / "real_decision.py"), *where, "--data", args.data, "--queries",
                   str(args.queries), *(x for s in args.set for x in ("--set", s))]
        return subprocess.run(command).returncode
    shapes = list(SHAPES) if args.shapes == "all" else args.shapes.split(",")
    scenarios = (list(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",") if args.scenarios else
                 list(CLASSIC) if shapes == ["fixed"] else list(SCENARIOS))
    unknown = [x for x in shapes if x not in SHAPES] + [x for x in scenarios if x not in SCENARIOS]
    if unknown:
        ap.error(f"unknown shape or scenario: {', '.join(unknown)}")
    classic = shapes == ["fixed"] and set(scenarios) <= set(CLASSIC)
    out = pathlib.Path(args.out or HERE / "results" / ("testbed" if classic else "testbed-traffic"))
    stored = json.loads(_file(out, ".json").read_text()) if _file(out, ".json").is_file() and not args.fresh else {}
    rows = [Row(**r) for r in stored.get("rows", [])]
    methods = {m: METHODS[m] for m in args.methods.split(",")}
    loaded = {shape: bench_lists(args.data, SHAPE_TOP[shape])[:args.lists] for shape in shapes}
    meta = stored.get("meta", {"draws": args.draws, "lists": len(loaded[shapes[0]]), "seed": args.seed, "methods": methods})
    s_values = [float(x) for x in args.s.split(",")]
    todo = [(shape, name, s) for shape in shapes for name in scenarios for s in s_values
            if not any((r.shape, r.scenario, r.s) == (shape, name, s) for r in rows)]
    total = 0.0
    for shape in dict.fromkeys(c[0] for c in todo):
        cells = [c for c in todo if c[0] == shape]
        seconds, _ = estimate(loaded[shape], scenarios=[cells[0][1]], s_values=[cells[0][2]], draws=args.draws,
                              methods=methods, shape=shape, seed=args.seed)
        total += seconds * len(cells)
        print(f"{shape}: {len(cells)} cells to run, about {seconds * len(cells) / 60:.0f} min", file=sys.stderr, flush=True)
    print(f"about {total / 60:.0f} min in all (a few lists timed per shape)", file=sys.stderr, flush=True)
    for shape, name, s in todo:
        start = time.perf_counter()
        rows += measure(loaded[shape], scenarios=[name], s_values=[s], draws=args.draws, seed=args.seed, methods=methods,
                        progress=lambda line: print(line, file=sys.stderr, flush=True), shape=shape)
        print(f"{shape} {name} s={s:g}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        _write(out, rows, meta)
    _write(out, rows, meta)
    if classic and args.out is None:  # RESULTS.md reads results/testbed.json only
        _results_md()
    print(_file(out, ".md").read_text())
    return 0


def _write(out: pathlib.Path, rows: list[Row], meta: dict) -> None:
    order = {n: i for i, n in enumerate(SCENARIOS)}
    shapes = {n: i for i, n in enumerate(SHAPES)}
    methods = {m: i for i, m in enumerate(meta["methods"])}
    rows = sorted(rows, key=lambda r: (shapes.get(r.shape, 99), order.get(r.scenario, 99), r.s, methods.get(r.method, 99),
                                       r.method))
    traffic = any(r.shape != "fixed" or r.scenario not in CLASSIC for r in rows)
    _file(out, ".json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    per_list = {m: sum(r.seconds for r in rows if r.method == m) / max(1, sum(r.method == m for r in rows))
                for m in methods}
    text = [
        "# The testbed: the library's methods on a simulated reranker with known signal and bias",
        "",
        "A test instrument: what the library's rules do on a reranker whose content signal `s` (logits per",
        "relevance grade) and slot bias are known, not what a real model does. Regenerate with",
        "`python benchmarks/testbed.py` (see its docstring and `capcal_integrations/testbed`).",
        "",
        f"{meta['lists']} DL19 {'' if traffic else 'top-20 '}lists x {meta['draws']} draws (simulated models) per scenario and s;"
        " nDCG@10",
        "(trec_eval's) averaged over lists and draws, ± its standard error over draws; `reads share`: the share of",
        "the method's content decisions that said the model reads.",
        *(["", "Issue 22's shapes of real traffic (a cell is `scenario / shape` unless the shape is `fixed`): "
           + "; ".join(f"`{k}` = {v}" for k, v in SHAPES.items()) + ". Scenarios: " + "; ".join(
               f"`{n}`" for n in SCENARIOS) + " (capcal_integrations/testbed/model.py). `capcal-best` is reported only"
           " where every list is one window."] if traffic else []),
        "",
        "Methods: " + "; ".join(f"`{m}` = {'BM25 order' if o is None else (o or 'the default options')}"
                                for m, o in meta["methods"].items())
        + "; `capcal-best` = CapCal at the best fixed alpha of " + ", ".join(f"{a:g}" for a in IMPLIED_ALPHAS)
        + " in hindsight (rankings implied by capcal-1's first steps: the testbed answers every later step"
        " with the first step's distributions restricted to the labels left).",
        "",
        "nDCG@10 per scenario and s:",
        "",
        pivot(rows),
        "",
        "Every row, with standard errors and `reads share`:",
        "",
        table(rows),
        "",
        "## Issue 22's conditions on the default",
        "",
        "`reads` is the share of the default's decisions (one per draw: a fresh reranker decides over the lists as they",
        "come, `check_wait=True` so that the run is reproducible) that the model reads. While it decides, the default",
        "keeps each list's given order; rows `X@decided` are method X over the lists ranked after the default's decision.",
        "",
        *checks(rows),
        "",
        "## Cost per list (the simulated server's counts; its tokenizer is word-level, so compare ratios)",
        "",
        *costs(rows),
        "",
        "Time per ranking (2 shared cores, the whole library path against the in-process server): "
        + ", ".join(f"{m} {v * 1000:.0f} ms" for m, v in per_list.items() if v) + ".",
        "",
    ]
    _file(out, ".md").write_text("\n".join(text))


def _results_md() -> None:
    """Regenerate benchmarks/RESULTS.md, whose testbed section reads the JSON just written."""
    done = subprocess.run([sys.executable, str(HERE / "run_benchmark.py"), "--report-only"], capture_output=True,
                          text=True)
    if done.returncode:
        print(f"benchmarks/RESULTS.md not regenerated: {done.stderr[-2000:]}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
