"""Two llama.cpp replicas behind vllm-router (consistent_hash): with and without the routing key.

    python benchmarks/router.py [--data ../shared/data/beir-scifact-test] [--queries 4] [--passages 5]

A fixed set of lists (the first ``--queries`` SciFact queries, BM25 top ``--passages``, 40 words each),
ranked with method capcal one list after another, four ways, each on freshly started servers (empty
prompt caches): directly on one server (the library's default: mixed prompts, slot pins), directly on
one server as ``routed=True`` sends (token-id prompts, no slot pins: what the router runs cost on one
server), through the router with the per-list key (``routed=True``, the default ``X-Session-ID``), and
through the router without a key (``routing_header=None``). Per way: requests (as the library counts them, and as the
servers received them), servers per list, prompt tokens the servers evaluated (from their own logs:
tokens not found in their prompt cache), cached prompt tokens (``usage.prompt_tokens_details``: llama.cpp
reports the first prompt of each prompt list), wall time, and whether each ranking equals the direct
one. Writes ``benchmarks/results/router.json`` and ``router.md``.

The two replicas share this machine's 2 CPU cores (one thread each), so the wall-time ratio shows
locality (prompt tokens recomputed), not capacity: on separate machines the keyless run would also
spread load, and the keyed run would need more lists than replicas to use them all.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import platform
import signal
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.testing.router import Rig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WAYS = {
    "one server, direct": None,
    "one server, direct, routed=True (no slot pins)": {"routed": True, "direct": True},
    "router, per-list key": {"routed": True},
    "router, no key": {"routed": True, "routing_header": None},
}


def lists(data: pathlib.Path, queries: int, passages: int) -> list[tuple[str, list[str]]]:
    out = []
    with gzip.open(data / "candidates.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            out.append((row["query"], [" ".join(f"{c.get('title', '')}. {c['text']}".split()[:40])
                                       for c in row["candidates"][:passages]]))
            if len(out) == queries:
                return out
    return out


def run_way(name: str, settings: dict | None, todo: list[tuple[str, list[str]]]) -> dict:
    settings = dict(settings or {})
    direct = settings.pop("direct", not settings)
    with Rig() as rig:
        url = rig.backends[0] if direct else rig.url
        rr = CapCalReranker(base_url=url, api_key="none", method="capcal", max_passage_words=40, **settings)
        rr.capabilities()  # the probe is not part of the lists' cost
        per_list, started = [], time.monotonic()
        for query, passages in todo:
            mark, t0 = rig.mark(), time.monotonic()
            ranking = rr.rerank(query, passages)
            seconds = time.monotonic() - t0
            time.sleep(0.5)  # the servers' last log lines
            seen, tasks = rig.since(mark), rig.tasks(mark)
            per_list.append({
                "order": list(ranking.order), "scores": list(ranking.scores), "seconds": round(seconds, 2),
                "requests": ranking.usage.requests, "cached_tokens": ranking.usage.cached_tokens,
                "prompt_tokens_reported": ranking.usage.prompt_tokens,
                # direct runs bypass the proxies: the servers' logs say where the prompts ran
                "servers_by_requests": None if direct else len({s.backend for s in seen}),
                "requests_seen": None if direct else len(seen),
                "servers_by_prompts": sum(bool(t) for t in tasks),
                "prompts_run": sum(len(t) for t in tasks), "tokens_evaluated": sum(sum(t) for t in tasks)})
        wall = time.monotonic() - started
    return {"way": name, "wall_seconds": round(wall, 1), "lists": per_list}


def table(results: list[dict]) -> str:
    direct = results[0]["lists"]
    head = ("| way | requests (library) | requests at the servers | servers per list | prompts run | prompt tokens "
            "evaluated | cached prompt tokens (usage) | wall time | orders equal to direct | largest score gap |\n"
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for r in results:
        ls = r["lists"]
        at_servers = sum(x["requests_seen"] for x in ls) if ls[0]["requests_seen"] is not None else None
        spread = ", ".join(str(x["servers_by_prompts"]) for x in ls)
        equal = sum(x["order"] == d["order"] for x, d in zip(ls, direct))
        gap = max(abs(a - b) for x, d in zip(ls, direct) for a, b in zip(x["scores"], d["scores"]))
        rows.append(f"| {r['way']} | {sum(x['requests'] for x in ls)} | {at_servers or '-'} | {spread} | "
                    f"{sum(x['prompts_run'] for x in ls)} | {sum(x['tokens_evaluated'] for x in ls)} | "
                    f"{sum(x['cached_tokens'] for x in ls)} | {r['wall_seconds']:.0f} s | {equal}/{len(ls)} | {gap:.3f} |")
    return "\n".join([head, *rows])


def measure(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    todo = lists(args.data, args.queries, args.passages)
    results = []
    for name, settings in WAYS.items():
        sys.stderr.write(f"router benchmark: {name}...\n")
        results.append(run_way(name, settings, todo))
        sys.stderr.write(f"  {results[-1]['wall_seconds']} s\n")
    import vllm_router.version as router_version

    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, 2 shared cores",
            "router": f"vllm-router {router_version.__version__} --policy consistent_hash", "model": "0.5b (llama.cpp, "
            "one thread and 4 slots per replica)", "lists": len(todo), "passages": args.passages, "method": "capcal"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "router.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return meta, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=pathlib.Path, default=ROOT.parent / "shared" / "data" / "beir-scifact-test")
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--passages", type=int, default=5)
    parser.add_argument("--report-only", action="store_true", help="rewrite router.md from router.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the servers and the router are stopped
    if args.report_only:
        stored = json.loads((RESULTS / "router.json").read_text())
        meta, results = stored["meta"], stored["results"]
    else:
        meta, results = measure(args)
    md = [
        "# Two replicas behind vllm-router: with and without the routing key",
        "",
        f"{meta['date']}; {meta['router']}; two llama.cpp servers ({meta['model']}) on one machine ({meta['machine']}); "
        f"{meta['lists']} SciFact lists of {meta['passages']} passages (40 words each), method capcal, one list after "
        "another; each way on freshly started servers. `python benchmarks/router.py` regenerates this.",
        "",
        table(results),
        "",
        "- *servers per list*: how many servers ran a list's completion prompts (their own logs), per list.",
        "- *prompt tokens evaluated*: the prompt tokens the servers computed (not found in their prompt cache), "
        "from their logs: the measure of locality. *cached prompt tokens*: what "
        "`usage.prompt_tokens_details.cached_tokens` reported; llama.cpp reports the first prompt of each prompt "
        "list only, so the first row (prompt lists) counts a fraction of its prompts and the others (one prompt per "
        "request) count all.",
        "- *routed=True* sends no llama.cpp slot pins (a slot number means nothing across servers) and token-id "
        "prompts one by one, so that llama.cpp puts each in the slot that holds its prefix; the second row is that on "
        "one server, apart from any router: about the prompt tokens of the pinned prompt lists, in more requests. (Sent "
        "as prompt lists without pins, a first run computed 16399 prompt tokens through the router with the key, "
        "18794 without: llama.cpp ran a list's prompts in all its idle slots, each computing the whole prompt.)",
        "- *largest score gap*: the largest difference of a passage's score from the direct run (orders that differ "
        "differ at near-ties; llama.cpp's log-probabilities drift with the cache state).",
        "- The two replicas share the same 2 CPU cores, so the wall-time ratio shows locality (prompt tokens "
        "recomputed), not capacity.",
    ]
    (RESULTS / "router.md").write_text("\n".join(md) + "\n")
    sys.stdout.write("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
