"""``rerank`` against ``arerank`` for the same calibrated ranking, alternated on one server (issue 35).

``floor.py`` times capcal through ``rerank`` and then through ``arerank`` on each list, always in that order; on 4 of
its 10 lists ``rerank`` took 8-10 s more. Here each list is ranked by both, alternating, ``--repeats`` times each,
every time with a fresh salt in the passages; the empty prompt (every passage a placeholder) is the same for every
ranking of a query, so whichever runs first computes it and the next ones may find it cached. Per ranking: seconds,
requests and uncached prompt tokens. Writes ``benchmarks/results/sync-async.md`` and ``.json``.

    python benchmarks/sync_async.py --data ../shared/data/trec-dl19-passage [--lists 2,6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.testbed.measure import bench_lists  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a dataset folder, e.g. ../shared/data/trec-dl19-passage")
    ap.add_argument("--lists", default="2,6", help="the lists' indices (floor-35's slow ones: 2,6)")
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "sync-async"))
    ap.add_argument("--report", action="store_true", help="rewrite the .md from the saved .json, nothing run")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    if args.report:
        saved = json.loads(out.with_suffix(".json").read_text())
        return _write(out, argparse.Namespace(**saved["args"]), saved["rows"])
    from capcal_integrations.server.launcher import endpoint

    lists = bench_lists(args.data)
    rows = []
    with endpoint(None, "0.5b") as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, timeout=3600, guard=None,
                            method="capcal")
        rr.capabilities()
        for k in (int(x) for x in args.lists.split(",")):
            b = lists[k]
            for turn in range(2 * args.repeats):
                how = ("rerank", "arerank")[turn % 2]
                salt = f" ({random.randrange(10 ** 12)})"
                passages = [p + salt for p in list(b.passages)[:args.passages]]
                started = time.perf_counter()
                ranking = (asyncio.run(rr.arerank(b.query, passages)) if how == "arerank"
                           else rr.rerank(b.query, passages))
                u = ranking.usage
                rows.append({"list": k, "turn": turn, "how": how, "s": round(time.perf_counter() - started, 2),
                             "requests": u.requests, "uncached_tokens": u.prompt_tokens - u.cached_tokens})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    return _write(out, args, rows)


def _write(out: pathlib.Path, args: argparse.Namespace, rows: list[dict]) -> int:
    pairs = [(a, b) for a, b in zip(rows[::2], rows[1::2])]  # each rerank and the arerank right after it
    lines = ["# `rerank` against `arerank`, alternated (issue 35)", "",
             f"`python benchmarks/sync_async.py --data {args.data} --lists {args.lists} --repeats {args.repeats}`: "
             "the packaged 0.5B on the embedded llama.cpp server, capcal (`guard=None`), each list ranked by "
             "`rerank` and `arerank` in turn, a fresh salt every time.", "",
             "| list | turn | driver | seconds | requests | uncached prompt tokens |", "|---:|---:|---|---:|---:|---:|"]
    lines += [f"| {r['list']} | {r['turn']} | `{r['how']}` | {r['s']:.1f} | {r['requests']} | {r['uncached_tokens']} |"
              for r in rows]
    first = [b["s"] - a["s"] for a, b in pairs if a["turn"] == 0]
    later = [b["s"] - a["s"] for a, b in pairs if a["turn"] > 0]
    lines += ["", "`arerank` minus the `rerank` just before it, seconds: in each list's first pair (its `rerank` computes "
              f"the query's empty prompt) {', '.join(f'{d:+.1f}' for d in first)}; in the later pairs "
              f"{', '.join(f'{d:+.1f}' for d in later)}"
              + (f" (median {statistics.median(later):+.1f})." if later else ".")]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
