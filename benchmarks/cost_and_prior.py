"""Wall time per query (vanilla, capcal, psc), HTTP requests per decoding step, and the empty-prompt prior.

    python benchmarks/cost_and_prior.py --data ../shared/data/trec-dl19-passage --queries 5 [--base-url URL]

Runs the methods for the same query back to back on one server (so the ratios are like for like on a
shared, noisy machine), and writes benchmarks/results/cost_and_prior.json and .md. Without --base-url it
starts the embedded Qwen2.5-Coder-0.5B server.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import pathlib
import statistics
import time

from capcal_integrations import CapCalReranker

HERE = pathlib.Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data/trec-dl19-passage")
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--methods", default="vanilla,capcal,psc")
    ap.add_argument("--base-url")
    ap.add_argument("--out", default=str(HERE / "results" / "cost_and_prior"))
    args = ap.parse_args()
    with gzip.open(pathlib.Path(args.data) / "candidates.jsonl.gz", "rt", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f][: args.queries]
    with contextlib.ExitStack() as stack:
        url = args.base_url
        if not url:
            from capcal_integrations.server import EmbeddedServer

            url = stack.enter_context(EmbeddedServer(model="0.5b")).base_url
        rr = CapCalReranker(base_url=url)
        caps = rr.capabilities()
        rows, priors = [], []
        for q in queries:
            passages = [c["text"] for c in q["candidates"][: args.top]]
            for method in args.methods.split(","):
                start = time.perf_counter()
                r = rr.with_options(method=method).rerank(q["query"], passages)
                seconds = time.perf_counter() - start
                decode_steps = len(r.steps) if r.steps else (args.top - 1) * rr.options.m
                rows.append({"qid": q["qid"], "method": method, "seconds": round(seconds, 2),
                             "requests": r.usage.requests, "decode_steps": decode_steps,
                             "requests_per_step": round(r.usage.requests / max(decode_steps, 1), 2),
                             "prompt_tokens": r.usage.prompt_tokens, "cached_tokens": r.usage.cached_tokens,
                             "upper_bounds": r.upper_bounds})
                if r.prior:
                    priors.append(r.prior)
                print(json.dumps(rows[-1]), flush=True)
    prior = [statistics.fmean(p[i] for p in priors) for i in range(args.top)] if priors else []
    summary = {}
    for method in args.methods.split(","):
        mine = [r for r in rows if r["method"] == method]
        summary[method] = {"seconds_per_query": round(statistics.fmean(r["seconds"] for r in mine), 2),
                           "requests_per_query": round(statistics.fmean(r["requests"] for r in mine), 1),
                           "requests_per_step": round(statistics.fmean(r["requests_per_step"] for r in mine), 2)}
    base = summary.get("vanilla", {}).get("seconds_per_query")
    for s in summary.values():
        s["time_vs_vanilla"] = round(s["seconds_per_query"] / base, 2) if base else None
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "endpoint": {"server": caps.server, "model": caps.model,
              "transport": caps.transport}, "queries": [q["qid"] for q in queries], "top": args.top,
              "summary": summary, "prior": [round(p, 4) for p in prior], "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Cost and prior ({result['date']}, {len(queries)} queries of {args.data}, top-{args.top})", "",
             f"Endpoint: {caps.server or 'unknown'} server, model `{caps.model}`, transport `{caps.transport}`.", "",
             "| method | s / query | × vanilla | requests / query | requests / decoding step |", "|---|---:|---:|---:|---:|"]
    for m, s in summary.items():
        lines.append(f"| {m} | {s['seconds_per_query']} | {s['time_vs_vanilla']} | {s['requests_per_query']} | "
                     f"{s['requests_per_step']} |")
    lines += ["", "Empty-prompt prior over [1]..[20] at the first step (mean over queries):", "",
              "| " + " | ".join(f"[{i + 1}]" for i in range(len(prior))) + " |", "|" + "---:|" * len(prior),
              "| " + " | ".join(f"{p:.3f}" for p in prior) + " |", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
