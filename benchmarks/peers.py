"""Beside the rerankers people use today: LlamaIndex RankGPTRerank, LangChain LLMListwiseRerank and this library.

    python -m benchmarks.peers --smoke                                  # a list of 5 a dataset, not the default
    python -m benchmarks.peers --datasets dl19 --queries 20             # starts the embedded server
    python -m benchmarks.peers --datasets scifact --queries 20 --words scifact=100 --resume
    python -m benchmarks.peers --queries 10 --base-url URL [--api-key KEY]

On one llama.cpp server with the packaged Qwen2.5-Coder-0.5B, the BM25 top-20 lists of the first ``--queries``
queries of DL19 and SciFact, ranked by ``bm25`` (the given order), ``llamaindex-rankgpt`` (``RankGPTRerank``, its LLM
sending RankGPT's chat messages as they are, as ``OpenAILike`` does), ``langchain-listwise`` (``LLMListwiseRerank``
on ``ChatOpenAI(base_url=...)``), ``capcal-vanilla`` and ``capcal-default`` (the defaults; its content check's
background readings are waited for after each of its lists and reported apart). The same passages for all, cut to
``--words`` words; the peers at temperature 0; the model methods take turns going first on each list. Per list:
nDCG@10 of the order a caller receives, whether the model's output *needed repair* (identifiers missing, repeated
or out of range; for this library, places filled in rather than decoded), HTTP requests and the server's ``usage``
(an httpx event hook on every client), wall seconds. rank_llm is not run: it requires vLLM.
Writes ``benchmarks/results/peers/peers.json`` and ``.md`` after every list (a run cut short keeps what it finished).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
import openai

from benchmarks import _common as C
from capcal_integrations import CapCalReranker
from capcal_integrations.evaluation.data import load_dataset
from capcal_integrations.testbed.measure import ndcg10

DATASETS = {"dl19": "trec-dl19-passage", "scifact": "beir-scifact-test"}
PEERS = ("llamaindex-rankgpt", "langchain-listwise", "capcal-vanilla", "capcal-default")
WORDS = 300


class Meter:
    """Counts one client's HTTP requests and the ``usage`` the server reports, and keeps the last answer's text."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.paths: dict[str, int] = {}
        self.answers: list[str] = []  # the answers' text (tool-call arguments for structured output)

    def hook(self, response: httpx.Response) -> None:
        response.read()
        self.requests += 1
        self.paths[response.request.url.path] = self.paths.get(response.request.url.path, 0) + 1
        try:
            body = response.json()
        except ValueError:
            return
        usage = (body.get("usage") or {}) if isinstance(body, dict) else {}
        self.prompt_tokens += usage.get("prompt_tokens") or 0
        self.completion_tokens += usage.get("completion_tokens") or 0
        self.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        for choice in (body.get("choices") or []) if isinstance(body, dict) else []:
            message, calls = choice.get("message") or {}, (choice.get("message") or {}).get("tool_calls") or []
            self.answers.append(message.get("content") or (calls[0]["function"]["arguments"] if calls else "")
                                or choice.get("text") or "")

    def client(self, timeout: float) -> httpx.Client:
        return httpx.Client(timeout=timeout, event_hooks={"response": [self.hook]})
    def snapshot(self) -> dict[str, Any]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "uncached_tokens": self.prompt_tokens - self.cached_tokens,
                "completion_tokens": self.completion_tokens, "paths": dict(self.paths)}


def needs_repair(ids: list[int], n: int) -> dict[str, int]:
    """What a parser must fix in identifiers ``ids`` (0-based) of a list of ``n``: missing, repeated, out of range.

    >>> needs_repair([2, 0, 0, 7], 3)
    {'missing': 1, 'repeated': 1, 'out_of_range': 1}
    """
    inside = [i for i in ids if 0 <= i < n]
    return {"missing": n - len(set(inside)), "repeated": len(inside) - len(set(inside)),
            "out_of_range": len(ids) - len(inside)}


def llamaindex_rankgpt(url: str, key: str, model: str, meter: Meter, args: argparse.Namespace):
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.llms import ChatMessage, ChatResponse, CompletionResponse, CustomLLM, LLMMetadata, MessageRole
    from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
    from llama_index.core.postprocessor.rankGPT_rerank import RankGPTRerank
    from llama_index.core.schema import NodeWithScore, TextNode

    class ServerChat(CustomLLM):
        """The server's chat completions as a LlamaIndex chat LLM: messages sent as they are (as OpenAILike)."""

        model: str
        max_tokens: int
        _client: Any = PrivateAttr()

        def __init__(self, client: openai.OpenAI, **data: Any) -> None:
            super().__init__(**data)
            self._client = client

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(context_window=32768, num_output=self.max_tokens, is_chat_model=True,
                               model_name=self.model)

        @llm_chat_callback()
        def chat(self, messages, **kwargs: Any) -> ChatResponse:
            reply = self._client.chat.completions.create(
                model=self.model, messages=[{"role": m.role.value, "content": m.content or ""} for m in messages],
                max_tokens=self.max_tokens, temperature=0)
            return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT,
                                                    content=reply.choices[0].message.content or ""))

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            return CompletionResponse(text=self.chat([ChatMessage(role=MessageRole.USER, content=prompt)]).message.content)

        stream_complete = complete  # abstract in CustomLLM, never called by RankGPTRerank

    client = openai.OpenAI(base_url=url, api_key=key, http_client=meter.client(args.timeout), timeout=args.timeout)
    rerank = RankGPTRerank(top_n=args.top, llm=ServerChat(client, model=model, max_tokens=args.max_tokens))

    def run(query: str, passages: list[str]) -> tuple[list[int], dict]:
        nodes = [NodeWithScore(node=TextNode(text=p, id_=str(i)), score=float(len(passages) - i))
                 for i, p in enumerate(passages)]
        out = rerank.postprocess_nodes(nodes, query_str=query)
        raw = meter.answers[-1] if meter.answers else ""
        ids = [int(x) - 1 for x in re.findall(r"\d+", raw)]  # as RankGPTRerank._clean_response reads it
        return [int(n.node.node_id) for n in out], {"raw": raw, **needs_repair(ids, len(passages))}

    return run


def langchain_listwise(url: str, key: str, model: str, meter: Meter, args: argparse.Namespace):
    from langchain_classic.retrievers.document_compressors import LLMListwiseRerank
    from langchain_core.documents import Document
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url, api_key=key, model=model, temperature=0, max_tokens=args.max_tokens,
                     timeout=args.timeout, http_client=meter.client(args.timeout))
    rerank = LLMListwiseRerank.from_llm(llm, top_n=args.top)

    def run(query: str, passages: list[str]) -> tuple[list[int], dict]:
        docs = [Document(page_content=p, metadata={"i": i}) for i, p in enumerate(passages)]
        out, error = None, None
        try:
            out = [d.metadata["i"] for d in rerank.compress_documents(docs, query)]
        except Exception as e:  # noqa: BLE001 - what a caller meets is the measurement
            error = _error(e)
        raw = meter.answers[-1] if meter.answers else ""
        try:
            ids = json.loads(raw)["ranked_document_ids"]
            ids = [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []
            parsed = True
        except (ValueError, KeyError, TypeError):
            ids, parsed = [int(x) for x in re.findall(r"\d+", raw)], False
        return out, {"raw": raw, "error": error, "json": parsed, **needs_repair(ids, len(passages))}

    return run


def capcal(url: str, key: str, meter: Meter, args: argparse.Namespace, **options: Any):
    rr = CapCalReranker(base_url=url, api_key=key, timeout=args.timeout, http_client=meter.client(args.timeout),
                        **options)
    rr.capabilities()  # the probe, once per endpoint: outside the lists' cost

    def run(query: str, passages: list[str]) -> tuple[list[int], dict]:
        r = rr.rerank(query, passages)
        chosen = [s.chosen for s in r.steps] if r.steps and hasattr(r.steps[0], "chosen") else []
        n = len(passages)
        repaired = {"missing": n - len(set(r.order)), "repeated": len(chosen) - len(set(chosen)),
                    "out_of_range": sum(not 0 <= i < n for i in r.order),
                    "filled_in": 0 if r.decoded is None or r.kept_given_order else n - r.decoded}  # kept: nothing to repair
        return list(r.order), {**repaired, "method_ran": r.method, "library_requests": r.usage.requests,
                               "checked": list(r.checked), "notes": list(r.notes), "kept_given_order": r.kept_given_order}

    run.settle = rr.wait_for_readings  # type: ignore[attr-defined] - the content check's readings, waited for apart
    return run


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def cut(text: str, words: int = WORDS) -> str:
    return " ".join(text.split()[:words])


def words_of(spec: str, names: list[str]) -> dict[str, int]:
    """``--words``: ``300`` for every dataset, or per dataset (``dl19=300,scifact=100``; unnamed ones: 300)."""
    given = dict(part.split("=", 1) for part in spec.split(",")) if "=" in spec else dict.fromkeys(names, spec)
    return {d: int(given.get(d, WORDS)) for d in names}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser("peers", __doc__)
    ap.add_argument("--data", help="the folder of trec-dl19-passage/ and beir-scifact-test/ (default ../shared/data)")
    ap.add_argument("--datasets", default="dl19,scifact", help="of " + ",".join(DATASETS))
    ap.add_argument("--queries", type=int, default=10, help="the first N queries of each dataset")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--methods", default=",".join(PEERS), help="model methods to run (bm25 always)")
    ap.add_argument("--words", default=str(WORDS), help="cut every passage: 300, or per dataset: dl19=300,scifact=100")
    ap.add_argument("--max-tokens", type=int, default=256, help="the peers' generation limit")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--base-url", help="a running OpenAI-compatible llama.cpp server (default: start the embedded one)")
    ap.add_argument("--api-key", default=os.environ.get("CAPCAL_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    ap.add_argument("--threads", type=int, help="the embedded server's CPU threads (default: its own)")
    ap.add_argument("--resume", action="store_true", help="rank only the lists the run of this name has not finished")
    args = ap.parse_args(argv)
    stamp = C.stamp("peers", [a for a in (sys.argv[1:] if argv is None else argv) if a != args.api_key])
    if args.smoke:
        args.queries, args.top, args.max_tokens = 1, 5, 64  # one list a dataset: 2 lists; the default's check reads
        args.methods = ",".join(m for m in PEERS if m != "capcal-default")  # 13 prompts a list: minutes on a CPU
    args.name = args.name or "bm25-top20"
    out = C.out_dir("peers", args)
    methods = [m for m in args.methods.split(",") if m in PEERS]
    names = [d for d in args.datasets.split(",")]
    words = words_of(args.words, names)
    root = pathlib.Path(args.data) if args.data else C.need_data()
    data = {d: load_dataset(root / DATASETS[d]).select(args.queries) for d in names}
    with contextlib.ExitStack() as stack:
        if "CAPCAL_DECISIONS_DIR" not in os.environ:  # the content check starts afresh, as in a new deployment
            os.environ["CAPCAL_DECISIONS_DIR"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-"))
        url, key = args.base_url, args.api_key or "no-key"
        if not url:
            from capcal_integrations.server import EmbeddedServer

            key = "peers-benchmark"
            url = stack.enter_context(EmbeddedServer(model="0.5b", n_parallel=3, ctx_per_slot=12288,
                                                     threads=args.threads, api_key=key)).base_url
        model = openai.OpenAI(base_url=url, api_key=key).models.list().data[0].id
        meters = {m: Meter() for m in methods}
        makers = {"llamaindex-rankgpt": lambda m: llamaindex_rankgpt(url, key, model, meters[m], args),
                  "langchain-listwise": lambda m: langchain_listwise(url, key, model, meters[m], args),
                  "capcal-vanilla": lambda m: capcal(url, key, meters[m], args, method="vanilla"),
                  "capcal-default": lambda m: capcal(url, key, meters[m], args)}
        runners = {d: {m: makers[m](m) for m in methods} for d in names}
        meta = {"base_url": url if args.base_url else "embedded (started here)", "server": "llama.cpp (xllamacpp)",
                "model": model, "top": args.top, "words": words, "max_tokens": args.max_tokens,
                "queries_per_dataset": args.queries, "methods": methods}
        rows: list[dict] = []
        before = next((r for r in C.load("peers", out)["runs"] if r["name"] == args.name), None)
        if args.resume and before:
            stamp["command"] = f"{before['stamp']['command']}; then {stamp['command']}"
            meta["words"] = {**before["data"]["words"], **words}
            rows = [r for r in before["data"]["rows"] if (r["dataset"], r["qid"]) in finished(before["data"]["rows"], methods)]
        k = len(done := finished(rows, methods))
        for q in range(args.queries):
            for d in names:
                if q >= len(data[d].topics) or (d, data[d].topics[q].qid) in done:
                    continue
                topic = data[d].topics[q]
                grades, cands = data[d].grades().get(topic.qid, {}), topic.candidates[:args.top]
                ideal = sorted(grades.values(), reverse=True)
                passages = [cut(c.text if not c.title else f"Title: {c.title} Content: {c.text}", words[d]) for c in cands]
                docids = [c.docid for c in cands]
                rows.append({"dataset": d, "qid": topic.qid, "method": "bm25", "position": None, "seconds": 0.0,
                             **dict.fromkeys(("requests", "prompt_tokens", "cached_tokens", "uncached_tokens",
                                              "completion_tokens", "failed", "needs_repair"), 0),
                             "ndcg10": ndcg10([grades.get(x, 0) for x in docids], ideal), "order": list(range(len(docids)))})
                turn = methods[k % len(methods):] + methods[:k % len(methods)]
                k += 1
                for pos, m in enumerate(turn):
                    rows.append(one(runners[d][m], meters[m], d, topic, pos, m, passages, docids, grades, ideal))
                    print(json.dumps({x: v for x, v in rows[-1].items() if x not in ("order", "notes")}), flush=True)
                C.save("peers", run_of(args.name, stamp, meta, rows, methods), out)  # a run cut short keeps its lists
    return 0


def one(runner: Any, meter: Meter, d: str, topic: Any, pos: int, m: str, passages: list[str], docids: list[str],
        grades: dict[str, int], ideal: list[int]) -> dict:
    """One method on one list, timed; then its background readings (if any), timed apart."""
    meter.reset()
    started = time.perf_counter()
    try:
        order, info = runner(topic.query, passages)
    except Exception as e:  # noqa: BLE001 - recorded, and the run goes on
        order, info = None, {"error": _error(e)}
    seconds = time.perf_counter() - started
    shown = list(range(len(docids))) if order is None else list(dict.fromkeys(order))
    repair = any(info.get(f) for f in ("missing", "repeated", "out_of_range", "filled_in"))
    row = {"dataset": d, "qid": topic.qid, "method": m, "position": pos, "seconds": round(seconds, 2),
           **meter.snapshot(), "failed": order is None, "needs_repair": bool(repair),
           "ndcg10": ndcg10([grades.get(docids[i], 0) for i in shown], ideal), "order": order, **info}
    if hasattr(runner, "settle"):  # its background readings end before the next method starts, timed apart
        meter.reset()
        started = time.perf_counter()
        runner.settle()
        reading = meter.snapshot()
        row.update(reading_seconds=round(time.perf_counter() - started, 2), reading_requests=reading["requests"],
                   reading_uncached_tokens=reading["uncached_tokens"])
    return row


def summarise(rows: list[dict], methods: list[str]) -> list[dict]:
    """Per dataset and method, over the lists every method finished."""
    out: list[dict] = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == d]
        done = {q for dd, q in finished(mine, methods)}
        base = None
        for m in ("bm25", *methods):
            rs = [r for r in mine if r["method"] == m and r["qid"] in done]
            if not rs:
                continue
            e = {"dataset": d, "method": m, "lists": len(rs), "ndcg10": statistics.fmean(r["ndcg10"] for r in rs),
                 "needs_repair": sum(r["needs_repair"] for r in rs), "failed": sum(r["failed"] for r in rs)}
            for f in ("requests", "prompt_tokens", "uncached_tokens", "completion_tokens", "seconds"):
                e[f] = statistics.fmean(r[f] for r in rs)
            e["seconds_median"] = statistics.median(r["seconds"] for r in rs)
            out.append(e)
            if m == "capcal-vanilla":
                base = e
        for e in out:
            if e["dataset"] == d and base is not None:
                e["vs_vanilla"] = {f: (e[f] / base[f] if base[f] else None)
                                   for f in ("requests", "prompt_tokens", "uncached_tokens", "seconds")}
    return out


def paired(rows: list[dict], d: str, a: str, b: str) -> tuple[int, float, float, float] | None:
    """Mean paired nDCG@10 difference ``a - b`` over the lists of ``d`` both finished, with its 95 % t-interval."""
    from scipy import stats

    by = {m: {r["qid"]: r["ndcg10"] for r in rows if r["dataset"] == d and r["method"] == m} for m in (a, b)}
    diffs = [by[a][q] - by[b][q] for q in by[a] if q in by[b]]
    if len(diffs) < 2:
        return None
    mean, half = statistics.fmean(diffs), stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return len(diffs), mean, mean - half, mean + half


def finished(rows: list[dict], methods: list[str]) -> set[tuple[str, str]]:
    """The ``(dataset, qid)`` lists every method (and BM25) has a row of."""
    have: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        have.setdefault((r["dataset"], r["qid"]), set()).add(r["method"])
    return {key for key, ms in have.items() if ms >= {"bm25", *methods}}


def _x(e: dict, f: str) -> str:
    return "–" if (e.get("vs_vanilla") or {}).get(f) is None else f"{e['vs_vanilla'][f]:.2f}"


def run_of(name: str, stamp: dict, meta: dict, rows: list[dict], methods: list[str]) -> dict:
    """The run as the results file keeps it: the summary (the headline), the paired differences, notes, every row."""
    summary = summarise(rows, methods)
    words = meta["words"] if isinstance(meta["words"], int) else ", ".join(f"{n} ({d})" for d, n in meta["words"].items())
    head = [[e["dataset"], "bm25", e["lists"], f"{e['ndcg10']:.4f}", "–", "–", 0, "", 0, "", "", "", 0, ""]
            if e["method"] == "bm25" else
            [e["dataset"], e["method"], e["lists"], f"{e['ndcg10']:.4f}", f"{e['needs_repair']}/{e['lists']}",
             f"{e['failed']}/{e['lists']}", f"{e['requests']:.1f}", _x(e, "requests"), f"{e['prompt_tokens']:,.0f}",
             _x(e, "prompt_tokens"), f"{e['uncached_tokens']:,.0f}", f"{e['completion_tokens']:,.0f}",
             f"{e['seconds']:.1f}", _x(e, "seconds")] for e in summary]
    pairs = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        for m in methods:
            cells = [None if b == m else paired(rows, d, m, b) for b in ("bm25", "capcal-vanilla")]
            pairs.append([d, m, sum(r["dataset"] == d and r["method"] == m for r in rows),
                          *("–" if t is None else f"{t[1]:+.4f} [{t[2]:+.4f}, {t[3]:+.4f}]" for t in cells)])
    notes = [f"One {meta['server']} server, model `{meta['model']}`, BM25 top-{meta['top']}, the first "
             f"{meta['queries_per_dataset']} queries of each dataset (`lists`: those every method finished, the only "
             f"ones counted), passages cut to {words} words, the peers at temperature 0 and at most "
             f"{meta['max_tokens']} tokens, the model methods taking turns going first (definitions: the docstring)."]
    for d in dict.fromkeys(r["dataset"] for r in rows):
        for m in methods:
            read = [r for r in rows if r["dataset"] == d and r["method"] == m and "reading_seconds" in r]
            if any(r["reading_requests"] for r in read):
                notes.append(f"Background readings of `{m}` on {d} (its content check, waited for after each of its "
                             f"lists, outside its s / list): {sum(r['reading_requests'] > 0 for r in read)} of "
                             f"{len(read)} lists read, {sum(r['reading_seconds'] for r in read):,.0f} s, "
                             f"{sum(r['reading_uncached_tokens'] for r in read):,} uncached prompt tokens in all.")
    errors = collections.Counter(f"{r['method']}: {r['error']}" for r in rows if r.get("error"))
    if errors:
        notes.append("Failed calls: " + "; ".join(f"{n}x {e}" for e, n in errors.items()) + ".")
    return {"name": name, "title": "Peers side by side, one server, one run", "stamp": stamp, "notes": notes,
            "tables": [{"columns": ["dataset", "method", "lists", "nDCG@10", "outputs needing repair", "failed calls",
                                    "requests / list", "x vanilla", "prompt tokens / list", "x vanilla",
                                    "uncached prompt tokens / list", "completion tokens / list", "s / list",
                                    "x vanilla"], "rows": head},
                       {"columns": ["dataset", "method", "lists", "- bm25", "- capcal-vanilla"], "rows": pairs,
                        "caption": "Paired nDCG@10 differences over the same lists (mean, 95 % t-interval):"}],
            "data": {**meta, "summary": summary, "rows": rows}}


if __name__ == "__main__":
    raise SystemExit(main())
