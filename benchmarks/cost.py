"""What does a list cost? Each method against what it cannot avoid on one server, and against one generating request.

    python -m benchmarks.cost --smoke                                   # 2 lists of 4, no deciding query
    python -m benchmarks.cost --lists 10 --deciding-lists 4 --concurrency 8 --methods 'vanilla;capcal;capcal, async'
    CAPCAL_VLLM_PYTHON=.venv-vllm/bin/python python -m benchmarks.cost --engine vllm --lists 10 --concurrency 8
    python -m benchmarks.cost --slots                                   # one trie node's cost, pinned or spread
    CAPCAL_VLLM_PYTHON=.venv-vllm/bin/python python -m benchmarks.cost --engine vllm --prompts  # a prompt's own cost

For each DL19 BM25 list (cold: a fresh salt in every passage), on one server in one run, interleaved: **one
generating request** of RankGPT's prompt (at most 100 tokens: what RankGPTRerank and LLMListwiseRerank send); the
methods of ``--methods`` (``guard=None``; :data:`METHODS`: the exact and per-node forms, ``async`` through
``arerank``, ``every node`` for the whole reading the lazy middle steps replace); **one deciding query** of the
content check on the first ``--deciding-passages``; and **the floor** of each: each distinct stream prefilled once
(a one-token request on a cold copy) plus the tokens it cannot avoid at the server's per-token time t (vanilla:
prefill(real) + tokens x t; capcal: prefill(real) + prefill(empty) + 2 x tokens x t; a deciding query: its own
streams, each once, plus their other trie nodes at t). Medians per method: time / floor, time / generating,
requests, uncached prompt tokens / the distinct streams' tokens (vLLM's prefix-cache counters where it has them).
``--concurrency N`` ranks the lists again N at once beside N generating requests; ``--chat`` reads through chat
prefill; ``--slots`` times one trie node pinned to the slot holding the prompt or spread over slots, ``--prompts``
a vLLM request against the prompts it holds (:mod:`benchmarks._requests`). Without
``--base-url`` the embedded server (``--model``, ``--engine``) is started for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import pathlib
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks import _common as C
from benchmarks._requests import prompts, salted, slots
from capcal_integrations import DEFAULT_PLACEHOLDER, RANK_GPT, CapCalReranker
from capcal_integrations.content_check.rules import RULES
from capcal_integrations.endpoints import CHAT_PREFILL, kind_of, tokenize
from capcal_integrations.prompts.render import QUERY_PLACEHOLDER, labels, render_prompt, resolve_template
from capcal_integrations.ranking.decoding import check_readings
from capcal_integrations.ranking.orders import kendall_tau
from capcal_integrations.reading.labels import label_trie, nodes_to_ask
from capcal_integrations.testbed.measure import bench_lists, ndcg10
from capcal_integrations.transport.drivers import run_sync


def _chat(rr: CapCalReranker, messages: Any, max_tokens: int, slot: int | None = None, ignore_eos: bool = False
          ) -> tuple[float, int, int]:
    """One chat completion (on llama.cpp's ``slot`` if given; ``ignore_eos``: exactly ``max_tokens`` generated):
    seconds, prompt tokens, completion tokens."""
    extra = {**({} if slot is None else {"id_slot": slot}), **({"ignore_eos": True} if ignore_eos else {})}
    started = time.perf_counter()
    answer = rr.client.chat.completions.create(model=rr.capabilities().model, temperature=0, max_tokens=max_tokens,
                                               messages=[{"role": r, "content": c} for r, c in messages], extra_body=extra)
    usage = answer.usage
    return time.perf_counter() - started, usage.prompt_tokens, usage.completion_tokens


def _slot(rr: CapCalReranker) -> int | None:
    """The llama.cpp slot the timing requests go to (one slot, so that each finds its own prefix), or None."""
    return 0 if rr.capabilities().slots > 1 else None


class Meter:
    """The prompt tokens a server computed (not from its cache): vLLM's ``/metrics`` counters where it exposes them
    (queried minus hit tokens; ``usage`` leaves them out without ``--enable-prompt-tokens-details``), else ``usage``."""

    def __init__(self, base_url: str, api_key: str | None) -> None:
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.counters = self.read() is not None

    def read(self) -> tuple[float, float] | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url, headers=self.headers), timeout=30) as answer:
                text = answer.read().decode()
        except (urllib.error.URLError, OSError):
            return None
        queries, hits = (re.findall(rf"^vllm:prefix_cache_{name}(?:_total)?(?:{{[^}}]*}})? (\S+)$", text, re.M)
                         for name in ("queries", "hits"))
        return (sum(map(float, queries)), sum(map(float, hits))) if queries else None

    def uncached(self, before: tuple[float, float] | None, prompt_tokens: int, cached_tokens: int) -> float:
        if before is not None:
            time.sleep(1)  # the server counts a request's tokens as its engine step is logged, just after answering
            after = self.read()
            if after is not None:
                return (after[0] - before[0]) - (after[1] - before[1])
        return prompt_tokens - cached_tokens


def _messages(template: Any, query: str, texts: list[str]) -> Any:
    return render_prompt(resolve_template(template), query, texts, labels(len(texts))).text()


#: The methods timed per list: (row name, method, options). The trie form asks only the branching nodes of the
#: identifier trie at each step (about 3 of 21 on a 20-passage list), renormalising at each node. ``async``: the
#: same ranking through ``arerank``. ``every node``: vanilla asking every node of every step, as it did before its
#: middle steps asked only the nodes their choice needs (``Kind.costly_prompts`` off for the row); ``lazy``: vanilla
#: asking only those also where the kind says a step's prompts are cheap (SGLang; on for the row). ``capcal, every
#: node``: capcal asking every node, as it did before its middle steps asked only the nodes that certify their choice
#: (certified middle steps); ``capcal, lazy``: capcal asking only those also where the kind says a step's prompts
#: are cheap; ``letters``: identifiers [A]..[T] (``labels="alpha"``: one token each, so a step's trie is one node).
METHODS = (("vanilla", "vanilla", {}), ("capcal", "capcal", {}),
           ("vanilla, trie", "vanilla", {"probability": "trie"}), ("capcal, trie", "capcal", {"probability": "trie"}),
           ("capcal, async", "capcal", {}), ("vanilla, every node", "vanilla", {}), ("vanilla, lazy", "vanilla", {}),
           ("capcal, every node", "capcal", {}), ("capcal, lazy", "capcal", {}),
           ("vanilla, letters", "vanilla", {"labels": "alpha"}), ("capcal, letters", "capcal", {"labels": "alpha"}))
#: The rows that read the endpoint's kind as one whose prompts each cost compute of their own (True) or not
COSTLY = {"vanilla, every node": False, "vanilla, lazy": True, "capcal, every node": False, "capcal, lazy": True}
ROWS = tuple(name for name, _, _ in METHODS) + ("deciding",)
ALL = ";".join(name for name, _, _ in METHODS)


def one_list(rr: CapCalReranker, meter: Meter, query: str, passages: list[str], grades: list[int], ideal: list[int],
             deciding: int = 10, rows: tuple[str, ...] = ROWS) -> dict[str, Any]:
    opts = rr.options
    row: dict[str, Any] = {"query": query, "passages": len(passages), "grades": grades, "ideal": ideal}
    # the generating peer; then the server's time per generated token, on its prompt now cached (33 tokens, the end
    # of text ignored, against 1: the model may stop after a few tokens, too few to time one)
    slot = _slot(rr)
    gen = _messages(RANK_GPT, query, salted(passages))
    gen_s, gen_prompt, gen_tokens = _chat(rr, gen, 100, slot)
    per_token = max(0.0, (_chat(rr, gen, 33, slot, True)[0] - _chat(rr, gen, 1, slot)[0]) / 32)
    row.update(generating_s=round(gen_s, 2), generating_tokens=gen_tokens, per_token_s=round(per_token, 4),
               per_token_timed=True)
    # the floor's prefills: the library's real stream and its empty stream, each cold
    real_s, real_tokens, _ = _chat(rr, _messages(opts.template, query, salted(passages)), 1)
    empty_s, empty_tokens, _ = _chat(rr, _messages(opts.template, query, [DEFAULT_PLACEHOLDER] * len(passages)), 1)
    row.update(prefill_real_s=round(real_s, 2), real_tokens=real_tokens, prefill_empty_s=round(empty_s, 2),
               empty_tokens=empty_tokens)
    for name, method, extra in (m for m in METHODS if m[0] in rows):
        before = meter.read()
        started = time.perf_counter()
        ranked = rr.with_options(method=method, **extra)
        with _costly(rr, COSTLY.get(name)):
            # arerank sends a step's real and empty streams together (two slots, one batch); rerank one after another
            ranking = (asyncio.run(ranked.arerank(query, salted(passages))) if name.endswith("async")
                       else ranked.rerank(query, salted(passages)))
        took = time.perf_counter() - started
        u = ranking.usage
        uncached = meter.uncached(before, u.prompt_tokens, u.cached_tokens)
        names = labels(len(passages), extra.get("labels", "numeric"))
        answer = " > ".join(names[i] for i in ranking.order)
        tokens = len(run_sync(tokenize(rr.capabilities(), [answer]), rr.client)[0][0])
        floor = real_s + tokens * per_token if method == "vanilla" else real_s + empty_s + 2 * tokens * per_token
        streams = real_tokens if method == "vanilla" else real_tokens + empty_tokens
        row[name] = {"order": list(ranking.order), "ndcg10": round(ndcg10([grades[i] for i in ranking.order], ideal), 4),
                     "s": round(took, 2), "floor_s": round(floor, 2), "over_floor": round(took / floor, 2),
                     "over_generating": round(took / gen_s, 2), "requests": u.requests,
                     "uncached_over_streams": round(uncached / max(1, streams), 2)}
    if deciding:
        row["deciding"] = one_deciding(rr, meter, query, passages[:deciding], per_token, gen_s)
    return row


@contextlib.contextmanager
def _costly(rr: CapCalReranker, costly: bool | None) -> Iterator[None]:
    """Unless None: the endpoint's kind read as one whose prompts each cost compute of their own (``True``: vanilla's
    middle steps ask only the nodes their choice needs) or not (``False``: every node is asked)."""
    kind = kind_of(rr.capabilities())
    if costly is not None:
        kind.costly_prompts = costly
    try:
        yield
    finally:
        if costly is not None:
            del kind.costly_prompts


def one_deciding(rr: CapCalReranker, meter: Meter, query: str, passages: list[str], per_token: float,
                 gen_s: float) -> dict[str, Any]:
    """One deciding query of the default content rule on ``passages``, and its floor measured on its own streams:
    each sent once (a fresh salt) as a one-token request, one after another, plus each stream's trie nodes but the
    first at the server's per-token time."""
    opts, rule, n = rr.options.replace(alpha=1.0), RULES["query"], len(passages)
    state = rr._state.for_ranking()
    before = meter.read()
    started = time.perf_counter()
    _, u = run_sync(check_readings(state, opts, query, salted(passages), rule), rr.client)
    took = time.perf_counter() - started
    uncached = meter.uncached(before, u.prompt_tokens, u.cached_tokens)
    texts = salted(passages)
    streams = [_messages(opts.template, q, [texts[i] for i in order]) for q in (query, QUERY_PLACEHOLDER)
               for order in rule.orders(n)]
    streams.append(_messages(opts.template, query, [opts.placeholder] * n))
    slot = _slot(rr)
    prefills = [_chat(rr, m, 1, slot) for m in streams]
    stream_tokens = sum(p for _, p, _ in prefills)
    nodes = len(nodes_to_ask(label_trie([state.label_tokens[i] for i in labels(n, opts.labels)]), opts.probability))
    floor = sum(s for s, _, _ in prefills) + len(streams) * max(0, nodes - 1) * per_token
    return {"passages": n, "streams": len(streams), "nodes": nodes, "stream_tokens": stream_tokens,
            "s": round(took, 2), "floor_s": round(floor, 2), "over_floor": round(took / floor, 2),
            "over_generating": round(took / gen_s, 2), "requests": u.requests,
            "uncached_over_streams": round(uncached / max(1, stream_tokens), 2)}


def at_once(rr: CapCalReranker, meter: Meter, lists: list[Any], rows: list[dict[str, Any]], passages: int,
            concurrency: int, names: tuple[str, ...]) -> dict[str, Any]:
    """The lists ranked ``concurrency`` at once (``rerank_many``), beside as many generating requests at once:
    wall time, and uncached prompt tokens over the streams' tokens (each list's, from its row)."""
    def pairs() -> list[tuple[str, list[str]]]:
        return [(b.query, salted(list(b.passages)[:passages])) for b in lists]

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda qp: _chat(rr, _messages(RANK_GPT, *qp), 100), pairs()))
    out: dict[str, Any] = {"concurrency": concurrency, "lists": len(lists),
                           "generating_s": round(time.perf_counter() - started, 2)}
    for name, method, extra in (m for m in METHODS if m[0] in names and not m[0].endswith("async")):
        before = meter.read()
        started = time.perf_counter()
        with _costly(rr, COSTLY.get(name)):
            rankings = rr.with_options(method=method, **extra).rerank_many(pairs(), concurrency=concurrency)
        took = time.perf_counter() - started
        uncached = meter.uncached(before, sum(r.usage.prompt_tokens for r in rankings),
                                  sum(r.usage.cached_tokens for r in rankings))
        streams = sum(r["real_tokens"] + (r["empty_tokens"] if method != "vanilla" else 0) for r in rows)
        out[name] = {"s": round(took, 2), "over_generating": round(took / out["generating_s"], 2),
                     "requests": sum(r.usage.requests for r in rankings),
                     "uncached_over_streams": round(uncached / max(1, streams), 2)}
    return out


def notes(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    """What the table does not show: the per-token time, time / generating by what that request wrote, whether the
    cheap forms rank as the exact ones, and nDCG@10 on the same lists."""
    out = [f"One generating request (RankGPT's prompt, at most 100 tokens): median "
           f"{statistics.median(r['generating_s'] for r in rows):.1f} s; it wrote a median of "
           f"{statistics.median(r['generating_tokens'] for r in rows):.0f} tokens. The server's per-token time "
           f"(on its prompt once cached): median {1000 * statistics.median(r['per_token_s'] for r in rows):.0f} ms."]
    whole = [r for r in rows if r["generating_tokens"] >= 3 * r["passages"]]
    for said, group in (("wrote a whole ranking", whole), ("stopped early", [r for r in rows if r not in whole])):
        if group:
            out.append(f"Time / one generating request on the {len(group)} lists where it {said}, median (at most): "
                       + ", ".join(f"{m} {statistics.median(r[m]['over_generating'] for r in group):.2f} "
                                   f"({max(r[m]['over_generating'] for r in group):.2f})" for m in names
                                   if m != "deciding") + ".")
    if "vanilla" in names and "capcal" in names:
        x = sorted(r["capcal"]["s"] / r["vanilla"]["s"] for r in rows)
        out.append(f"capcal / vanilla per list: median {statistics.median(x):.2f} ({x[0]:.2f}-{x[-1]:.2f}).")
    same = []
    for m, other in [(x, f"{x}, {o}") for x in ("vanilla", "capcal") for o in ("trie", "every node", "lazy")]:
        if m in names and other in names:
            n = sum(r[m]["order"] == r[other]["order"] for r in rows)
            tau = statistics.mean(kendall_tau(r[m]["order"], r[other]["order"]) for r in rows)
            same.append(f"`{other}` ranks as `{m}` on {n} of {len(rows)} lists (mean Kendall tau {tau:.3f}), its time "
                        f"/ {m}'s median {statistics.median(r[other]['s'] / r[m]['s'] for r in rows):.2f}")
    ndcg = ", ".join(f"{m} {statistics.mean(r[m]['ndcg10'] for r in rows):.4f}" for m in names if m != "deciding")
    return out + ([". ".join(same) + "."] if same else []) + [f"Mean nDCG@10 on these lists: {ndcg}."]


def run_of(args: argparse.Namespace, rows: list[dict[str, Any]], info: dict[str, Any], stamp: dict) -> dict:
    names = [m for m in ROWS if all(m in r for r in rows) or (m == "deciding" and "deciding" in rows[0])]
    cols = ("s", "floor_s", "over_floor", "over_generating", "requests", "uncached_over_streams")
    med = {m: [statistics.median(r[m][k] for r in rows if m in r) for k in cols] for m in names}
    tables = [{"columns": ["method", "seconds", "floor s", "time / floor", "time / generating", "requests",
                           "uncached prompt tokens / stream tokens"],
               "rows": [[m if m != "deciding" else "one deciding query", *(round(v, 2) for v in med[m])] for m in names],
               "caption": f"{len(rows)} lists of {args.passages} passages on {info['server']} ({info['slots']} slots), "
                          "each cold, methods interleaved per list; medians:"},
              {"columns": ["list", "generating s", *names], "caption": "Per list, seconds (x floor):",
               "rows": [[k, r["generating_s"], *(f"{r[m]['s']:.1f} ({r[m]['over_floor']:.2f})" if m in r else ""
                                                  for m in names)] for k, r in enumerate(rows)]}]
    if info.get("at_once"):
        c = info["at_once"]
        tables.append({"columns": ["method", "wall s", "time / generating", "requests", "uncached / stream tokens"],
                       "caption": f"{c['lists']} lists ranked {c['concurrency']} at once, beside as many generating "
                                  f"requests {c['concurrency']} at once ({c['generating_s']:.1f} s wall):",
                       "rows": [[m, c[m]["s"], c[m]["over_generating"], c[m]["requests"], c[m]["uncached_over_streams"]]
                                for m in ROWS if m in c]})
    return {"name": args.name or f"{info['server']}-{args.lists}x{args.passages}", "stamp": stamp,
            "title": f"At the floor of {info['server']}, {len(rows)} DL19 lists of {args.passages} passages",
            "notes": notes(rows, names), "tables": tables, "data": {**info, "rows": rows}}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser("cost", __doc__)
    ap.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    ap.add_argument("--lists", type=int, default=3)
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--base-url", default=None, help="a running server; default: start the embedded one")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="0.5b", help="the embedded model (without --base-url)")
    ap.add_argument("--methods", default=ALL, help="the rows to time, separated by ';' (default all: %(default)s)")
    ap.add_argument("--no-deciding", action="store_true", help="skip the deciding query")
    ap.add_argument("--deciding-passages", type=int, default=10, help="the deciding query's window (default 10)")
    ap.add_argument("--deciding-lists", type=int, default=None, help="a deciding query on the first K lists only")
    ap.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm"), help="the embedded server's engine")
    ap.add_argument("--concurrency", type=int, default=0, help="then rank the lists N at once beside N generating "
                    "requests at once (default: not)")
    ap.add_argument("--chat", action="store_true", help="read through chat prefill (one chat request per prompt)")
    ap.add_argument("--slots", action="store_true", help="instead: one trie node's cost, pinned or spread over slots")
    ap.add_argument("--prompts", action="store_true", help="instead: a request's time against the prompts it holds "
                    "and the tokens each computes again (vLLM)")
    args = ap.parse_args(argv)
    stamp = C.stamp("cost", argv)
    if args.smoke:
        args.lists, args.passages, args.methods, args.no_deciding = 2, 4, "vanilla;capcal", True  # deciding: 13 prompts
    data = pathlib.Path(args.data) if args.data else C.need_data("trec-dl19-passage")
    lists = bench_lists(data)[:args.lists]
    methods = tuple(args.methods.split(";"))
    out = C.out_dir("cost", args)
    if args.slots:
        print(f"wrote {C.save('cost', slots(args, lists, stamp), out)}")
        return 0
    if args.prompts:
        print(f"wrote {C.save('cost', prompts(args, lists, stamp), out)}")
        return 0
    with C.server(args.base_url, args.model, args.engine) as ep:
        key = ep.api_key or args.api_key
        rr = CapCalReranker(base_url=ep.base_url, api_key=key, model=ep.model, timeout=3600, guard=None)
        meter = Meter(ep.base_url, key)
        caps = rr.capabilities()
        if args.chat:  # the kind of a server without prompt lists: one chat request per prompt, prefilled
            caps = rr._state.caps = dataclasses.replace(caps, transport="chat", prompt_lists=False, kind=CHAT_PREFILL)
        info: dict[str, Any] = {"server": caps.server or caps.kind.name, "model": caps.model, "slots": caps.slots,
                                "prefix_cache_counters": meter.counters}
        rows = []
        for k, b in enumerate(lists):
            deciding = 0 if args.no_deciding or (args.deciding_lists is not None and k >= args.deciding_lists) \
                else args.deciding_passages
            rows.append(one_list(rr, meter, b.query, list(b.passages)[:args.passages], list(b.grades)[:args.passages],
                                 list(b.ideal), deciding, methods))
            print(f"list {k + 1}/{len(lists)}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
            C.save("cost", run_of(args, rows, info, stamp), out)  # a run cut short keeps what it finished
        if args.concurrency:
            info["at_once"] = at_once(rr, meter, lists, rows, args.passages, args.concurrency, methods)
            C.save("cost", run_of(args, rows, info, stamp), out)
    print(f"wrote {out / 'cost.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
