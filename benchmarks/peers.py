"""Peers side by side: LlamaIndex RankGPTRerank, LangChain LLMListwiseRerank and this library, one server, one run.

    python benchmarks/peers.py --data ../shared/data --queries 10                      # starts the embedded server
    python benchmarks/peers.py --data ../shared/data --queries 10 --base-url URL [--api-key KEY]

On one llama.cpp server with the packaged Qwen2.5-Coder-0.5B-Instruct (started here, or ``--base-url``), the
BM25 top-20 lists of the first ``--queries`` queries of DL19 (``trec-dl19-passage``) and SciFact
(``beir-scifact-test``) are ranked by:

- ``bm25``: the first-stage order (no model);
- ``llamaindex-rankgpt``: ``llama_index.core.postprocessor.RankGPTRerank`` (its own prompt and parser), its LLM a
  small ``CustomLLM`` that sends RankGPT's chat messages as they are to the server's chat completions (what
  ``OpenAILike`` does; ``OpenAILike`` itself pins ``openai<3``);
- ``langchain-listwise``: ``langchain_classic``'s ``LLMListwiseRerank.from_llm(ChatOpenAI(base_url=...))`` (its
  prompt, structured output by ``with_structured_output``'s default method, its parser);
- ``capcal-vanilla``: ``CapCalReranker(method="vanilla")``;
- ``capcal-default``: ``CapCalReranker()`` with the default options (one reranker per dataset, so its content
  check decides on that dataset's first lists, as in a deployment). Its check reads lists in the background;
  after each of its lists the run waits for those readings (``wait_for_readings``) before the next method
  starts, and reports their time and tokens apart: they overlap no method's timing. Its decisions and readings
  are kept in a fresh temporary folder (unless ``CAPCAL_DECISIONS_DIR`` is set): nothing an earlier run read.

Every method gets the same passages: the text (SciFact: ``Title: ... Content: ...``, the RankGPT/rank_llm
form), cut to ``--words`` words (300: RankGPTRerank's and this library's own cut, so a no-op for them;
LLMListwiseRerank cuts nothing; a shorter cut, per dataset if need be, makes SciFact's long abstracts affordable
on a CPU, for every method alike); the peers ask for at most ``--max-tokens`` (256) generated tokens at temperature 0. Each list
is ranked by the four model methods back to back, their order rotated from list to list (the machine is
shared and noisy, and the server's prompt cache favours whoever comes second), the two datasets alternating.

Measured per list: nDCG@10 (trec_eval's; of the order each method returns, as a caller receives it: RankGPT's
parser appends what the model left out, LLMListwiseRerank returns only what the model listed; a list whose
call raised counts in its given order and is counted as failed); whether the model's output *needed repair*
(peers: the identifiers in the raw output, read from the HTTP response, were missing some, repeated one or
named one out of range; this library: its order is not a permutation, a decoded step repeats an
identifier, or places were filled in rather than decoded); HTTP requests and the server's ``usage`` (prompt,
cached, completion tokens), counted by an httpx event hook on every client (the library's endpoint probe is
made before and not counted); wall seconds. rank_llm is not run: it requires ``vllm`` (torch) to install.
Writes benchmarks/results/peers.json and .md after every list (a run cut short keeps what it finished).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import openai  # noqa: E402

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.evaluation.data import load_dataset  # noqa: E402
from capcal_integrations.testbed.measure import ndcg10  # noqa: E402

HERE = pathlib.Path(__file__).parent
DATASETS = {"dl19": "trec-dl19-passage", "scifact": "beir-scifact-test"}
PEERS = ("llamaindex-rankgpt", "langchain-listwise", "capcal-vanilla", "capcal-default")
METHODS = ("bm25", *PEERS)
WORDS = 300


class Meter:
    """Counts one client's HTTP requests and the ``usage`` the server reports, and keeps the last answer's text."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.paths: dict[str, int] = {}
        self.answers: list[str] = []

    def hook(self, response: httpx.Response) -> None:
        response.read()
        self.requests += 1
        path = response.request.url.path
        self.paths[path] = self.paths.get(path, 0) + 1
        try:
            body = response.json()
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        usage = body.get("usage") or {}
        self.prompt_tokens += usage.get("prompt_tokens") or 0
        self.completion_tokens += usage.get("completion_tokens") or 0
        self.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        for choice in body.get("choices") or []:
            message = choice.get("message") or {}
            calls = message.get("tool_calls") or []
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


# ---------------------------------------------------------------------------------------------- the peers


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

        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any):
            yield self.complete(prompt, formatted, **kwargs)

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
        try:
            out = [d.metadata["i"] for d in rerank.compress_documents(docs, query)]
            error = None
        except Exception as e:  # noqa: BLE001 - what a caller meets is the measurement
            out, error = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
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
                               "library_prompt_tokens": r.usage.prompt_tokens,
                               "checked": list(r.checked), "steps": len(r.steps), "notes": list(r.notes),
                               "kept_given_order": r.kept_given_order}

    run.settle = rr.wait_for_readings  # type: ignore[attr-defined] - the content check's readings, waited for apart
    return run


# ---------------------------------------------------------------------------------------------- the run


def cut(text: str, words: int = WORDS) -> str:
    return " ".join(text.split()[:words])


def words_of(spec: str, names: list[str]) -> dict[str, int]:
    """``--words``: ``300`` for every dataset, or per dataset (``dl19=300,scifact=100``; unnamed ones: 300)."""
    if "=" not in spec:
        return {d: int(spec) for d in names}
    given = dict(part.split("=", 1) for part in spec.split(","))
    return {d: int(given.get(d, WORDS)) for d in names}


def served_model(url: str, key: str) -> str:
    return openai.OpenAI(base_url=url, api_key=key).models.list().data[0].id


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data"),
                    help="the folder holding trec-dl19-passage/ and beir-scifact-test/")
    ap.add_argument("--datasets", default="dl19,scifact", help="of " + ",".join(DATASETS))
    ap.add_argument("--queries", type=int, default=10, help="the first N queries of each dataset")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--methods", default=",".join(PEERS), help="model methods to run (bm25 always)")
    ap.add_argument("--words", default=str(WORDS), help="cut every passage to this many words, for every method: "
                    "one number, or per dataset (dl19=300,scifact=100)")
    ap.add_argument("--max-tokens", type=int, default=256, help="the peers' generation limit")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--base-url", help="a running OpenAI-compatible llama.cpp server (default: start the embedded one)")
    ap.add_argument("--api-key", default=os.environ.get("CAPCAL_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    ap.add_argument("--threads", type=int, help="the embedded server's CPU threads (default: its own)")
    ap.add_argument("--out", default=str(HERE / "results" / "peers"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json and stop")
    ap.add_argument("--from-log", help="write the results from the rows a run printed (one JSON object per line; "
                    "--methods: those to count) and stop")
    ap.add_argument("--note", default="", help="a sentence for the report (with --from-log: how the run ended)")
    ap.add_argument("--resume", action="store_true", help="keep the rows of --out's .json and rank only the lists it "
                    "has not finished (a run in parts; the commands are kept; set CAPCAL_DECISIONS_DIR to keep the "
                    "default's content check across the parts)")
    args = ap.parse_args()
    if args.report_only:
        result = json.loads(pathlib.Path(args.out).with_suffix(".json").read_text())
        pathlib.Path(args.out).with_suffix(".md").write_text(report(result))
        return 0
    methods = [m for m in args.methods.split(",") if m in PEERS]
    names = [d for d in args.datasets.split(",")]
    words = words_of(args.words, names)
    data = {d: load_dataset(pathlib.Path(args.data) / DATASETS[d]).select(args.queries) for d in names}
    command = "python benchmarks/peers.py " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != args.api_key)
    if args.from_log:
        return from_log(args, methods, data)

    with contextlib.ExitStack() as stack:
        if "CAPCAL_DECISIONS_DIR" not in os.environ:  # the content check starts afresh, as in a new deployment
            os.environ["CAPCAL_DECISIONS_DIR"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-"))
        url, key = args.base_url, args.api_key or "no-key"
        if not url:
            from capcal_integrations.server import EmbeddedServer

            key = "peers-benchmark"
            server = stack.enter_context(EmbeddedServer(model="0.5b", n_parallel=3, ctx_per_slot=12288,
                                                        threads=args.threads, api_key=key))
            url = server.base_url
        model = served_model(url, key)
        meters = {m: Meter() for m in methods}
        runners: dict[str, dict[str, Any]] = {}
        for d in names:
            runners[d] = {}
            for m in methods:
                if m == "llamaindex-rankgpt":
                    runners[d][m] = llamaindex_rankgpt(url, key, model, meters[m], args)
                elif m == "langchain-listwise":
                    runners[d][m] = langchain_listwise(url, key, model, meters[m], args)
                elif m == "capcal-vanilla":
                    runners[d][m] = capcal(url, key, meters[m], args, method="vanilla")
                else:
                    runners[d][m] = capcal(url, key, meters[m], args)
        meta = {"command": command, "base_url": url if args.base_url else "embedded (started here)",
                "server": "llama.cpp (xllamacpp)", "model": model, "top": args.top, "words": words,
                "max_tokens": args.max_tokens, "queries_per_dataset": args.queries, "methods": methods,
                "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        rows: list[dict] = []
        earlier = pathlib.Path(args.out).with_suffix(".json")
        if args.resume and earlier.is_file():
            before = json.loads(earlier.read_text())
            meta["command"] = f"{before['command']}; then {command}"
            kept = before["words"] if isinstance(before["words"], dict) else words_of(
                str(before["words"]), list(dict.fromkeys(r["dataset"] for r in before["rows"])))
            meta["words"] = {**kept, **words}
            rows = [r for r in before["rows"] if (r["dataset"], r["qid"]) in finished(before["rows"], methods)]
        done = finished(rows, methods)
        k = len(done)
        for q in range(args.queries):
            for d in names:
                if q >= len(data[d].topics) or (d, data[d].topics[q].qid) in done:
                    continue
                topic = data[d].topics[q]
                grades = data[d].grades().get(topic.qid, {})
                ideal = sorted(grades.values(), reverse=True)
                cands = topic.candidates[:args.top]
                passages = [cut(c.text if not c.title else f"Title: {c.title} Content: {c.text}", words[d]) for c in cands]
                docids = [c.docid for c in cands]
                rows.append({"dataset": d, "qid": topic.qid, "method": "bm25", "position": None, "seconds": 0.0,
                             "requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "uncached_tokens": 0,
                             "completion_tokens": 0, "failed": False, "needs_repair": False,
                             "ndcg10": ndcg10([grades.get(x, 0) for x in docids], ideal), "order": list(range(len(docids)))})
                turn = methods[k % len(methods):] + methods[:k % len(methods)]
                k += 1
                for pos, m in enumerate(turn):
                    meters[m].reset()
                    started = time.perf_counter()
                    try:
                        order, info = runners[d][m](topic.query, passages)
                    except Exception as e:  # noqa: BLE001 - recorded, and the run goes on
                        order, info = None, {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
                    seconds = time.perf_counter() - started
                    failed = order is None
                    shown = list(range(len(docids))) if failed else list(dict.fromkeys(order))
                    repair = any(info.get(f) for f in ("missing", "repeated", "out_of_range", "filled_in"))
                    row = {"dataset": d, "qid": topic.qid, "method": m, "position": pos, "seconds": round(seconds, 2),
                           **meters[m].snapshot(), "failed": failed, "needs_repair": bool(repair),
                           "ndcg10": ndcg10([grades.get(docids[i], 0) for i in shown], ideal), "order": order, **info}
                    settle = getattr(runners[d][m], "settle", None)
                    if settle is not None:  # its background readings end before the next method starts, timed apart
                        meters[m].reset()
                        started = time.perf_counter()
                        settle()
                        reading = meters[m].snapshot()
                        row.update(reading_seconds=round(time.perf_counter() - started, 2),
                                   reading_requests=reading["requests"], reading_uncached_tokens=reading["uncached_tokens"])
                    rows.append(row)
                    print(json.dumps({x: v for x, v in row.items() if x not in ("order", "notes")}), flush=True)
                write(args, meta, rows, methods)  # after every list: a run cut short keeps what it finished
    return 0


def bm25_row(d: str, topic: Any, grades: dict[str, int], top: int) -> dict:
    docids = [c.docid for c in topic.candidates[:top]]
    return {"dataset": d, "qid": topic.qid, "method": "bm25", "position": None, "seconds": 0.0, "requests": 0,
            "prompt_tokens": 0, "cached_tokens": 0, "uncached_tokens": 0, "completion_tokens": 0, "failed": False,
            "needs_repair": False, "ndcg10": ndcg10([grades.get(x, 0) for x in docids], sorted(grades.values(), reverse=True)),
            "order": list(range(len(docids)))}


def from_log(args: argparse.Namespace, methods: list[str], data: dict) -> int:
    """The results of a run cut short, from the rows it printed (``--methods``: the methods counted)."""
    printed = [json.loads(line) for line in open(args.from_log, encoding="utf-8") if line.startswith('{"dataset"')]
    rows = []
    for d, ds in data.items():
        for topic in ds.topics:
            mine = [r for r in printed if r["dataset"] == d and r["qid"] == topic.qid and r["method"] in methods]
            if mine:
                rows += [bm25_row(d, topic, ds.grades().get(topic.qid, {}), args.top), *mine]
    meta = {"command": f"python benchmarks/peers.py --data {args.data} --queries {args.queries}", "base_url":
            "embedded (started here)", "server": "llama.cpp (xllamacpp)", "model": "local", "top": args.top,
            "words": words_of(args.words, list(data)), "max_tokens": args.max_tokens, "queries_per_dataset": args.queries,
            "methods": methods, "note": args.note, "from_log": args.from_log}
    write(args, meta, rows, methods)
    print(pathlib.Path(args.out).with_suffix(".md").read_text())
    return 0


def summarise(rows: list[dict], methods: list[str]) -> list[dict]:
    """Per dataset and method, over the lists every method finished."""
    out = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == d]
        done = [q for q in dict.fromkeys(r["qid"] for r in mine) if sum(r["qid"] == q for r in mine) == len(methods) + 1]
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


def paired_table(result: dict) -> list[str]:
    """Each model method against BM25 and against ``capcal-vanilla``, per dataset: paired nDCG@10 differences."""
    rows, methods = result["rows"], result["methods"]
    lines = ["Paired nDCG@10 differences over the same lists (mean, 95 % t-interval; an interval that holds 0 is no "
             "difference this sample can show):", "", "| dataset | method | lists | − bm25 | − capcal-vanilla |",
             "|---|---|---:|---|---|"]
    for d in dict.fromkeys(r["dataset"] for r in rows):
        for m in methods:
            cells = []
            for b in ("bm25", "capcal-vanilla"):
                t = None if b == m else paired(rows, d, m, b)
                cells.append("–" if t is None else f"{t[1]:+.4f} [{t[2]:+.4f}, {t[3]:+.4f}]")
            n = sum(r["dataset"] == d and r["method"] == m for r in rows)
            lines.append(f"| {d} | {m} | {n} | {cells[0]} | {cells[1]} |")
    return [*lines, ""]


def finished(rows: list[dict], methods: list[str]) -> set[tuple[str, str]]:
    """The ``(dataset, qid)`` lists every method (and BM25) has a row of."""
    have: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        have.setdefault((r["dataset"], r["qid"]), set()).add(r["method"])
    return {key for key, ms in have.items() if ms >= {"bm25", *methods}}


def write(args: argparse.Namespace, meta: dict, rows: list[dict], methods: list[str]) -> None:
    summary = summarise(rows, methods)
    result = {**meta, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), load average "
                         f"{os.getloadavg()[0]:.1f} at the end", "summary": summary, "rows": rows}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(result))


def _x(e: dict, f: str) -> str:
    v = (e.get("vs_vanilla") or {}).get(f)
    return "–" if v is None else f"{v:.2f}"


def _words(words: int | dict[str, int]) -> str:
    if isinstance(words, int):
        return f"{words} words"
    return ", ".join(f"{n} words ({d})" for d, n in words.items())


def report(result: dict) -> str:
    lines = [f"# Peers side by side ({result['finished']})", "",
             f"`{result['command']}`", "",
             f"One {result['server']} server, model `{result['model']}` (the packaged Qwen2.5-Coder-0.5B-Instruct), "
             f"BM25 top-{result['top']}, the first {result['queries_per_dataset']} queries of each dataset asked for "
             f"(`lists`: how many every method finished, the only ones counted); passages cut to {_words(result['words'])} "
             f"for all; the peers at temperature 0, at most {result['max_tokens']} generated tokens. The "
             f"model methods took turns going first on each list. Machine: {result['machine']}. See "
             "`benchmarks/peers.py` for the definitions.", "",
             *([result["note"], ""] if result.get("note") else []),
             "| dataset | method | lists | nDCG@10 | outputs needing repair | failed calls | requests / list | "
             "× vanilla | prompt tokens / list | × vanilla | uncached prompt tokens / list | completion tokens / list | "
             "s / list | × vanilla |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in result["summary"]:
        if e["method"] == "bm25":
            lines.append(f"| {e['dataset']} | bm25 | {e['lists']} | {e['ndcg10']:.4f} | – | – | 0 | | 0 | | | | 0 | |")
            continue
        lines.append(f"| {e['dataset']} | {e['method']} | {e['lists']} | {e['ndcg10']:.4f} | "
                     f"{e['needs_repair']}/{e['lists']} | {e['failed']}/{e['lists']} | {e['requests']:.1f} | "
                     f"{_x(e, 'requests')} | {e['prompt_tokens']:,.0f} | {_x(e, 'prompt_tokens')} | "
                     f"{e['uncached_tokens']:,.0f} | {e['completion_tokens']:,.0f} | {e['seconds']:.1f} | "
                     f"{_x(e, 'seconds')} |")
    errors: dict[str, int] = {}
    for r in result["rows"]:
        if r.get("error"):
            errors[f"{r['method']}: {r['error']}"] = errors.get(f"{r['method']}: {r['error']}", 0) + 1
    lines += ["", "Outputs needing repair: the model's identifiers (peers: read from the raw answer) miss a passage, "
              "repeat one or name one out of range; for this library, an order that is not a permutation, a "
              "repeated decoded identifier or places filled in rather than decoded. A failed call (the peer raised) "
              "counts in its given order for nDCG@10. Requests and tokens: every HTTP request of the method's client "
              "and the server's `usage` (cached prompt tokens included in prompt tokens).", ""]
    lines += paired_table(result)
    for d in dict.fromkeys(r["dataset"] for r in result["rows"]):
        for m in dict.fromkeys(r["method"] for r in result["rows"]):
            read = [r for r in result["rows"] if r["dataset"] == d and r["method"] == m and "reading_seconds" in r]
            if any(r["reading_requests"] for r in read):
                lines += [f"Background readings of `{m}` on {d} (its content check; waited for after each of its lists, "
                          "before the next method started, so they overlap no method's time and are not in its "
                          f"s / list): {sum(r['reading_requests'] > 0 for r in read)} of {len(read)} lists read, "
                          f"{sum(r['reading_seconds'] for r in read):,.0f} s "
                          f"({statistics.median(r['reading_seconds'] for r in read if r['reading_requests']):.0f} s a list "
                          f"read, median), {sum(r['reading_uncached_tokens'] for r in read):,} uncached prompt tokens "
                          "in all.", ""]
    if errors:
        lines += ["Failed calls:", "", *[f"- {n}× {e}" for e, n in errors.items()], ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
