"""What a list costs on a real server, once the content check has decided, against vanilla.

    python benchmarks/content_cost.py --base-url http://127.0.0.1:8091/v1 [--lists 6] [--set probability=trie]

Side by side on the same server and the same DL19 BM25 top-20 lists, three ways of ranking a list:

- ``vanilla``;
- ``decided, reads``: what the default costs per list once it has decided that the model reads: the real and
  the empty prompt only (``guard=None`` runs exactly that decoding, at ``alpha`` 1);
- ``deciding``: what one query's readings for the check cost (a fresh reranker per list with
  ``check_wait=True``, so the readings are taken inside the ranking and counted in its usage; the list itself
  keeps its given order): its top window's first step in four orders and the empty prompt's. By default these
  readings are taken off the request path, so no user waits for them; this measures the server's work.

Every ranking gets a fresh reranker, probed before it ranks (so the probe is outside its usage, and the
``deciding`` list is always a check's first query). The methods take turns going first
on each list (rotated), so that each pays the cold prefill of the list on
some lists and finds it in llama.cpp's prompt cache on others. ``prompt tokens`` is what the server reports
(cached included, independent of the order); ``cold uncached`` is the mean of the server's uncached prompt
tokens over the lists where the method went first. The one-off cost of a decision is the deciding queries'
readings: about 10 queries for a model that reads, 17 to the cap of 40 for one that does not
(``benchmarks/results/decisions.md``). (Once decided that a model does *not* read, a list costs nothing: it
keeps its given order.) Writes benchmarks/results/content-cost.json and .md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from capcal_integrations import CapCalReranker
from capcal_integrations.options import Options
from capcal_integrations.testbed.measure import bench_lists

HERE = pathlib.Path(__file__).parent
DATA = pathlib.Path("/work/shared/data/trec-dl19-passage")
WAYS = ("vanilla", "decided, reads", "deciding")


def _reranker(way: str, url: str, options: dict) -> CapCalReranker:
    if way == "vanilla":
        return CapCalReranker(base_url=url, timeout=600, method="vanilla", **options)
    if way == "decided, reads":
        return CapCalReranker(base_url=url, timeout=600, method="capcal", guard=None, alpha=1.0, **options)
    return CapCalReranker(base_url=url, timeout=600, check_wait=True, **options)  # fresh: its check reads this list


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--lists", type=int, default=6)
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE", help="a ranking option for all")
    ap.add_argument("--out", default=str(HERE / "results" / "content-cost"))
    args = ap.parse_args()
    options = {k: Options.parse(k, v) for k, v in (x.split("=", 1) for x in args.set)}
    lists = bench_lists(args.data)[:args.lists]
    runs: dict[str, list[dict]] = {w: [] for w in WAYS}
    for k, b in enumerate(lists):
        turn = WAYS[k % 3:] + WAYS[:k % 3]
        for j, way in enumerate(turn):
            rr = _reranker(way, args.base_url, options)
            rr.capabilities()  # the probe, outside the ranking's usage
            start = time.perf_counter()
            r = rr.rerank(b.query, list(b.passages))
            u = r.usage
            runs[way].append({"list": k, "first": j == 0, "requests": u.requests, "prompt_tokens": u.prompt_tokens,
                              "uncached": u.prompt_tokens - u.cached_tokens, "seconds": time.perf_counter() - start,
                              "checked": list(r.checked), "steps": len(r.steps)})
            print(f"list {k} {way}: {runs[way][-1]}", file=sys.stderr, flush=True)

    def mean(way: str, field: str, first: bool | None = None) -> float:
        xs = [x[field] for x in runs[way] if first is None or x["first"] == first]
        return sum(xs) / len(xs) if xs else float("nan")

    base_tokens, base_cold, base_req = mean("vanilla", "prompt_tokens"), mean("vanilla", "uncached", True), mean(
        "vanilla", "requests")
    rows = ["| per list | requests | × vanilla | prompt tokens | × vanilla | cold uncached prompt tokens | × vanilla |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for way in WAYS:
        req, tok, cold = mean(way, "requests"), mean(way, "prompt_tokens"), mean(way, "uncached", True)
        rows.append(f"| {way} | {req:.1f} | {req / base_req:.2f} | {tok:,.0f} | {tok / base_tokens:.2f} | "
                    f"{cold:,.0f} | {cold / base_cold:.2f} |")
    extra = {f: mean("deciding", f) for f in ("requests", "prompt_tokens")}
    extra_cold = mean("deciding", "uncached", True)
    result = {"base_url": args.base_url, "lists": len(lists), "options": {k: str(v) for k, v in options.items()},
              "runs": runs, "readings_per_query": {**extra, "cold_uncached": extra_cold}}
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    model = _reranker("vanilla", args.base_url, options).capabilities().model
    out.with_suffix(".md").write_text("\n".join([
        f"# What a list costs once the content check has decided ({model} at {args.base_url})", "",
        f"{len(lists)} DL19 BM25 top-20 lists, the three ways taking turns going first (see "
        f"`benchmarks/content_cost.py`); options {options or 'the defaults'}.", "", *rows, "",
        f"One deciding query's readings: {extra['requests']:.0f} requests and {extra['prompt_tokens']:,.0f} prompt tokens "
        f"({extra_cold:,.0f} uncached on a cold list), off the request path by default. A decision takes about 10 "
        "queries for a model that reads, 17 up to the cap of 40 for one that does not (benchmarks/results/decisions.md). "
        "A model decided not to read costs nothing per list after that (its lists keep their given order).", ""]))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
