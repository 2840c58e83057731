"""At the floor of the server: what each method costs against what it cannot avoid (issue 35).

For each list (cold: a fresh salt in every passage, so no prompt is cached from anything before it), on one
server in one run, interleaved:

* **generating**: one chat completion of RankGPT's prompt over the same passages, at most 100 generated tokens
  (what RankGPTRerank and LLMListwiseRerank send);
* **vanilla** and **capcal** (``guard=None``), and **one deciding query** of the content check on the list's first
  ``--deciding-passages`` (its readings of the window, :func:`~capcal_integrations.ranking.decoding.check_readings`);
* **the floor** of each: prefilling each distinct stream once (a request that generates one token, timed on a
  cold copy of the stream) plus the evaluations the method cannot avoid (the decoded ranking's tokens, at the
  server's per-token time t_token: 33 tokens against 1 generated on the generating request's prompt, once
  cached): vanilla = prefill(real) + tokens x t_token; capcal = prefill(real) + prefill(empty) + 2 x tokens x
  t_token. A deciding query's floor is measured on its own streams: each of them
  (the rule's orders of the window with the query and with the query replaced, and the empty prompt; a fresh
  salt) sent once as a one-token request, one after another (on llama.cpp in one slot), plus each stream's
  identifier-trie nodes but the first (the one-token request already read that one) at t_token.

Reported per list and as medians: time / floor, time / generating, and uncached prompt tokens / the tokens of
the distinct streams (what the server computed against what it had to). Uncached tokens are the answers'
``usage`` (prompt minus cached tokens) on llama.cpp, and the server's own prefix-cache counters where it has
them (vLLM's ``/metrics``: queried minus hit tokens). With ``--concurrency N``, the lists are then ranked again
``N`` at once (``rerank_many``, fresh salts) beside ``N`` generating requests at once: wall time and uncached /
stream tokens. Results: ``benchmarks/results/floor.md`` and ``floor.json``.

    python benchmarks/floor.py --data ../shared/data/trec-dl19-passage [--lists 3] [--passages 20] [--base-url URL]
        [--engine vllm] [--concurrency 8] [--deciding-passages 10]

Without ``--base-url`` it starts the embedded server (``--model``, default the packaged 0.5B; ``--engine vllm``:
vLLM's CPU build, ``CAPCAL_VLLM_PYTHON``) for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import pathlib
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import DEFAULT_PLACEHOLDER, RANK_GPT, CapCalReranker  # noqa: E402
from capcal_integrations.content_check.rules import RULES  # noqa: E402
from capcal_integrations.endpoints import CHAT_PREFILL, kind_of, tokenize  # noqa: E402
from capcal_integrations.prompts.render import QUERY_PLACEHOLDER, labels, render_prompt, resolve_template  # noqa: E402
from capcal_integrations.ranking.decoding import check_readings  # noqa: E402
from capcal_integrations.ranking.orders import kendall_tau  # noqa: E402
from capcal_integrations.reading.labels import label_trie, nodes_to_ask  # noqa: E402
from capcal_integrations.testbed.measure import bench_lists, ndcg10  # noqa: E402
from capcal_integrations.transport.drivers import run_sync  # noqa: E402


def _chat(rr: CapCalReranker, messages: Any, max_tokens: int, slot: int | None = None, ignore_eos: bool = False
          ) -> tuple[float, int, int]:
    """One chat completion (on llama.cpp's ``slot`` if given; ``ignore_eos``: exactly ``max_tokens`` generated):
    seconds, prompt tokens, completion tokens."""
    extra = {**({} if slot is None else {"id_slot": slot}), **({"ignore_eos": True} if ignore_eos else {})}
    started = time.perf_counter()
    answer = rr.client.chat.completions.create(model=rr.capabilities().model, temperature=0, max_tokens=max_tokens,
                                               messages=[{"role": r, "content": c} for r, c in messages],
                                               extra_body=extra)
    usage = answer.usage
    return time.perf_counter() - started, usage.prompt_tokens, usage.completion_tokens


def _slot(rr: CapCalReranker) -> int | None:
    """The llama.cpp slot the timing requests go to (one slot, so that each finds its own prefix), or None."""
    return 0 if rr.capabilities().slots > 1 else None


def _salted(passages: list[str]) -> list[str]:
    """The passages with one fresh salt: no prompt of them is cached from anything before."""
    salt = f" ({random.randrange(10 ** 12)})"
    return [p + salt for p in passages]


class Meter:
    """The prompt tokens a server computed (not taken from its cache): its own prefix-cache counters where it
    exposes them (vLLM's ``/metrics``: queried minus hit tokens, which its answers' ``usage`` leaves out unless
    the server was started with ``--enable-prompt-tokens-details``), else the answers' ``usage``."""

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
        if before is None:
            return prompt_tokens - cached_tokens
        time.sleep(1)  # the server counts a request's tokens as its engine step is logged, just after answering
        after = self.read()
        if after is None:
            return prompt_tokens - cached_tokens
        return (after[0] - before[0]) - (after[1] - before[1])


def _messages(template: Any, query: str, texts: list[str]) -> Any:
    return render_prompt(resolve_template(template), query, texts, labels(len(texts))).text()


#: The methods timed per list: (row name, method, options). The trie form asks only the branching nodes of the
#: identifier trie at each step (about 3 of 21 on a 20-passage list), renormalising at each node. ``async``: the
#: same ranking through ``arerank``. ``every node``: vanilla asking every node of every step, as it did before its
#: middle steps asked only the nodes their choice needs (``Kind.costly_prompts`` off for the row); ``lazy``: vanilla
#: asking only those also where the kind says a step's prompts are cheap (SGLang; on for the row). ``capcal, every
#: node``: capcal asking every node, as it did before its middle steps asked only the nodes that certify their choice
#: (issue 49); ``capcal, lazy``: capcal asking only those also where the kind says a step's prompts are cheap;
#: ``letters``: identifiers [A]..[T] (``labels="alpha"``: one token each, so a step's trie is a single node).
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
    gen = _messages(RANK_GPT, query, _salted(passages))
    gen_s, gen_prompt, gen_tokens = _chat(rr, gen, 100, slot)
    per_token = max(0.0, (_chat(rr, gen, 33, slot, True)[0] - _chat(rr, gen, 1, slot)[0]) / 32)
    row.update(generating_s=round(gen_s, 2), generating_tokens=gen_tokens, per_token_s=round(per_token, 4),
               per_token_timed=True)
    # the floor's prefills: the library's real stream and its empty stream, each cold
    real_s, real_tokens, _ = _chat(rr, _messages(opts.template, query, _salted(passages)), 1)
    empty_s, empty_tokens, _ = _chat(rr, _messages(opts.template, query, [DEFAULT_PLACEHOLDER] * len(passages)), 1)
    row.update(prefill_real_s=round(real_s, 2), real_tokens=real_tokens, prefill_empty_s=round(empty_s, 2),
               empty_tokens=empty_tokens)
    for name, method, extra in (m for m in METHODS if m[0] in rows):
        before = meter.read()
        started = time.perf_counter()
        ranked = rr.with_options(method=method, **extra)
        with _costly(rr, COSTLY.get(name)):
            # arerank sends a step's real and empty streams together (two slots, one batch); rerank one after another
            ranking = (asyncio.run(ranked.arerank(query, _salted(passages))) if name.endswith("async")
                       else ranked.rerank(query, _salted(passages)))
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
    _, u = run_sync(check_readings(state, opts, query, _salted(passages), rule), rr.client)
    took = time.perf_counter() - started
    uncached = meter.uncached(before, u.prompt_tokens, u.cached_tokens)
    texts = _salted(passages)
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
        return [(b.query, _salted(list(b.passages)[:passages])) for b in lists]

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


def _same_orders(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The two probability forms' orders side by side, and nDCG@10 (the lists' qrels) per method."""
    lines = ["Quality, the same lists: mean nDCG@10 " + ", ".join(
        f"{m} {statistics.mean(r[m]['ndcg10'] for r in rows):.4f}" for m in names if m != "deciding"
        and all("ndcg10" in r[m] for r in rows)) + "."]
    for form in ("", ", trie"):
        v, c = f"vanilla{form}", f"capcal{form}"
        if v in names and c in names:
            lines.append(f"capcal / vanilla{form or ', joint'}: median per list "
                         f"{statistics.median(r[c]['s'] / r[v]['s'] for r in rows):.2f}.")
    for other in (x for x in COSTLY if x in names and x.split(",")[0] in names):
        m = other.split(",")[0]
        same = sum(r[m]["order"] == r[other]["order"] for r in rows)
        lines.append(f"{m}: the order is the one of `{other}` on {same} of {len(rows)} lists; time of `{other}` / "
                     f"{m}'s: median per list {statistics.median(r[other]['s'] / r[m]['s'] for r in rows):.2f}.")
    if "capcal" in names and "vanilla" in names:
        lines.append("capcal / vanilla, per list: " + ", ".join(f"{r['capcal']['s'] / r['vanilla']['s']:.2f}" for r in rows)
                     + "; capcal / one generating request: " + ", ".join(
                         f"{r['capcal']['s'] / r['generating_s']:.2f}" for r in rows) + ".")
    for m in ("vanilla", "capcal"):
        t = f"{m}, trie"
        if m in names and t in names and all("order" in r[m] and "order" in r[t] for r in rows):
            same = sum(r[m]["order"] == r[t]["order"] for r in rows)
            tau = statistics.mean(kendall_tau(r[m]["order"], r[t]["order"]) for r in rows)
            lines.append(f"{m}: the trie form's order is the joint form's on {same} of {len(rows)} lists (mean "
                         f"Kendall tau {tau:.3f}).")
    return [" ".join(lines)]


def _per_token_note(rows: list[dict[str, Any]]) -> str:
    if "per_token_timed" in rows[0]:
        return ("The per-token time is the server's, timed per list on the generating request's prompt once cached "
                f"(median {1000 * statistics.median(r['per_token_s'] for r in rows):.0f} ms), and the generating "
                f"request wrote a median of {statistics.median(r['generating_tokens'] for r in rows):.0f} tokens.")
    return ("Read with care: the per-token time comes from each list's own generating request, and is 0 where the "
            "model stopped after a few tokens (then that list's vanilla and capcal floors are its prefills alone, a "
            "little low).")


def _by_answer(rows: list[dict[str, Any]], names: list[str]) -> str:
    """Time / generating apart by what the generating request wrote: a whole ranking (at least 3 tokens a passage),
    or a passage or two before it stopped (then it cost about one prefill, and any decoded ranking more)."""
    whole = [r for r in rows if r["generating_tokens"] >= 3 * r["passages"]]
    groups = (("wrote a whole ranking", whole), ("stopped early", [r for r in rows if r not in whole]))
    parts = []
    for said, group in ((said, group) for said, group in groups if group):
        ratios = [(m, [r[m]["over_generating"] for r in group]) for m in names if m != "deciding"]
        parts.append(f"on the {len(group)} lists where it {said} (a median of "
                     f"{statistics.median(r['generating_tokens'] for r in group):.0f} tokens), " + ", ".join(
                         f"{m} {statistics.median(x):.2f} (at most {max(x):.2f})" for m, x in ratios))
    return "Time / one generating request, median per list, apart by what that request wrote: " + "; ".join(parts) + "."


def _deciding_note(rows: list[dict[str, Any]], names: list[str]) -> str:
    if "deciding" not in names:
        return ""
    d = rows[0]["deciding"]
    if "streams" not in d:  # a run before its floor was measured on its own streams
        return (" The deciding query's floor counts 12 whole streams, but its orders share their prefix (the system "
                "prompt, the head, the query), so its true floor is lower: time / floor under 1 and uncached tokens / "
                "stream tokens of 0.65 say that the server computed about two thirds of what 12 whole streams would "
                "hold; measuring its exact floor needs the 12 prompts themselves.")
    return (f" The deciding query reads the first {d['passages']} passages of the list: {d['streams']} streams, "
            f"{d['nodes']} trie nodes each; its floor is its own streams each prefilled once, one after another, plus "
            "their other nodes at the per-token time, and its stream tokens are those streams' prompt tokens (module "
            "docstring).")


def _write(out: pathlib.Path, args: argparse.Namespace, rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), **info, "rows": rows}, indent=1) + "\n")
    names = [m for m in ROWS if all(m in r for r in rows) or (m == "deciding" and "deciding" in rows[0])]
    med = {m: {k: statistics.median(r[m][k] for r in rows if m in r) for k in rows[0][m] if k not in ("order", "ndcg10")}
           for m in names}
    lines = ["# At the floor of the server (issue 35)", "",
             f"`python benchmarks/floor.py --data {args.data} --lists {args.lists} --passages {args.passages}"
             f"{' --no-deciding' if getattr(args, 'no_deciding', False) else ''}"
             f"{f' --deciding-passages {args.deciding_passages}' if getattr(args, 'deciding_passages', 10) != 10 else ''}"
             f"{f' --deciding-lists {args.deciding_lists}' if getattr(args, 'deciding_lists', None) else ''}"
             f"{f' --engine {args.engine}' if getattr(args, 'engine', 'llamacpp') != 'llamacpp' else ''}"
             f"{f' --concurrency {args.concurrency}' if getattr(args, 'concurrency', 0) else ''}"
             f"{' --chat' if getattr(args, 'chat', False) else ''}"
             f"{'' if getattr(args, 'methods', None) in (None, ALL) else f' --methods {args.methods!r}'}"
             "` on "
             f"{info['server']} ({info['model']}, {info['slots']} slots), commit {info['commit']}, {len(rows)} lists, "
             "each cold (a fresh salt in every passage), methods interleaved per list. Floor: each distinct stream "
             "prefilled once plus the decoded answer's tokens at the "
             f"{'server' if 'per_token_timed' in rows[0] else 'generating request'}'s per-token time (module "
             "docstring). Medians:", "",
             "| method | seconds | floor s | time / floor | time / generating | requests | uncached prompt tokens / "
             "stream tokens |", "|---|---:|---:|---:|---:|---:|---:|"]
    for m in names:
        d = med[m]
        lines.append(f"| {m if m != 'deciding' else 'one deciding query'} | {d['s']:.1f} | {d['floor_s']:.1f} | "
                     f"{d['over_floor']:.2f} | {d['over_generating']:.2f} | {d['requests']:.0f} | "
                     f"{d['uncached_over_streams']:.2f} |")
    g = statistics.median(r["generating_s"] for r in rows)
    lines += ["", f"One generating request (RankGPT's prompt, at most 100 tokens): median {g:.1f} s.", "",
              _per_token_note(rows) + _deciding_note(rows, names), "", _by_answer(rows, names), "",
              *_same_orders(rows, names), "",
              "Per list, seconds (x floor):", "", "| list | generating s | " + " | ".join(names) + " |",
              "|---|---:|" + "---:|" * len(names)]
    for k, r in enumerate(rows):
        lines.append(f"| {k} | {r['generating_s']:.1f} | "
                     + " | ".join(f"{r[m]['s']:.1f} ({r[m]['over_floor']:.2f})" if m in r else "" for m in names) + " |")
    if info.get("at_once"):
        c = info["at_once"]
        lines += ["", f"{c['lists']} lists ranked {c['concurrency']} at once (`rerank_many`, fresh salts), beside "
                  f"{c['lists']} generating requests {c['concurrency']} at once ({c['generating_s']:.1f} s wall):", "",
                  "| method | wall s | time / generating | requests | uncached prompt tokens / stream tokens |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {m} | {c[m]['s']:.1f} | {c[m]['over_generating']:.2f} | {c[m]['requests']} | "
                  f"{c[m]['uncached_over_streams']:.2f} |" for m in ROWS if m in c]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a dataset folder, e.g. ../shared/data/trec-dl19-passage")
    ap.add_argument("--lists", type=int, default=3)
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--base-url", default=None, help="a running server; default: start the embedded one")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="0.5b", help="the embedded model (without --base-url)")
    ap.add_argument("--out", default=str(HERE / "results" / "floor"))
    ap.add_argument("--methods", default=ALL,
                    help="the rows to time, separated by ';' (default all: %(default)s)")
    ap.add_argument("--no-deciding", action="store_true", help="skip the deciding query")
    ap.add_argument("--deciding-passages", type=int, default=10, help="the deciding query's window (default 10)")
    ap.add_argument("--deciding-lists", type=int, default=None, help="a deciding query on the first K lists only")
    ap.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm"),
                    help="the embedded server's engine (without --base-url)")
    ap.add_argument("--concurrency", type=int, default=0,
                    help="then rank the lists N at once beside N generating requests at once (default: not)")
    ap.add_argument("--chat", action="store_true",
                    help="read through chat prefill (one chat request per prompt), as on a server without prompt lists")
    ap.add_argument("--report", action="store_true", help="rewrite the .md from the saved .json, nothing run")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(pathlib.Path(args.out).with_suffix(".json").read_text())
        rows = saved.pop("rows")
        _write(pathlib.Path(args.out), argparse.Namespace(**saved.pop("args")), rows, saved)
        print(pathlib.Path(args.out).with_suffix(".md").read_text())
        return 0
    from capcal_integrations.server.launcher import endpoint

    lists = bench_lists(args.data)[:args.lists]
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    methods = tuple(args.methods.split(";"))
    with endpoint(args.base_url, args.model, engine=args.engine) as ep:
        key = ep.api_key or args.api_key
        rr = CapCalReranker(base_url=ep.base_url, api_key=key, model=ep.model, timeout=3600, guard=None)
        meter = Meter(ep.base_url, key)
        caps = rr.capabilities()
        if args.chat:  # the kind of a server without prompt lists: one chat request per prompt, prefilled
            caps = rr._state.caps = dataclasses.replace(caps, transport="chat", prompt_lists=False, kind=CHAT_PREFILL)
        info: dict[str, Any] = {"server": caps.server or caps.kind.name, "model": caps.model, "slots": caps.slots,
                                "commit": commit, "prefix_cache_counters": meter.counters}
        def deciding(k: int) -> int:
            skip = args.no_deciding or (args.deciding_lists is not None and k >= args.deciding_lists)
            return 0 if skip else args.deciding_passages

        rows = []
        for k, b in enumerate(lists):
            rows.append(one_list(rr, meter, b.query, list(b.passages)[:args.passages], list(b.grades)[:args.passages],
                                 list(b.ideal), deciding(k), methods))
            print(f"list {k + 1}/{len(lists)}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
            _write(pathlib.Path(args.out), args, rows, info)
        if args.concurrency:
            info["at_once"] = at_once(rr, meter, lists, rows, args.passages, args.concurrency, methods)
            print(f"at once: {json.dumps(info['at_once'])}", file=sys.stderr, flush=True)
            _write(pathlib.Path(args.out), args, rows, info)
    print(pathlib.Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
