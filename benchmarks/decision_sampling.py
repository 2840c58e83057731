"""How much the content check's decision depends on which lists come first, on a real model.

    python benchmarks/decision_sampling.py --base-url URL [--queries 20] [--out benchmarks/results/decision-sampling-1.5b]
    python benchmarks/decision_sampling.py --readings benchmarks/results/decision-sampling-1.5b.json   # reuse

Every DL19 BM25 top-20 list's first step is read twice (method first-token, no calibration): as given and
with its halves swapped, the two readings the check pools (:mod:`capcal_integrations.contrast`). Then, for
random sets of ``k`` lists (``k`` = 8, the default ``check_lists``, and more), the share of sets whose
slot-paired contrast passes at the check's level (and at a stricter one): the chance that a deployment
whose first ``k`` lists are such a set decides "reads". Sets of one size overlap (they are drawn from the same
lists), so the shares are estimates for this data, not independent trials. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import sys

from capcal_integrations.content_check import LEVEL
from capcal_integrations.contrast import Reading, halves_swapped, paired_contrast
from capcal_integrations.testbed.measure import bench_lists

HERE = pathlib.Path(__file__).parent
DATA = pathlib.Path("/work/shared/data/trec-dl19-passage")
SIZES, LEVELS, SETS = (8, 12, 16), (LEVEL, LEVEL / 10), 200


def read(url: str, data: str, queries: int | None) -> list[Reading]:
    from capcal_integrations import CapCalReranker

    first = CapCalReranker(base_url=url, timeout=600, method="first-token", guard=None)
    out = []
    for k, b in enumerate(bench_lists(data)[:queries]):
        swap = halves_swapped(len(b.passages))
        given = first.rerank(b.query, list(b.passages)).steps[0].p
        swapped = first.rerank(b.query, [b.passages[i] for i in swap]).steps[0].p
        out.append(Reading(tuple(math.log(max(x, 1e-300)) for x in given),
                           tuple(math.log(max(x, 1e-300)) for x in swapped)))
        print(f"readings {k}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url")
    ap.add_argument("--readings", help="a JSON this script wrote: analyse its readings again")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--out", default=str(HERE / "results" / "decision-sampling"))
    args = ap.parse_args()
    if args.readings:
        stored = json.loads(pathlib.Path(args.readings).read_text())
        readings, model = [Reading(tuple(r), tuple(s)) for r, s in stored["readings"]], stored["model"]
    elif args.base_url:
        from capcal_integrations import CapCalReranker

        model = CapCalReranker(base_url=args.base_url).capabilities().model
        readings = read(args.base_url, args.data, args.queries)
    else:
        ap.error("give --base-url or --readings")
    rng = random.Random(0)
    pooled = paired_contrast(readings)
    rows = []
    for k in (size for size in SIZES if size <= len(readings)):
        sets = [paired_contrast(rng.sample(readings, k), permutations=999) for _ in range(SETS)]
        rows.append({"lists": k, **{f"pass_at_{level:g}": sum(c.p_value <= level for c in sets) / SETS
                                    for level in LEVELS}})
    out = pathlib.Path(args.out)
    (out.parent / (out.name + ".json")).write_text(json.dumps({
        "model": model, "lists": len(readings), "pooled": vars(pooled), "rows": rows,
        "readings": [[list(r.real), list(r.swapped)] for r in readings]}, indent=1) + "\n")
    table = ["| lists per decision | " + " | ".join(f"sets passing at {level:g}" for level in LEVELS) + " |",
             "|---:|" + "---:|" * len(LEVELS)]
    table += [f"| {r['lists']} | " + " | ".join(f"{r[f'pass_at_{level:g}']:.1%}" for level in LEVELS) + " |"
              for r in rows]
    (out.parent / (out.name + ".md")).write_text("\n".join([
        f"# How much the content check's decision depends on the lists it sees ({model})", "",
        f"{len(readings)} DL19 BM25 top-20 lists, each read as given and with its halves swapped at the first step; "
        f"over all of them the slot-paired contrast gives p = {pooled.p_value:.3g} (content/noise {pooled.ratio:.2f}). "
        f"{SETS} random sets per size (overlapping: estimates for these lists):", "", *table, ""]))
    print((out.parent / (out.name + ".md")).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
