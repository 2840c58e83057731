"""The default against the best fixed method after its decision, from two testbed runs on the same draws.

``benchmarks/testbed.py`` seeds every draw by (seed, scenario, s, draw), so two runs of it see the same simulated
models and lists. This joins a run with every method (the fixed methods' nDCG@10 over the lists ranked after the
default's decision, ``<method>@decided``) and a run of the default alone (after a change that moves only its
``alpha``, not its decision), and writes the table issue 22 asks for: per cell, the default's nDCG@10 over the whole
run and after its decision, the best fixed method after it, and the gap::

    python benchmarks/after_decision.py benchmarks/results/testbed-query.json \\
        benchmarks/results/testbed-query-margin.json --out benchmarks/results/after-decision.md
"""

from __future__ import annotations

import argparse
import json
import pathlib

FIXED = ("bm25", "vanilla", "capcal-adaptive", "capcal-1", "capcal-best")


def _ndcg(path: str) -> dict[tuple, float]:
    """nDCG@10 by (scenario, s, shape, method) of one testbed JSON."""
    return {(r["scenario"], r["s"], r["shape"], r["method"]): r["ndcg10"]
            for r in json.loads(pathlib.Path(path).read_text())["rows"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("every", help="a testbed JSON with the fixed methods (and their @decided rows)")
    ap.add_argument("default", help="a testbed JSON with the default's rows (the same cells and seeds)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows, mine = _ndcg(a.every), _ndcg(a.default)
    lines = [f"# The default after its decision against the best fixed method (`python benchmarks/after_decision.py "
             f"{a.every} {a.default}`)", "",
             "nDCG@10 on the testbed's DL19 lists, the same draws in both runs. `whole`: every list, the deciding phase "
             "included; `after`: the lists ranked after the decision; `best fixed after`: the best of "
             f"{', '.join(FIXED)} over the same lists. Goal (issue 22): `after` within .01 of `best fixed after` at "
             "s >= .5; at s = 0 `whole` within .005 of BM25.", "",
             "| scenario | shape | s | bm25 | default, whole | default, after | best fixed after | gap |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (scenario, s, shape, method), whole in mine.items():
        if method != "default" or (scenario, s, shape, "bm25") not in rows:
            continue
        after = mine.get((scenario, s, shape, "default@decided"))
        best = max((rows[k] for k in ((scenario, s, shape, f"{m}@decided") for m in FIXED) if k in rows), default=None)
        gap = "" if after is None or best is None else f"{after - best:+.4f}"
        lines.append(f"| {scenario} | {shape} | {s:g} | {rows[(scenario, s, shape, 'bm25')]:.4f} | {whole:.4f} | "
                     f"{'' if after is None else f'{after:.4f}'} | {'' if best is None else f'{best:.4f}'} | {gap} |")
    text = "\n".join(lines) + "\n"
    if a.out:
        pathlib.Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
