"""Which methods run on which kind of endpoint, and what one list costs there.

    python benchmarks/endpoint_kinds.py --data ../shared/data/trec-dl19-passage --queries 5
    python benchmarks/endpoint_kinds.py ... --server-url URL --vllm-url URL     # servers already running

Kinds (the same packaged Qwen2.5-Coder-0.5B throughout):

* ``llamacpp``: llama.cpp's server asked directly (templated prompt lists, any prefix);
* ``hosted-chat``: the same server behind ``HostedGateway("chat")``: chat completions only,
  top_logprobs <= 20, no token ids, no tokenizer or template routes (as OpenAI's);
* ``hosted-completions``: behind ``HostedGateway("completions")``: also a plain ``/v1/completions``
  with text prompts and legacy logprobs (as Together, Fireworks, DeepInfra), with ``prompt="chatml"``
  (Qwen's chat format rendered by the library);
* ``vllm``: vLLM's server (token-id prompt lists, ``logprob_token_ids``), if ``--vllm-url`` is given
  or ``--kinds`` names it (then started here).

The three llama.cpp kinds share one server, started with assistant prefill off (the direct kind never
uses chat prefill). Per (kind, method, query), BM25 top-20: the method that ran (``auto`` resolves),
its requests (the probe excluded), the scoring requests among them, seconds, estimated label
probabilities (``upper_bounds``) and nDCG@10, or the error a method raises there. Writes
``benchmarks/results/endpoint-kinds.json`` and ``.md``; resumes from the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402
import openai  # noqa: E402

from capcal_integrations import CapCalError, CapCalReranker  # noqa: E402
from capcal_integrations.evaluation.data import load_dataset, run_of  # noqa: E402
from capcal_integrations.evaluation.metrics import per_query  # noqa: E402
from capcal_integrations.server import EmbeddedServer, HostedGateway, VllmServer  # noqa: E402

HERE = pathlib.Path(__file__).parent
#: Per kind: (label, options) in the order they run for each query.
PLAN: dict[str, list[tuple[str, dict]]] = {
    "llamacpp": [("auto", {}), ("capcal, unguarded", {"method": "capcal", "guard": None}),
                 ("vanilla", {"method": "vanilla"}), ("first-token", {"method": "first-token"}),
                 ("first-token-capcal", {"method": "first-token-capcal"}), ("psc m=2", {"method": "psc", "m": 2})],
    "hosted-chat": [("auto", {}), ("capcal", {"method": "capcal"}), ("vanilla", {"method": "vanilla"}),
                    ("first-token", {"method": "first-token"}),
                    ("first-token-capcal", {"method": "first-token-capcal"}), ("psc m=2", {"method": "psc", "m": 2})],
    "hosted-completions": [("auto", {"prompt": "chatml"}),
                           ("capcal, unguarded", {"prompt": "chatml", "method": "capcal", "guard": None}),
                           ("first-token-capcal", {"prompt": "chatml", "method": "first-token-capcal"}),
                           ("auto, no client-side format", {})],
    "vllm": [("auto", {}), ("first-token-capcal", {"method": "first-token-capcal"})],
}
SCORING = ("/completions", "/chat/completions")


def _reranker(url: str, options: dict) -> tuple[CapCalReranker, list]:
    sent: list = []
    http = httpx2.Client(event_hooks={"request": [sent.append]}, timeout=3600)
    rr = CapCalReranker(client=openai.OpenAI(base_url=url, api_key="x", http_client=http, max_retries=0), **options)
    rr.capabilities()  # the probe's requests are the endpoint's, not a list's
    return rr, sent


def _rank(rr: CapCalReranker, sent: list, topic, top: int, grades, rel: int) -> dict:
    sent.clear()
    docs = [c.document() for c in topic.candidates[:top]]
    start = time.perf_counter()
    try:
        r = rr.rerank(topic.query, docs)
    except CapCalError as err:
        return {"error": f"{type(err).__name__}: {err}"}
    seconds = time.perf_counter() - start
    ranked = [docs[i].id for i in r.order]
    ndcg = per_query(grades, run_of(topic.qid, ranked), [topic.qid], rel)["nDCG@10"][topic.qid]
    return {"ran": r.method, "requests": r.usage.requests, "scoring": sum(q.url.path.endswith(SCORING) for q in sent),
            "seconds": round(seconds, 2), "upper_bounds": r.upper_bounds, "guarded": len(r.guarded),
            "steps": len(r.steps), "ndcg10": round(ndcg, 4), "notes": list(r.notes)}


def run_kind(kind: str, url: str, data, args: argparse.Namespace, done: dict) -> None:
    rows = done.setdefault("rows", [])
    rerankers: dict[str, tuple[CapCalReranker, list]] = {}  # one per method, shared across lists as in real use
    for topic in data.topics:
        for label, options in PLAN[kind]:
            if any(r["kind"] == kind and r["qid"] == topic.qid and r["label"] == label for r in rows):
                continue
            rr, sent = rerankers.get(label) or rerankers.setdefault(label, _reranker(url, options))
            row = {"kind": kind, "label": label, "qid": topic.qid,
                   **_rank(rr, sent, topic, args.top, data.qrels, data.rel_threshold)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "notes"}), flush=True)
            _save(done, args)


def _save(done: dict, args: argparse.Namespace) -> None:
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(done, indent=1))
    out.with_suffix(".md").write_text(report(done))


def report(done: dict) -> str:
    rows = done.get("rows", [])
    lines = [f"# Methods and costs per kind of endpoint ({done['date']})", "",
             "Commands: " + "; ".join(f"`{c}`" for c in done["commands"]), "",
             f"TREC DL19, BM25 top-{done['top']}, queries {', '.join(done['queries'])}; Qwen2.5-Coder-0.5B-Instruct "
             f"on every kind. Machine: {done['machine']}. The llama.cpp kinds share one server (assistant prefill off); "
             "the hosted kinds reach it through `HostedGateway` (capcal_integrations/server/gateway.py).", "",
             "| endpoint kind | method asked | ran | lists | requests / list | scoring requests / list | s / list | "
             "estimated labels / list | guarded | nDCG@10 |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in PLAN:
        for label, _ in PLAN[kind]:
            sel = [r for r in rows if r["kind"] == kind and r["label"] == label]
            if not sel:
                continue
            ok = [r for r in sel if "error" not in r]
            if not ok:
                lines.append(f"| {kind} | {label} | raises `{sel[0]['error'].split(':')[0]}` | {len(sel)} | – | – | – | – "
                             "| – | – |")
                continue
            ran = "/".join(sorted({r["ran"] for r in ok}))

            def avg(key: str, fmt: str = ".1f", ok: list = ok) -> str:
                return format(statistics.fmean(r[key] for r in ok), fmt)

            lines.append(f"| {kind} | {label} | {ran} | {len(ok)} | {avg('requests')} | {avg('scoring')} | "
                         f"{avg('seconds')} | {avg('upper_bounds')} | {sum(r['guarded'] > 0 for r in ok)} of {len(ok)} | "
                         f"{avg('ndcg10', '.4f')} |")
    errors = {(r["kind"], r["label"]): r["error"] for r in rows if "error" in r}
    if errors:
        lines += ["", "Errors, as raised:"] + [f"- {k} / {m}: {e}" for (k, m), e in errors.items()]
    lines += ["", "Requests exclude the probe (about seven small requests, once per endpoint) and include label "
              "tokenization on llama.cpp and vLLM (on a method's first list only: one request per spelling) and the "
              "prompt-size check. Scoring requests "
              "are `/v1/completions` and `/v1/chat/completions` calls. \"estimated labels\": label probabilities that "
              "are upper bounds or estimates (`Ranking.upper_bounds`). \"guarded\": lists the no-harm guard kept in BM25 "
              "order (the default guard=2.0; \"unguarded\" runs turn it off to show the whole decoding's cost)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--kinds", default="llamacpp,hosted-chat,hosted-completions")
    ap.add_argument("--server-url", help="a running llama.cpp server (best with assistant prefill off)")
    ap.add_argument("--vllm-url", help="a running vLLM server")
    ap.add_argument("--out", default=str(HERE / "results" / "endpoint-kinds"))
    args = ap.parse_args()
    data = load_dataset(args.data).select(args.queries)
    out = pathlib.Path(args.out).with_suffix(".json")
    done = json.loads(out.read_text()) if out.exists() else {}
    done.update(date=time.strftime("%Y-%m-%d"), top=args.top, queries=[t.qid for t in data.topics],
                machine=f"{platform.machine()}, {__import__('os').cpu_count()} cores")
    done["commands"] = list(dict.fromkeys([*done.get("commands", []), "python " + " ".join(sys.argv)]))
    kinds = args.kinds.split(",")
    with contextlib.ExitStack() as stack:
        if any(k != "vllm" for k in kinds):
            url = args.server_url or stack.enter_context(EmbeddedServer(model="0.5b", prefill=False)).base_url
            for kind in (k for k in kinds if k != "vllm"):
                gateway = {"hosted-chat": "chat", "hosted-completions": "completions"}.get(kind)
                with HostedGateway(url, gateway) if gateway else contextlib.nullcontext() as g:
                    run_kind(kind, g.base_url if g else url, data, args, done)
        if "vllm" in kinds or args.vllm_url:
            url = args.vllm_url or stack.enter_context(VllmServer(model="0.5b")).base_url
            run_kind("vllm", url, data, args, done)
    _save(done, args)


if __name__ == "__main__":
    main()
