"""A chat turn's budget: vanilla and CapCal, each at full depth and at depth 5, side by side in one run.

    python benchmarks/chat_budget.py --queries 5              # embedded servers, started here
    python benchmarks/chat_budget.py --base-url URL [URL ...]   # running servers, one per configuration

DL19 BM25 top-20 (``../shared/data/trec-dl19-passage``). For each query the four configurations run back to
back, so that a noisy shared machine slows them alike, each on its own embedded llama.cpp server (four are
started here): every configuration meets each query's prompts cold, as a chat turn with newly retrieved
passages does. On one server they would not: vanilla and CapCal share the real prompt, and the server's
prompt cache would hand it to whichever ran second (and llama.cpp erases a slot only when started with a
slot save path). One ``--base-url`` for all four measures that warm case instead.

Per configuration: wall time, HTTP requests, prompt/completion/cached tokens per list, decoding steps,
nDCG@5 (and nDCG@10, where the places below the depth count in their stated order) and, for depth 5,
whether its top 5 and its steps are those of the full decoding. The guard is off (``guard=None``: every
list is calibrated, so CapCal's cost is measured, not the content check's). Writes
benchmarks/results/chat-budget.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.evaluation.data import load_dataset  # noqa: E402

HERE = pathlib.Path(__file__).parent
CONFIGS = [("vanilla", None), ("vanilla", 5), ("capcal", None), ("capcal", 5)]


def ndcg(ranked: list[str], grades: dict[str, int], k: int) -> float:
    """trec_eval's nDCG@k (linear gains, log2 discount), ideal from all judged passages of the query.

    >>> round(ndcg(["a", "b", "c"], {"b": 2, "c": 1}, 2), 4)  # (0 + 2/log2(3)) / (2 + 1/log2(3))
    0.4796
    """
    import math

    dcg = sum(grades.get(d, 0) / math.log2(r + 2) for r, d in enumerate(ranked[:k]))
    ideal = sorted(grades.values(), reverse=True)[:k]
    best = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
    return dcg / best if best else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--base-url", nargs="+", help="running servers: one per configuration, or one for all (warm)")
    ap.add_argument("--out", default=str(HERE / "results" / "chat-budget"))
    ap.add_argument("--from-log", help="summarise the rows a run printed (one JSON object per line) and stop")
    args = ap.parse_args()
    configs = [(m, None if d is None else args.depth) for m, d in CONFIGS]
    data = load_dataset(args.data).select(args.queries)
    grades = data.grades()
    if args.from_log:
        rows = [json.loads(line) for line in open(args.from_log, encoding="utf-8") if line.startswith('{"qid"')]
        meta = {"server": "llama.cpp", "model": "local", "transport": "completions", "cache": "cold (one server per "
                "configuration)", "note": f"summarised from the rows printed by a run cut short ({args.from_log})"}
        write(args, configs, data, grades, rows, meta)
        return
    with contextlib.ExitStack() as stack:
        urls, key = args.base_url, os.environ.get("OPENAI_API_KEY")
        if not urls:
            from capcal_integrations.server import EmbeddedServer

            servers = [stack.enter_context(EmbeddedServer(model="0.5b", n_parallel=4, api_key="chat-budget"))
                       for _ in configs]
            urls, key = [s.base_url for s in servers], "chat-budget"
        rerankers = [CapCalReranker(base_url=urls[k % len(urls)], api_key=key, guard=None, method=method, depth=depth)
                     for k, (method, depth) in enumerate(configs)]
        caps = [rr.capabilities() for rr in rerankers][0]
        rows = []
        for topic in data.topics:
            passages = [c.text for c in topic.candidates[:args.top]]
            docids = [c.docid for c in topic.candidates[:args.top]]
            runs = {}
            for rr, (method, depth) in zip(rerankers, configs):
                started = time.perf_counter()
                ranking = rr.rerank(topic.query, passages)
                seconds = time.perf_counter() - started
                runs[(method, depth)] = ranking
                ranked = [docids[i] for i in ranking.order]
                row = {"qid": topic.qid, "method": method, "depth": depth, "seconds": round(seconds, 2),
                       "requests": ranking.usage.requests, "prompt_tokens": ranking.usage.prompt_tokens,
                       "completion_tokens": ranking.usage.completion_tokens,
                       "cached_tokens": ranking.usage.cached_tokens, "steps": len(ranking.steps),
                       "decoded": ranking.decoded, "ndcg5": round(ndcg(ranked, grades.get(topic.qid, {}), 5), 4),
                       "ndcg10": round(ndcg(ranked, grades.get(topic.qid, {}), 10), 4), "order": list(ranking.order)}
                if depth is not None:
                    full = runs[(method, None)]
                    row["same_top"] = ranking.order[:depth] == full.order[:depth]
                    row["same_steps"] = [s.chosen for s in ranking.steps] == [s.chosen for s in full.steps[:depth]]
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "order"}), flush=True)
            meta = {"server": caps.server, "model": caps.model, "transport": caps.transport,
                    "cache": "cold (one server per configuration)" if len(set(urls)) == len(configs)
                    else "shared between configurations (warm)"}
            write(args, configs, data, grades, rows, meta)  # after each query: a run cut short keeps what it measured


def write(args: argparse.Namespace, configs: list, data, grades: dict, rows: list[dict], meta: dict) -> None:
    """The summary of ``rows`` (the queries measured in all four configurations) to --out .json and .md."""
    done = [q for q in dict.fromkeys(r["qid"] for r in rows) if sum(r["qid"] == q for r in rows) == len(configs)]
    rows = [r for r in rows if r["qid"] in done]
    topics = [t for t in data.topics if t.qid in done]
    bm25 = {t.qid: ndcg([c.docid for c in t.candidates[:args.top]], grades.get(t.qid, {}), 5) for t in topics}
    if not rows:
        return
    summary = []
    for method, depth in configs:
        mine = [r for r in rows if r["method"] == method and r["depth"] == depth]
        entry = {"method": method, "depth": depth or args.top}
        for name in ("seconds", "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "steps",
                     "ndcg5", "ndcg10"):
            entry[name] = round(statistics.fmean(r[name] for r in mine), 4 if name.startswith("ndcg") else 1)
        entry["seconds_median"] = round(statistics.median(r["seconds"] for r in mine), 2)
        if depth is not None:
            entry["same_top"] = f"{sum(r['same_top'] for r in mine)}/{len(mine)}"
            entry["same_steps"] = f"{sum(r['same_steps'] for r in mine)}/{len(mine)}"
        summary.append(entry)
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores "
              f"(shared), load average {os.getloadavg()[0]:.1f} at the end", **meta,
              "data": pathlib.Path(args.data).name, "top": args.top, "guard": None,
              "queries": done, "bm25_ndcg5": round(statistics.fmean(bm25.values()), 4),
              "summary": summary, "rows": rows}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(report(result))
    print(report(result))


def report(result: dict) -> str:
    lines = [f"# A chat turn's budget ({result['date']})", "",
             f"{result['data']}, BM25 top-{result['top']}, {len(result['queries'])} queries; {result['server']} "
             f"server, model `{result['model']}`, transport `{result['transport']}`; prompt caches "
             f"{result['cache']}; guard=None. Machine: {result['machine']}. Per list (means; time also median):", "",
             "| method | depth | s / list | median s | requests | prompt tokens | completion tokens | cached tokens | "
             "steps | nDCG@5 | nDCG@10 | top = full's | steps = full's |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|"]
    for e in result["summary"]:
        lines.append(f"| {e['method']} | {e['depth']} | {e['seconds']} | {e['seconds_median']} | {e['requests']} | "
                     f"{e['prompt_tokens']:.0f} | {e['completion_tokens']:.0f} | {e['cached_tokens']:.0f} | {e['steps']} | "
                     f"{e['ndcg5']:.4f} | {e['ndcg10']:.4f} | {e.get('same_top', '')} | {e.get('same_steps', '')} |")
    lines += ["", f"BM25 nDCG@5 on these queries: {result['bm25_ndcg5']:.4f}. nDCG@10 at depth 5 counts places 6-10 "
              "in the order stated for them (the last decoded step's scores), not decoded.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
